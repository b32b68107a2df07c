/*
 * The bot's modals: the selected user's top view drawn over the page, what was typed in it kept
 * across renders, its submit (with the bot's field errors) and its close.
 */

import { post, showError } from './api.js';
import { renderBlocks } from './blocks.js';
import { dialogFrame } from './dialogs.js';
import { $, button } from './dom.js';
import { readInput } from './inputs.js';
import { plainText } from './mrkdwn.js';
import { app } from './state.js';

/** The selected user's top modal and the key that changes when the bot replaces its content. */
export function topView() {
  const mine = (app.state.views || []).filter((v) => v.user === app.user && !app.dismissed.has(viewKey(v)));
  return mine.length ? { entry: mine[mine.length - 1], key: viewKey(mine[mine.length - 1]) } : null;
}

const viewKey = (v) => `${v.id}\u0000${v.view.hash || JSON.stringify(v.view.blocks)}`;

/** Draw the selected user's top modal, or hide the layer; unchanged, it keeps focus and caret. */
export function renderModal() {
  const layer = $('modal-layer');
  const keys = new Set((app.state.views || []).map(viewKey));
  for (const k of app.dismissed) if (!keys.has(k)) app.dismissed.delete(k); // gone from the state
  const top = topView();
  if (!top) {
    app.sigs.modal = null;
    app.modal = { key: null, values: {}, errors: {} };
    layer.hidden = true;
    layer.replaceChildren();
    return;
  }
  if (top.key !== app.modal.key) app.modal = { key: top.key, values: {}, errors: {} }; // a new view
  const errors = Object.assign({}, top.entry.errors || {}, app.modal.errors);
  const sig = JSON.stringify([top.key, errors, app.user]);
  if (sig === app.sigs.modal) return; // unchanged: keep focus and caret
  const fresh = !app.sigs.modal || JSON.parse(app.sigs.modal)[0] !== top.key;
  app.sigs.modal = sig;
  layer.replaceChildren(buildModal(top.entry, errors));
  layer.hidden = false;
  const first = layer.querySelector(fresh ? 'input, textarea, select' : '.has-error input, .has-error textarea, .has-error select');
  if (first) first.focus();
  else if (fresh) $('modal').focus();
}

function buildModal(entry, errors) {
  const view = entry.view;
  const close = () => closeModal(entry.id);
  const buttons = [button(plainText(view.close) || 'Cancel', 'modal-button', close, 'modal-close')];
  if (view.submit) {
    const submit = button(plainText(view.submit), 'modal-button primary', () => submitModal(entry, submit), 'modal-submit');
    buttons.push(submit);
  }
  const body = renderBlocks(view.blocks || [], { view_id: entry.id, modal: true, errors });
  const dialog = dialogFrame('modal', plainText(view.title) || 'Dialog', body, buttons, close);
  dialog.dataset.viewId = entry.id;
  if (view.callback_id) dialog.dataset.callbackId = view.callback_id;
  return dialog;
}

async function submitModal(entry, button) {
  const values = {};
  for (const node of $('modal').querySelectorAll('.bk-input')) {
    const value = readInput(node);
    if (value !== undefined) values[node.dataset.blockId] = { [node.dataset.actionId]: value };
  }
  const key = app.modal.key;
  button.disabled = true;
  const reply = await post('/play/submit', { user: app.user, view_id: entry.id, values }, true);
  button.disabled = false;
  if (!reply || app.modal.key !== key) return;
  if (reply.ok) {
    app.dismissed.add(key); // gone now, whether or not the next state has arrived yet
  } else if (reply.errors) {
    app.modal.errors = reply.errors;
    app.sigs.modal = null;
  } else {
    showError(reply.error || 'The modal was not submitted.');
  }
  renderModal();
}

/** Close a modal at once; the server is told, and shows it again if it kept it. */
export async function closeModal(viewId) {
  const top = topView();
  if (top) app.dismissed.add(top.key);
  renderModal();
  const reply = await post('/play/close', { user: app.user, view_id: viewId });
  if ((!reply || !reply.ok) && top) {
    app.dismissed.delete(top.key); // the server kept it: show it again
    app.sigs.modal = null;
    renderModal();
  }
}
