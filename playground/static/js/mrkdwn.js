/*
 * Slack's text as DOM nodes: mrkdwn (bold, italic, strike, code, quotes, code blocks), `<…>`
 * tokens (links, mentions, channels, dates), :emoji: shortcodes, and Block Kit text objects.
 *
 * Safety rule: text from the state only reaches the page through textContent, createTextNode or
 * attribute values checked here (link hrefs are http/https/mailto only). No innerHTML anywhere.
 */

import { el } from './dom.js';
import { app, channelName, displayName, groupHandle, isBotUser, userById } from './state.js';

export const EMOJI = {
  eyes: '👀', white_check_mark: '✅', heavy_check_mark: '✔️', hourglass: '⌛',
  hourglass_flowing_sand: '⏳', no_entry: '⛔', no_entry_sign: '🚫', octagonal_sign: '🛑',
  warning: '⚠️', bell: '🔔', arrow_forward: '▶️', raised_hand: '✋', repeat: '🔁', x: '❌',
  lock: '🔒', unlock: '🔓', key: '🔑', pencil2: '✏️', memo: '📝', robot_face: '🤖',
  white_circle: '⚪', red_circle: '🔴', large_green_circle: '🟢', '+1': '👍', thumbsup: '👍',
  '-1': '👎', thumbsdown: '👎', tada: '🎉', rocket: '🚀', sparkles: '✨', fire: '🔥', zap: '⚡',
  question: '❓', exclamation: '❗', information_source: 'ℹ️', gear: '⚙️', wrench: '🔧',
  hammer_and_wrench: '🛠️', mag: '🔍', page_facing_up: '📄', file_folder: '📁',
  speech_balloon: '💬', thinking_face: '🤔', wave: '👋', stopwatch: '⏱️', heart: '❤️',
  smile: '😄', slightly_smiling_face: '🙂', point_right: '👉', construction: '🚧',
};

export function emojify(text) {
  return String(text).replace(/:([a-z0-9_+'-]+):/g, (m, name) => EMOJI[name] || m);
}

/** The three entities Slack escapes; one pass, so "&amp;lt;" becomes "&lt;", not "<". */
function decodeEntities(text) {
  return text.replace(/&(lt|gt|amp);/g, (m, name) => ({ lt: '<', gt: '>', amp: '&' })[name]);
}

export function isSafeUrl(url) {
  return /^(https?:\/\/|mailto:)/i.test(url);
}

const MARKS = { '*': 'b', _: 'i', '~': 's', '`': 'code' };
const WORD_CHAR = /[\p{L}\p{N}]/u;

/** A Slack `<…>` token: link, mention, channel, special mention or date. */
export function renderToken(inner) {
  const bar = inner.indexOf('|');
  const target = bar < 0 ? inner : inner.slice(0, bar);
  const label = bar < 0 ? null : decodeEntities(inner.slice(bar + 1));
  const pill = (text, kind) => el('span', `mention ${kind}`, text);
  let m;
  if ((m = /^@([UW][A-Z0-9]+)$/.exec(target))) {
    const known = userById(m[1]) || isBotUser(m[1]);
    return pill('@' + (known ? displayName(m[1]) : label ? label.replace(/^@/, '') : m[1]), 'user');
  }
  if ((m = /^#([CGD][A-Z0-9]+)$/.exec(target))) {
    return pill('#' + (label || channelName(m[1])), 'channel');
  }
  if ((m = /^!(here|channel|everyone)$/.exec(target))) return pill('@' + m[1], 'special');
  if ((m = /^!subteam\^([A-Z0-9]+)$/.exec(target))) {
    const handle = groupHandle(m[1]); // as Slack shows a group: its handle, whatever the label says
    return pill(handle ? `@${handle}` : label || `@${m[1]}`, 'group');
  }
  if (/^!subteam\^/.test(target)) return pill(label || '@group', 'group');
  if ((m = /^!date\^(\d+)\^/.exec(target))) {
    return el('span', 'date', label || new Date(Number(m[1]) * 1000).toLocaleString());
  }
  if (target.startsWith('!')) return el('span', null, label || '@' + target.slice(1));
  const url = decodeEntities(target);
  if (isSafeUrl(url)) return makeLink(url, label || url);
  if (/^[a-z][a-z0-9+.-]*:/i.test(url)) return document.createTextNode(label || url); // javascript: …
  return document.createTextNode(`<${decodeEntities(inner)}>`); // not a Slack token: shown as typed
}

/** An <a> to a checked http(s)/mailto URL; a permalink into one of the channels scrolls to it instead. */
export function makeLink(url, text) {
  const a = el('a', 'link', text);
  a.href = url;
  a.target = '_blank';
  a.rel = 'noopener noreferrer';
  const perma = /\/archives\/([A-Z0-9]+)\/p(\d{10})(\d{6})/.exec(url);
  if (perma && app.state && (app.state.channels || []).some((c) => c.id === perma[1])) {
    a.dataset.permalink = `${perma[2]}.${perma[3]}`;
    a.dataset.channel = perma[1];
  }
  return a;
}

/** Plain text of mrkdwn (for code spans and pre blocks): tokens as their labels, entities decoded. */
function mrkdwnPlain(text) {
  return text.split(/(<[^<>\n]*>)/).map((part, i) =>
    i % 2 ? renderToken(part.slice(1, -1)).textContent : decodeEntities(part)).join('');
}

/**
 * Inline mrkdwn of one paragraph into `parent`. Tokens (`<…>`) and known `:emoji:` are masked
 * first, so a `_` or `*` inside a URL or a shortcode is never taken for a formatting mark.
 */
function renderInline(text, parent) {
  const atoms = [];
  const masked = text.replace(/<[^<>\n]*>|:[a-z0-9_+'-]+:/g, (m, offset) => {
    if (m[0] === ':' && !EMOJI[m.slice(1, -1)]) return m;
    atoms.push({ start: offset, end: offset + m.length });
    return '\u0001'.repeat(m.length);
  });
  formatRange(text, masked, atoms, 0, text.length, parent);
}

function formatRange(text, masked, atoms, from, to, parent) {
  let start = from;
  for (let i = from; i < to; i++) {
    const mark = masked[i];
    if (!MARKS[mark] || !opensAt(masked, i)) continue;
    const end = closerFor(masked, i, to);
    if (end < 0) continue;
    emitText(text, atoms, start, i, parent);
    const node = el(MARKS[mark], mark === '`' ? 'code' : null);
    if (mark === '`') node.textContent = mrkdwnPlain(text.slice(i + 1, end));
    else formatRange(text, masked, atoms, i + 1, end, node);
    parent.append(node);
    i = end;
    start = end + 1;
  }
  emitText(text, atoms, start, to, parent);
}

/** A mark opens a span after a non-word character and before a non-blank one. */
function opensAt(masked, i) {
  const before = i > 0 ? masked[i - 1] : ' ';
  const after = masked[i + 1];
  return !WORD_CHAR.test(before) && after !== undefined && !/\s/.test(after) && after !== masked[i];
}

/** Where the span opened at `i` closes on the same line, or -1. */
function closerFor(masked, i, to) {
  const mark = masked[i];
  for (let j = i + 2; j < to; j++) {
    if (masked[j] === '\n') return -1;
    if (masked[j] !== mark) continue;
    const next = masked[j + 1];
    if (mark === '`') return j;
    if (!/\s/.test(masked[j - 1]) && (next === undefined || !WORD_CHAR.test(next))) return j;
  }
  return -1;
}

/** Text between `from` and `to`: plain runs decoded, tokens and emoji rendered. */
function emitText(text, atoms, from, to, parent) {
  let pos = from;
  for (const atom of atoms) {
    if (atom.end <= from || atom.start >= to) continue;
    if (atom.start > pos) parent.append(decodeEntities(text.slice(pos, atom.start)));
    const raw = text.slice(atom.start, atom.end);
    parent.append(raw[0] === '<' ? renderToken(raw.slice(1, -1)) : EMOJI[raw.slice(1, -1)]);
    pos = atom.end;
  }
  if (pos < to) parent.append(decodeEntities(text.slice(pos, to)));
}

/** Lines of one non-code stretch: runs of `>` lines become quotes, the rest inline text. */
function renderLines(text, parent) {
  const lines = text.split('\n');
  let run = [];
  let quoting = false;
  const flush = () => {
    if (!run.length) return;
    const box = quoting ? el('blockquote', 'quote') : el('span', 'para');
    renderInline(run.join('\n'), box);
    parent.append(box);
    run = [];
  };
  for (const line of lines) {
    const q = /^(?:>|&gt;) ?/.exec(line); // Slack stores a typed ">" as "&gt;" and still quotes it
    if (!!q !== quoting) flush();
    quoting = !!q;
    run.push(q ? line.slice(q[0].length) : line);
  }
  flush();
}

/** Slack mrkdwn -> a DOM node (white-space: pre-wrap keeps its line breaks). */
export function renderMrkdwn(text) {
  const root = el('div', 'mrkdwn');
  const parts = String(text || '').split('```');
  parts.forEach((part, i) => {
    const isPre = i % 2 === 1 && i < parts.length - 1;
    if (isPre) {
      root.append(el('pre', 'pre', mrkdwnPlain(part.replace(/^\n/, '').replace(/\n$/, ''))));
      return;
    }
    let body = i % 2 === 1 ? '```' + part : part; // an unclosed fence stays as text
    if (i > 0) body = body.replace(/^\n/, '');
    if (i < parts.length - 1) body = body.replace(/\n$/, '');
    if (body) renderLines(body, root);
  });
  return root;
}

/** A Block Kit text object (mrkdwn or plain_text) as a node. */
export function renderText(obj, className) {
  if (!obj) return el('span');
  let node;
  if (obj.type === 'mrkdwn') node = renderMrkdwn(obj.text);
  else node = el('div', 'plain', obj.emoji === false ? obj.text : emojify(obj.text || ''));
  if (className) node.classList.add(className);
  return node;
}

export function plainText(obj) {
  if (!obj) return '';
  return obj.emoji === false || obj.type === 'mrkdwn' ? obj.text || '' : emojify(obj.text || '');
}
