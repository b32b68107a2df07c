/*
 * The playground page: shows the server's /play/state as a Slack channel and sends what a
 * person does (mentions, button clicks, modal submits) back to the server as JSON.
 *
 * Safety rule for this file: text that comes from the state (model answers, tool arguments,
 * user names …) only ever reaches the page through textContent, createTextNode or attribute
 * values checked here (link hrefs are http/https/mailto only). No innerHTML anywhere.
 */
'use strict';

// ---- page state ------------------------------------------------------------------------------

const app = {
  state: null, // the last /play/state snapshot
  user: null, // the selected user's id
  pane: 'channel', // 'channel' or 'home'
  fetching: false, // a /play/state request is in flight
  refetch: false, // a change was announced while it was: fetch once more
  sigs: {}, // what each part was last rendered from, to skip work (and keep focus) when unchanged
  drafts: new Map(), // thread ts -> text typed in that thread's reply box
  openThreads: new Set(), // top-level ts whose reply box was opened while it had no replies
  modal: { key: null, values: {}, errors: {} }, // what was typed in the open modal, and its errors
  dismissed: new Set(), // modal keys hidden after submit/close until the state drops them
  pollTimer: null, // set while /play/events is down
};

const STORE_KEY = 'playground.user';
const CONNECTION_ERROR = 'Lost the connection to the playground server; retrying every second…';
const SUGGESTIONS = [
  "Write a note about today's plan",
  'Delete a file in the workspace',
  'List the files forever (shows a valve)',
  'Write my secret to secrets/token.txt (shows a deny)',
  'Write a long report on the folder (shows a file)',
];

const EMOJI = {
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

// ---- small DOM helpers -------------------------------------------------------------------------

/** A new element with an optional class and text (set with textContent, never parsed). */
function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

const $ = (id) => document.getElementById(id);

/** A <button type=button> with its text and click handler. */
function button(text, className, onClick, id) {
  const node = el('button', className, text);
  node.type = 'button';
  if (id) node.id = id;
  if (onClick) node.addEventListener('click', onClick);
  return node;
}

function emojify(text) {
  return String(text).replace(/:([a-z0-9_+'-]+):/g, (m, name) => EMOJI[name] || m);
}

/** The three entities Slack escapes; one pass, so "&amp;lt;" becomes "&lt;", not "<". */
function decodeEntities(text) {
  return text.replace(/&(lt|gt|amp);/g, (m, name) => ({ lt: '<', gt: '>', amp: '&' })[name]);
}

function isSafeUrl(url) {
  return /^(https?:\/\/|mailto:)/i.test(url);
}

function userById(id) {
  return (app.state && app.state.users.find((u) => u.id === id)) || null;
}

function isBotUser(id) {
  return !!(app.state && app.state.bot && app.state.bot.user_id === id);
}

function displayName(id) {
  if (isBotUser(id)) return app.state.bot.name;
  const u = userById(id);
  return u ? u.real_name || u.name : id;
}

/** "1764780000.000100" -> "14:40:00" in local time. */
function formatTs(ts) {
  const d = new Date(parseFloat(ts) * 1000);
  if (isNaN(d.getTime())) return '';
  const pad = (n) => String(n).padStart(2, '0');
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** Order of two Slack timestamps, compared exactly (seconds, then the six-digit fraction). */
function compareTs(a, b) {
  const [ai, af = ''] = String(a).split('.');
  const [bi, bf = ''] = String(b).split('.');
  return Number(ai) - Number(bi) || Number(af.padEnd(6, '0')) - Number(bf.padEnd(6, '0'));
}

// ---- mrkdwn ----------------------------------------------------------------------------------

const MARKS = { '*': 'b', _: 'i', '~': 's', '`': 'code' };
const WORD_CHAR = /[\p{L}\p{N}]/u;

/** A Slack `<…>` token: link, mention, channel, special mention or date. */
function renderToken(inner) {
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
    const ch = app.state && app.state.channel;
    return pill('#' + (label || (ch && ch.id === m[1] ? ch.name : m[1])), 'channel');
  }
  if ((m = /^!(here|channel|everyone)$/.exec(target))) return pill('@' + m[1], 'special');
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

/** An <a> to a checked http(s)/mailto URL; a permalink into this channel scrolls to it instead. */
function makeLink(url, text) {
  const a = el('a', 'link', text);
  a.href = url;
  a.target = '_blank';
  a.rel = 'noopener noreferrer';
  const perma = /\/archives\/([A-Z0-9]+)\/p(\d{10})(\d{6})/.exec(url);
  if (perma && app.state && perma[1] === app.state.channel.id) {
    a.addEventListener('click', (e) => {
      e.preventDefault();
      showMessage(`${perma[2]}.${perma[3]}`);
    });
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
function renderMrkdwn(text) {
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
function renderText(obj, className) {
  if (!obj) return el('span');
  let node;
  if (obj.type === 'mrkdwn') node = renderMrkdwn(obj.text);
  else node = el('div', 'plain', obj.emoji === false ? obj.text : emojify(obj.text || ''));
  if (className) node.classList.add(className);
  return node;
}

function plainText(obj) {
  if (!obj) return '';
  return obj.emoji === false || obj.type === 'mrkdwn' ? obj.text || '' : emojify(obj.text || '');
}

// ---- Block Kit -------------------------------------------------------------------------------

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
function setPending(node, on) {
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

/** One input block of a modal: label, field (keeps what was typed), hint and error. */
function renderInput(block, index, ctx) {
  const blockId = block.block_id || `input_${index}`;
  const element = block.element || {};
  const node = el('div', 'bk-input');
  node.dataset.blockId = blockId;
  const label = el('label', 'bk-input-label', plainText(block.label));
  if (block.optional) label.append(el('span', 'optional', ' (optional)'));
  node.append(label);
  if (element.type !== 'plain_text_input') {
    node.append(placeholder(element.type || 'input'));
    return node;
  }
  const field = el(element.multiline ? 'textarea' : 'input', 'bk-field-input');
  if (!element.multiline) field.type = 'text';
  else field.rows = 4;
  field.id = `input-${blockId}`;
  label.htmlFor = field.id;
  field.dataset.blockId = blockId;
  field.dataset.actionId = element.action_id || 'value';
  if (element.placeholder) field.placeholder = plainText(element.placeholder);
  if (element.max_length) field.maxLength = element.max_length;
  const saved = app.modal.values[blockId];
  field.value = saved !== undefined ? saved : element.initial_value || '';
  field.addEventListener('input', () => { app.modal.values[blockId] = field.value; });
  node.append(field);
  if (block.hint) node.append(el('div', 'bk-hint', plainText(block.hint)));
  const error = (ctx.errors || {})[blockId];
  if (error) {
    node.classList.add('has-error');
    node.append(el('div', 'bk-error', error));
  }
  return node;
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

function renderBlocks(blocks, ctx) {
  const box = el('div', 'blocks');
  blocks.forEach((b, i) => box.append(renderBlock(b, ctx, i)));
  return box;
}

// ---- messages and the channel -------------------------------------------------------------------

function avatar(userId) {
  const name = displayName(userId) || '?';
  const node = el('div', 'avatar', isBotUser(userId) ? '🤖' : name.slice(0, 1).toUpperCase());
  let hash = 0;
  for (const ch of String(userId)) hash = (hash * 31 + ch.charCodeAt(0)) >>> 0;
  node.classList.add(isBotUser(userId) ? 'avatar-bot' : `avatar-${hash % 6}`);
  node.setAttribute('aria-hidden', 'true');
  return node;
}

/** One message (or ephemeral, with `eph` true): header, blocks or text, reactions. */
function renderMessage(msg, eph) {
  const bot = !!msg.bot_id || isBotUser(msg.user);
  const node = el('div', `message${eph ? ' ephemeral' : ''}${bot ? ' from-bot' : ''}`);
  node.dataset.ts = msg.ts;
  node.dataset.threadTs = msg.thread_ts || '';
  node.dataset.user = msg.user || '';
  if (eph) node.dataset.ephemeral = 'true';
  node.append(avatar(eph ? app.state.bot.user_id : msg.user));
  const body = el('div', 'msg-body');
  const head = el('div', 'msg-head');
  head.append(el('span', 'author', bot || eph ? app.state.bot.name : displayName(msg.user)));
  if (bot || eph) head.append(el('span', 'app-tag', 'APP'));
  const time = el('time', 'msg-time', formatTs(msg.ts));
  time.title = msg.ts;
  head.append(time);
  body.append(head);
  if (eph) body.append(el('div', 'eph-note', '👁 Only visible to you'));
  const ctx = { message_ts: msg.ts, ephemeral: !!eph };
  const files = Array.isArray(msg.files) ? msg.files : [];
  if (Array.isArray(msg.blocks) && msg.blocks.length) body.append(renderBlocks(msg.blocks, ctx));
  else if (msg.text || !files.length) body.append(renderMrkdwn(msg.text));
  files.forEach((f) => body.append(renderFile(f)));
  if (msg.edited) body.append(el('span', 'edited', '(edited)'));
  if (Array.isArray(msg.reactions) && msg.reactions.length) {
    const row = el('div', 'reactions');
    for (const r of msg.reactions) {
      const pill = el('span', 'reaction', `${EMOJI[r.name] || `:${r.name}:`} ${r.count ?? (r.users || []).length}`);
      pill.title = `${(r.users || []).map(displayName).join(', ')} reacted with :${r.name}:`;
      pill.dataset.reaction = r.name;
      row.append(pill);
    }
    body.append(row);
  }
  node.append(body);
  return node;
}

/** A file the bot posted (a long answer, a turn's results in full): its title, and its text on demand. */
function renderFile(file) {
  const box = el('details', 'file');
  box.dataset.fileName = file.name || '';
  const summary = el('summary', 'file-head');
  summary.append(el('span', 'file-icon', '📄'), el('span', 'file-title', file.title || file.name || 'file'));
  summary.append(el('span', 'file-name', file.name || ''));
  box.append(summary, el('pre', 'file-text', file.text || ''));
  return box;
}

/** Top-level items and each thread's replies (messages and the user's ephemerals), by ts. */
function buildTimeline(state, user) {
  const items = state.messages.map((m) => ({ msg: m, eph: false }))
    .concat(state.ephemerals.filter((e) => e.user === user).map((e) => ({ msg: e, eph: true })));
  items.sort((a, b) => compareTs(a.msg.ts, b.msg.ts));
  const parents = new Set(state.messages.filter((m) => !m.thread_ts || m.thread_ts === m.ts).map((m) => m.ts));
  const top = [];
  const replies = new Map();
  for (const item of items) {
    const t = item.msg.thread_ts;
    if (t && t !== item.msg.ts && parents.has(t)) {
      if (!replies.has(t)) replies.set(t, []);
      replies.get(t).push(item);
    } else top.push(item); // a reply whose parent is unknown is shown in the channel
  }
  return { top, replies };
}

function renderThread(parentTs, items) {
  const box = el('div', 'thread');
  box.dataset.thread = parentTs;
  if (items.length) {
    const n = items.filter((i) => !i.eph).length;
    box.append(el('div', 'thread-count', `${n} ${n === 1 ? 'reply' : 'replies'}`));
    items.forEach((i) => box.append(renderMessage(i.msg, i.eph)));
  }
  box.append(renderReplyBox(parentTs));
  return box;
}

function renderReplyBox(parentTs) {
  const form = el('div', 'reply-box');
  const input = el('textarea', 'reply-input');
  input.rows = 1;
  input.placeholder = 'Reply in thread…';
  input.dataset.thread = parentTs;
  input.value = app.drafts.get(parentTs) || '';
  input.addEventListener('input', () => app.drafts.set(parentTs, input.value));
  const go = () => sendMention(input, send, parentTs);
  const send = button('Reply', 'reply-send', go);
  send.dataset.thread = parentTs;
  input.addEventListener('keydown', (e) => enterSends(e, go));
  form.append(input, send);
  return form;
}

function renderChannel() {
  const state = app.state;
  const list = $('messages');
  const sig = JSON.stringify([app.user, state.messages, state.ephemerals.filter((e) => e.user === app.user),
    state.users, [...app.openThreads]]);
  if (sig === app.sigs.channel) return;
  app.sigs.channel = sig;
  const nearBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 120;
  const oldTop = list.scrollTop;
  const active = document.activeElement; // keep the caret in a reply box across the rebuild
  const focus = active && active.classList.contains('reply-input')
    ? { thread: active.dataset.thread, start: active.selectionStart, end: active.selectionEnd } : null;
  const { top, replies } = buildTimeline(state, app.user);
  const frag = document.createDocumentFragment();
  if (!top.length) frag.append(el('div', 'empty-note', 'No messages yet. Pick a suggestion below, or mention the bot.'));
  for (const item of top) {
    const wrap = el('div', 'entry');
    wrap.append(renderMessage(item.msg, item.eph));
    const threadItems = replies.get(item.msg.ts) || [];
    if (!item.eph && (threadItems.length || app.openThreads.has(item.msg.ts))) {
      wrap.append(renderThread(item.msg.ts, threadItems));
    } else if (!item.eph) {
      wrap.append(button('Reply in thread', 'thread-open', () => {
        app.openThreads.add(item.msg.ts);
        renderChannel();
        const box = list.querySelector(`textarea.reply-input[data-thread="${CSS.escape(item.msg.ts)}"]`);
        if (box) box.focus();
      }));
    }
    frag.append(wrap);
  }
  list.replaceChildren(frag);
  const box = focus && list.querySelector(`textarea.reply-input[data-thread="${CSS.escape(focus.thread)}"]`);
  if (box) {
    box.focus();
    box.setSelectionRange(focus.start, focus.end);
  }
  list.scrollTop = nearBottom ? list.scrollHeight : oldTop;
}

/** Scroll to a message (a permalink was clicked) and flash it. */
function showMessage(ts) {
  showPane('channel');
  const node = $('messages').querySelector(`.message[data-ts="${CSS.escape(ts)}"]`);
  if (!node) return showError(`That message (${ts}) is not in the channel.`);
  node.scrollIntoView({ block: 'center' });
  node.classList.add('flash');
  setTimeout(() => node.classList.remove('flash'), 1600);
}

// ---- composing ---------------------------------------------------------------------------------

function enterSends(e, go) {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    go();
  }
}

async function sendMention(input, sendButton, threadTs) {
  const text = input.value.trim();
  if (!text || sendButton.disabled) return;
  sendButton.disabled = true;
  const reply = await post('/play/mention', { user: app.user, text, thread_ts: threadTs });
  sendButton.disabled = false;
  if (!reply || !reply.ok) return; // the error strip says why; the text stays
  input.value = '';
  if (threadTs) app.drafts.delete(threadTs);
  const list = $('messages');
  list.scrollTop = list.scrollHeight;
}

function setupComposer() {
  const input = $('composer');
  const send = $('send');
  const go = () => sendMention(input, send, null);
  send.addEventListener('click', go);
  input.addEventListener('keydown', (e) => enterSends(e, go));
  for (const label of SUGGESTIONS) {
    $('chips').append(button(label, 'chip', () => {
      input.value = label.replace(/\s*\(shows an? [a-z]+\)$/, ''); // the hint is for the reader only
      input.focus();
    }));
  }
}

// ---- Home tab ------------------------------------------------------------------------------------

function showPane(pane) {
  const changed = app.pane !== pane;
  app.pane = pane;
  $('channel-pane').hidden = pane !== 'channel';
  $('home-pane').hidden = pane !== 'home';
  $('nav-channel').classList.toggle('active', pane === 'channel');
  $('nav-home').classList.toggle('active', pane === 'home');
  if (pane === 'home' && changed) openHome();
}

function openHome() {
  app.sigs.home = null;
  post('/play/home', { user: app.user });
  renderHome();
}

function renderHome() {
  if (!app.state) return;
  const view = (app.state.homes || {})[app.user];
  const sig = JSON.stringify([app.user, view || null]);
  if (sig === app.sigs.home) return;
  app.sigs.home = sig;
  const box = $('home');
  $('home-title').textContent = `${app.state.bot.name} · Home`;
  if (!view) {
    box.replaceChildren(el('div', 'empty-note', `Opening the Home tab for ${displayName(app.user)}…`));
    return;
  }
  box.replaceChildren(renderBlocks(view.blocks || [], { view_id: view.id || 'home' }));
}

// ---- modals and confirmations ----------------------------------------------------------------------

/** The selected user's top modal and the key that changes when the bot replaces its content. */
function topView() {
  const mine = (app.state.views || []).filter((v) => v.user === app.user && !app.dismissed.has(viewKey(v)));
  return mine.length ? { entry: mine[mine.length - 1], key: viewKey(mine[mine.length - 1]) } : null;
}

const viewKey = (v) => `${v.id}\u0000${v.view.hash || JSON.stringify(v.view.blocks)}`;

function renderModal() {
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
  const first = layer.querySelector(fresh ? 'input, textarea' : '.has-error input, .has-error textarea');
  if (first) first.focus();
  else if (fresh) $('modal').focus();
}

/** The frame modals and confirmations share: a title (and × when `onX`), a body, buttons. */
function dialogFrame(id, title, body, buttons, onX) {
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
  for (const field of $('modal').querySelectorAll('.bk-field-input')) {
    values[field.dataset.blockId] = { [field.dataset.actionId]: field.value };
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

async function closeModal(viewId) {
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

/** A Block Kit confirmation object as an in-page dialog; resolves true on confirm. */
function askConfirm(confirm) {
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

// ---- errors ------------------------------------------------------------------------------------

/** Add a dismissable line to the error strip (the same text is shown once). */
function showError(message) {
  const strip = $('error');
  for (const item of strip.querySelectorAll('.error-text')) if (item.textContent === message) return;
  const row = el('div', 'error-item');
  const x = button('×', 'error-dismiss', () => { row.remove(); strip.hidden = !strip.children.length; });
  x.setAttribute('aria-label', 'Dismiss');
  row.append(el('span', 'error-text', message), x);
  strip.append(row);
  strip.hidden = false;
}

function clearError(message) {
  const strip = $('error');
  for (const item of strip.querySelectorAll('.error-text')) if (item.textContent === message) item.parentNode.remove();
  strip.hidden = !strip.children.length;
}

/**
 * POST JSON; returns the reply, or null after showing why in the error strip. With
 * `allowErrors`, a reply {ok:false, errors} (a modal's field errors) is left to the caller.
 */
async function post(path, body, allowErrors) {
  let reply;
  try {
    // X-Playground: the server refuses page POSTs without it (no cross-site form can send it).
    const headers = { 'Content-Type': 'application/json', 'X-Playground': '1' };
    const res = await fetch(path, { method: 'POST', headers, body: JSON.stringify(body) });
    const raw = await res.text();
    try { reply = JSON.parse(raw); } catch (e) { reply = null; }
    if (!reply || typeof reply !== 'object') {
      showError(`${path}: HTTP ${res.status} ${raw.slice(0, 200) || res.statusText}`);
      return null;
    }
  } catch (e) {
    showError(`${path}: the server did not answer (${e.message})`);
    return null;
  }
  if (!reply.ok && !(allowErrors && reply.errors)) showError(`${path}: ${reply.error || 'failed'}`);
  return reply;
}

// ---- state, events and the whole render ----------------------------------------------------------------

/** At most one fetch in flight; fetch again afterwards if a newer version was announced. */
async function fetchState() {
  if (app.fetching) { app.refetch = true; return; }
  app.fetching = true;
  app.refetch = false;
  try {
    const res = await fetch('/play/state', { cache: 'no-store' });
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    const state = await res.json();
    clearError(CONNECTION_ERROR);
    app.state = state; // one request at a time, so never older than the one shown
    render();
  } catch (e) {
    showError(app.pollTimer ? CONNECTION_ERROR : `Could not load /play/state (${e.message})`);
  } finally {
    app.fetching = false;
  }
  if (app.refetch) fetchState();
}

function startPolling() {
  if (!app.pollTimer) app.pollTimer = setInterval(fetchState, 1000);
}

function stopPolling() {
  clearInterval(app.pollTimer);
  app.pollTimer = null;
}

function connectEvents() {
  const es = new EventSource('/play/events');
  es.onopen = () => { stopPolling(); fetchState(); };
  // Any version but the one shown (a lower one: the server restarted) means fetch again.
  es.onmessage = (e) => { if (!app.state || String(app.state.version) !== e.data.trim()) fetchState(); };
  es.onerror = () => {
    startPolling();
    if (es.readyState === EventSource.CLOSED) setTimeout(connectEvents, 3000); // it gave up: retry
  };
}

function renderUsers() {
  const state = app.state;
  const saved = localStorage.getItem(STORE_KEY);
  if (!state.users.some((u) => u.id === app.user)) {
    app.user = state.users.some((u) => u.id === saved) ? saved : (state.users[0] || {}).id || null;
  }
  const sig = JSON.stringify(state.users);
  const select = $('user');
  if (sig !== app.sigs.users) {
    app.sigs.users = sig;
    select.replaceChildren(...state.users.map((u) => {
      const opt = el('option', null, `${u.real_name || u.name}${u.note ? ` (${u.note})` : ''}`);
      opt.value = u.id;
      return opt;
    }));
  }
  select.value = app.user;
}

function render() {
  const state = app.state;
  state.messages = state.messages || [];
  state.ephemerals = state.ephemerals || [];
  state.users = state.users || [];
  renderUsers();
  const team = (state.team && state.team.name) || 'Playground';
  $('workspace-name').textContent = team;
  $('sidebar-workspace').textContent = team;
  document.title = `#${state.channel.name} · ${team}`;
  for (const id of ['channel-name', 'nav-channel-name']) $(id).textContent = state.channel.name;
  $('nav-home-name').textContent = `${state.bot.name} · Home`;
  $('composer').placeholder = `Message #${state.channel.name} (Enter to send, Shift+Enter for a new line)`;
  $('sidebar-foot').textContent = `Acting as ${displayName(app.user)}`;
  const banner = $('model-banner');
  banner.hidden = !(state.model && state.model.demo);
  banner.textContent = state.model && state.model.demo ? `🤖 ${state.model.label || 'Offline demo model'}` : '';
  renderChannel();
  renderHome();
  renderModal();
  // "disabled until the next state render": buttons kept from an earlier render come back
  for (const node of document.querySelectorAll('[data-pending]')) setPending(node, false);
}

function setup() {
  app.user = localStorage.getItem(STORE_KEY);
  setupComposer();
  $('user').addEventListener('change', (e) => {
    app.user = e.target.value;
    localStorage.setItem(STORE_KEY, app.user);
    app.openThreads.clear();
    render();
    if (app.pane === 'home') openHome();
  });
  $('nav-channel').addEventListener('click', () => showPane('channel'));
  $('nav-home').addEventListener('click', () => showPane('home'));
  document.addEventListener('keydown', (e) => {
    if (e.key !== 'Escape') return;
    if (app.confirmDone) app.confirmDone(false);
    else if (app.state && topView()) closeModal(topView().entry.id);
  });
  fetchState();
  connectEvents();
}

document.addEventListener('DOMContentLoaded', setup);
