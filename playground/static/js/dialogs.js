/*
 * The dialog frame the bot's modals and Block Kit confirmations share, and the confirmation itself.
 */

import { $, button, el } from './dom.js';
import { plainText, renderText } from './mrkdwn.js';
import { app } from './state.js';

/** The frame modals and confirmations share: a title (and × when `onX`), a body, buttons. */
export function dialogFrame(id, title, body, buttons, onX) {
  const box = el('div', 'modal');
  box.id = id;
  box.tabIndex = -1;
  box.setAttribute('role', id === 'confirm' ? 'alertdialog' : 'dialog');
  box.setAttribute('aria-modal', 'true');
  box.setAttribute('aria-labelledby', `${id}-title`);
  const head = el('div', 'modal-head');
  const h = el('h2', 'modal-title', title);
  h.id = `${id}-title`;
  head.append(h);
  if (onX) {
    const x = button('×', 'modal-x', onX);
    x.setAttribute('aria-label', 'Close');
    head.append(x);
  }
  const main = el('div', 'modal-body');
  main.append(body);
  const foot = el('div', 'modal-foot');
  foot.append(...buttons);
  box.append(head, main, foot);
  return box;
}

/** A Block Kit confirmation object as an in-page dialog; resolves true on confirm. */
export function askConfirm(confirm) {
  return new Promise((resolve) => {
    const layer = $('confirm-layer');
    const done = (answer) => {
      layer.hidden = true;
      layer.replaceChildren();
      app.confirmDone = null;
      resolve(answer);
    };
    const deny = button(plainText(confirm.deny) || 'Cancel', 'modal-button', () => done(false), 'confirm-deny');
    const okStyle = confirm.style === 'danger' ? 'danger' : 'primary';
    const ok = button(plainText(confirm.confirm) || 'Yes', `modal-button ${okStyle}`, () => done(true), 'confirm-ok');
    const text = renderText(confirm.text || { type: 'plain_text', text: '' });
    const box = dialogFrame('confirm', plainText(confirm.title) || 'Are you sure?', text, [deny, ok]);
    box.classList.add('confirm');
    layer.replaceChildren(box);
    layer.hidden = false;
    app.confirmDone = done;
    ok.focus();
  });
}
