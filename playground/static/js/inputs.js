/*
 * A modal's input blocks: label, field, hint and the bot's error under it. The fields are the
 * Block Kit elements a bot's modals use: plain_text_input (one line or several), email_text_input,
 * url_text_input, number_input, datepicker, static_select, multi_static_select, radio_buttons and
 * checkboxes. What a person typed or chose is kept across renders (app.modal.values) and read by
 * readInput as the server wants it: a string, a list of option values, or null for nothing.
 * The server turns that into Slack's view_submission state (playground/view_inputs.py). Slack's
 * own client checks required fields, lengths, number bounds and email formats before it sends; the
 * page checks nothing, so the bot's own checks (which say the same) answer, under the field they name.
 */

import { el } from './dom.js';
import { plainText } from './mrkdwn.js';
import { app } from './state.js';

const TEXT_TYPES = { plain_text_input: 'text', email_text_input: 'email', url_text_input: 'url', number_input: 'number' };
const MANY = new Set(['multi_static_select', 'checkboxes']);

/** One input block of a modal: label, field (keeps what was typed), hint and error. */
export function renderInput(block, index, ctx) {
  const blockId = block.block_id || `input_${index}`;
  const element = block.element || {};
  const node = el('div', 'bk-input');
  node.dataset.blockId = blockId;
  node.dataset.elementType = element.type || '';
  node.dataset.actionId = element.action_id || 'value';
  const label = el('label', 'bk-input-label', plainText(block.label));
  if (block.optional) label.append(el('span', 'optional', ' (optional)'));
  node.append(label);
  const saved = app.modal.values[blockId];
  const field = renderField(element, blockId, saved === undefined ? initial(element) : saved);
  if (!field) {
    node.append(el('div', 'bk-placeholder', `[${element.type || 'input'}]`));
    return node;
  }
  if (field.id) label.htmlFor = field.id;
  const remember = () => { app.modal.values[blockId] = readInput(node); };
  field.addEventListener('input', remember);
  field.addEventListener('change', remember);
  node.append(field);
  if (block.hint) node.append(el('div', 'bk-hint', plainText(block.hint)));
  const error = (ctx.errors || {})[blockId];
  if (error) {
    node.classList.add('has-error');
    node.append(el('div', 'bk-error', error));
  }
  return node;
}

/** What an element starts with, as readInput would read it. */
function initial(element) {
  if (element.type === 'datepicker') return element.initial_date || null;
  if (element.type === 'static_select' || element.type === 'radio_buttons') {
    return element.initial_option ? element.initial_option.value : null;
  }
  if (MANY.has(element.type)) return (element.initial_options || []).map((o) => o.value);
  return element.initial_value || '';
}

function renderField(element, blockId, value) {
  const id = `input-${blockId}`;
  const type = element.type;
  if (type in TEXT_TYPES || type === 'datepicker') {
    const multiline = type === 'plain_text_input' && element.multiline;
    const field = el(multiline ? 'textarea' : 'input', 'bk-field-input');
    if (multiline) field.rows = 4;
    else field.type = type === 'datepicker' ? 'date' : TEXT_TYPES[type];
    if (type === 'number_input') {
      field.step = element.is_decimal_allowed ? 'any' : '1';
      if (element.min_value !== undefined) field.min = element.min_value;
      if (element.max_value !== undefined) field.max = element.max_value;
    }
    if (element.placeholder) field.placeholder = plainText(element.placeholder);
    if (element.max_length) field.maxLength = element.max_length;
    field.value = value || '';
    return Object.assign(field, { id });
  }
  const options = Array.isArray(element.options) ? element.options : [];
  if (type === 'static_select' || type === 'multi_static_select') {
    const select = el('select', 'bk-field-input');
    select.multiple = type === 'multi_static_select';
    if (!select.multiple) {
      const none = el('option', null, element.placeholder ? plainText(element.placeholder) : 'Select an option');
      none.value = '';
      select.append(none);
    }
    const chosen = new Set(select.multiple ? value || [] : [value]);
    for (const option of options) {
      const node = el('option', null, plainText(option.text));
      node.value = option.value;
      node.selected = chosen.has(option.value);
      select.append(node);
    }
    return Object.assign(select, { id });
  }
  if (type === 'radio_buttons' || type === 'checkboxes') {
    const group = el('div', 'bk-choices');
    group.setAttribute('role', type === 'radio_buttons' ? 'radiogroup' : 'group');
    const chosen = new Set(type === 'checkboxes' ? value || [] : [value]);
    options.forEach((option, i) => {
      const line = el('label', 'bk-choice');
      const input = el('input');
      input.type = type === 'radio_buttons' ? 'radio' : 'checkbox';
      input.name = `input-${blockId}`;
      input.value = option.value;
      input.id = `input-${blockId}-${i}`;
      input.checked = chosen.has(option.value);
      line.append(input, document.createTextNode(` ${plainText(option.text)}`));
      group.append(line);
    });
    return group;
  }
  return null;
}

/** What an input block holds now: a string, a list of option values, or null for nothing. */
export function readInput(node) {
  const type = node.dataset.elementType;
  if (type === 'radio_buttons') {
    const checked = node.querySelector('input:checked');
    return checked ? checked.value : null;
  }
  if (type === 'checkboxes') return [...node.querySelectorAll('input:checked')].map((i) => i.value);
  const field = node.querySelector('.bk-field-input');
  if (!field) return undefined; // an element the page cannot draw: its initial value stands
  if (type === 'multi_static_select') return [...field.selectedOptions].map((o) => o.value);
  if (type === 'static_select' || type === 'datepicker') return field.value || null;
  return field.value;
}
