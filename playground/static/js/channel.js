/*
 * The channel: top-level messages in time order, each with its thread (replies and the selected
 * user's ephemerals) and reply box; kept scrolled and focused across renders.
 */

import { showError } from './api.js';
import { renderReplyBox } from './composer.js';
import { $, button, el } from './dom.js';
import { showPane } from './home.js';
import { renderMessage } from './message.js';
import { app } from './state.js';

let switchChannel = () => {}; // main.js's: select a channel and draw it

/** Tell showMessage how to open another channel. */
export function onSwitchChannel(fn) {
  switchChannel = fn;
}

/** Order of two Slack timestamps, compared exactly (seconds, then the six-digit fraction). */
function compareTs(a, b) {
  const [ai, af = ''] = String(a).split('.');
  const [bi, bf = ''] = String(b).split('.');
  return Number(ai) - Number(bi) || Number(af.padEnd(6, '0')) - Number(bf.padEnd(6, '0'));
}

/** The channel's messages and the user's ephemerals there. */
function inChannel(state, user, channel) {
  return {
    messages: state.messages.filter((m) => m.channel === channel),
    ephemerals: state.ephemerals.filter((e) => e.user === user && e.channel === channel),
  };
}

/** Top-level items and each thread's replies (messages and the user's ephemerals), by ts. */
function buildTimeline(shown) {
  const items = shown.messages.map((m) => ({ msg: m, eph: false }))
    .concat(shown.ephemerals.map((e) => ({ msg: e, eph: true })));
  items.sort((a, b) => compareTs(a.msg.ts, b.msg.ts));
  const parents = new Set(shown.messages.filter((m) => !m.thread_ts || m.thread_ts === m.ts).map((m) => m.ts));
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

/** Draw the channel from the state (skipped when unchanged), keeping scroll and caret. */
export function renderChannel() {
  const state = app.state;
  const list = $('messages');
  const shown = inChannel(state, app.user, app.channel);
  const sig = JSON.stringify([app.user, app.channel, shown, state.users, [...app.openThreads]]);
  if (sig === app.sigs.channel) return;
  app.sigs.channel = sig;
  const nearBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 120;
  const oldTop = list.scrollTop;
  const active = document.activeElement; // keep the caret in a reply box across the rebuild
  const focus = active && active.classList.contains('reply-input')
    ? { thread: active.dataset.thread, start: active.selectionStart, end: active.selectionEnd } : null;
  const { top, replies } = buildTimeline(shown);
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
  // The message a permalink led to keeps its mark across rebuilds, without flashing again.
  const linked = app.flashed && list.querySelector(`.message[data-ts="${CSS.escape(app.flashed)}"]`);
  if (linked) linked.classList.add('flash', 'flash-kept');
  const box = focus && list.querySelector(`textarea.reply-input[data-thread="${CSS.escape(focus.thread)}"]`);
  if (box) {
    box.focus();
    box.setSelectionRange(focus.start, focus.end);
  }
  list.scrollTop = nearBottom ? list.scrollHeight : oldTop;
}

/** Scroll to a message (a permalink was clicked) and flash it, in its channel. */
export function showMessage(ts, channel) {
  if (channel && channel !== app.channel) switchChannel(channel);
  showPane('channel');
  const node = $('messages').querySelector(`.message[data-ts="${CSS.escape(ts)}"]`);
  if (!node) return showError(`That message (${ts}) is not in the channel.`);
  node.scrollIntoView({ block: 'center' });
  // The class marks the message linked to until the next link is followed (its animation runs
  // once, as it is added): a page slow to look, a test on a loaded machine, still finds it.
  for (const old of $('messages').querySelectorAll('.message.flash')) old.classList.remove('flash', 'flash-kept');
  void node.offsetWidth; // the same message linked to again flashes again
  node.classList.add('flash');
  app.flashed = ts;
}
