/*
 * Small DOM helpers every part of the page uses. Text only ever reaches the page through
 * textContent (el) or createTextNode: nothing here parses HTML.
 */

/** A new element with an optional class and text (set with textContent, never parsed). */
export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

export const $ = (id) => document.getElementById(id);

/** A <button type=button> with its text and click handler. */
export function button(text, className, onClick, id) {
  const node = el('button', className, text);
  node.type = 'button';
  if (id) node.id = id;
  if (onClick) node.addEventListener('click', onClick);
  return node;
}
