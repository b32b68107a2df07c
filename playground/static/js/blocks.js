/*
 * Block Kit blocks and elements as the page draws them: sections, context, rich text, headers,
 * actions with their buttons (a click is sent to the server as the bot's block_actions), and a
 * modal's input fields (inputs.js). Anything else is drawn as a placeholder naming it.
 */

import { post } from './api.js';
import { askConfirm } from './dialogs.js';
import { button, el } from './dom.js';
import { renderInput } from './inputs.js';
import { EMOJI, isSafeUrl, makeLink, plainText, renderMrkdwn, renderText, renderToken } from './mrkdwn.js';
import { app } from './state.js';

function placeholder(kind) {
  return el('div', 'bk-placeholder', `[${kind}]`);
}

/**
 * A button element. `ctx` says where it lives: {message_ts, ephemeral} or {view_id}.
 * A url button is a link (opens a tab) that still sends the action.
 */
function renderButton(element, blockId, ctx) {
  const text = plainText(element.text);
  const style = element.style === 'primary' || element.style === 'danger' ? ` ${element.style}` : '';
  let node;
  if (element.url && isSafeUrl(element.url)) {
    node = makeLink(element.url, text);
    node.className = `bk-button${style}`;
  } else {
    node = button(text, `bk-button${style}`);
  }
  node.dataset.actionId = element.action_id || '';
  if (blockId) node.dataset.blockId = blockId;
  node.addEventListener('click', async (e) => {
    // A link opens its tab itself, unless a confirmation must come first.
    if (node.tagName === 'BUTTON' || element.confirm || node.dataset.pending) e.preventDefault();
    if (node.disabled || node.dataset.pending) return;
    if (element.confirm && !(await askConfirm(element.confirm))) return;
    if (node.tagName === 'A' && element.confirm) window.open(node.href, '_blank', 'noopener');
    sendAction(node, element, blockId, ctx);
  });
  return node;
}

async function sendAction(node, element, blockId, ctx) {
  setPending(node, true);
  const body = { user: app.user, action_id: element.action_id };
  if (blockId) body.block_id = blockId;
  if (element.value !== undefined) body.value = element.value;
  if (ctx.view_id) body.view_id = ctx.view_id;
  else Object.assign(body, { message_ts: ctx.message_ts, ephemeral: !!ctx.ephemeral });
  const reply = await post('/play/action', body);
  if (!reply || !reply.ok) setPending(node, false); // failed: clickable again at once
}

/** Disabled until the next state render (or a failed post): no double clicks. */
export function setPending(node, on) {
  if (on) node.dataset.pending = '1';
  else delete node.dataset.pending;
  if (node.tagName === 'BUTTON') node.disabled = on;
  else node.setAttribute('aria-disabled', on ? 'true' : 'false');
}

/** Feedback buttons (in a context_actions block): each half is a button sending its own value. */
function renderFeedback(element, blockId, ctx) {
  const box = el('span', 'bk-feedback');
  for (const [half, label] of [['positive_button', 'good'], ['negative_button', 'bad']]) {
    const choice = element[half] || {};
    const node = renderButton(
      { type: 'button', action_id: element.action_id, text: choice.text, value: choice.value },
      blockId,
      ctx,
    );
    node.classList.add('bk-feedback-button');
    node.dataset.feedback = label;
    if (choice.accessibility_label) node.setAttribute('aria-label', choice.accessibility_label);
    box.append(node);
  }
  return box;
}

function renderElement(element, blockId, ctx) {
  if (element.type === 'button') return renderButton(element, blockId, ctx);
  if (element.type === 'feedback_buttons') return renderFeedback(element, blockId, ctx);
  const ph = button(element.type || 'element', 'bk-button bk-unsupported');
  ph.disabled = true;
  ph.title = `${element.type} elements are not supported in the playground`;
  return ph;
}

function renderSection(block, ctx) {
  const node = el('div', 'bk-section');
  const main = el('div', 'bk-section-main');
  if (block.text) main.append(renderText(block.text));
  if (Array.isArray(block.fields) && block.fields.length) {
    const grid = el('div', 'bk-fields');
    block.fields.forEach((f) => grid.append(renderText(f, 'bk-field')));
    main.append(grid);
  }
  node.append(main);
  if (block.accessory) {
    const acc = el('div', 'bk-accessory');
    acc.append(block.accessory.type === 'image'
      ? el('div', 'bk-image-alt small', block.accessory.alt_text || 'image')
      : renderElement(block.accessory, block.block_id, ctx));
    node.append(acc);
  }
  return node;
}

function renderContext(block) {
  const node = el('div', 'bk-context');
  for (const item of block.elements || []) {
    if (item.type === 'image') {
      if (item.image_url && /^https?:\/\//i.test(item.image_url)) {
        const img = el('img', 'bk-context-img');
        img.alt = item.alt_text || '';
        img.referrerPolicy = 'no-referrer';
        img.src = item.image_url;
        node.append(img);
      } else node.append(el('span', 'bk-context-alt', item.alt_text || 'image'));
    } else node.append(renderText(item, 'bk-context-text'));
  }
  return node;
}

/** rich_text, best effort: sections, lists, quotes, preformatted, styled text and mentions. */
function renderRichText(block) {
  const root = el('div', 'mrkdwn rich');
  const inline = (items, parent) => {
    for (const it of items || []) {
      let node;
      if (it.type === 'text') node = document.createTextNode(it.text || '');
      else if (it.type === 'link') node = isSafeUrl(it.url || '') ? makeLink(it.url, it.text || it.url) : document.createTextNode(it.text || it.url || '');
      else if (it.type === 'user') node = renderToken('@' + it.user_id);
      else if (it.type === 'channel') node = renderToken('#' + it.channel_id);
      else if (it.type === 'emoji') node = document.createTextNode(EMOJI[it.name] || it.unicode && String.fromCodePoint(...it.unicode.split('-').map((h) => parseInt(h, 16))) || `:${it.name}:`);
      else if (it.type === 'broadcast') node = el('span', 'mention special', '@' + it.range);
      else if (it.type === 'usergroup') node = el('span', 'mention group', '@group');
      else node = document.createTextNode(it.text || it.fallback || '');
      const style = it.style || {};
      for (const [flag, tag] of [['code', 'code'], ['strike', 's'], ['italic', 'i'], ['bold', 'b']]) {
        if (style[flag]) { const w = el(tag, flag === 'code' ? 'code' : null); w.append(node); node = w; }
      }
      parent.append(node);
    }
  };
  const part = (elem) => {
    if (elem.type === 'rich_text_list') {
      const list = el(elem.style === 'ordered' ? 'ol' : 'ul');
      (elem.elements || []).forEach((s) => { const li = el('li'); inline(s.elements, li); list.append(li); });
      return list;
    }
    const tag = { rich_text_preformatted: 'pre', rich_text_quote: 'blockquote' }[elem.type] || 'div';
    const box = el(tag, tag === 'pre' ? 'pre' : tag === 'blockquote' ? 'quote' : null);
    inline(elem.elements, box);
    return box;
  };
  (block.elements || []).forEach((elem) => root.append(part(elem)));
  return root;
}

function renderBlock(block, ctx, index) {
  let node;
  switch (block.type) {
    case 'section': node = renderSection(block, ctx); break;
    case 'context': node = renderContext(block); break;
    case 'divider': node = el('hr', 'bk-divider'); break;
    case 'header': node = el('div', 'bk-header', plainText(block.text)); break;
    case 'image':
      node = el('div', 'bk-image-alt');
      if (block.title) node.append(el('div', 'bk-image-title', plainText(block.title)));
      node.append(el('div', null, `🖼 ${block.alt_text || 'image'}`));
      break;
    case 'rich_text': node = renderRichText(block); break;
    case 'markdown': node = renderMrkdwn(block.text); break;
    case 'actions':
    case 'context_actions':
      node = el('div', block.type === 'actions' ? 'bk-actions' : 'bk-actions bk-context-actions');
      (block.elements || []).forEach((e) => node.append(renderElement(e, block.block_id, ctx)));
      break;
    case 'input': node = ctx.modal ? renderInput(block, index, ctx) : placeholder('input'); break;
    default: node = placeholder(block.type || 'unknown block');
  }
  node.classList.add('bk-block');
  if (block.block_id) node.dataset.blockId = block.block_id;
  return node;
}

export function renderBlocks(blocks, ctx) {
  const box = el('div', 'blocks');
  blocks.forEach((b, i) => box.append(renderBlock(b, ctx, i)));
  return box;
}
