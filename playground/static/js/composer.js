/*
 * Writing to the bot: the channel's message box with its suggestions, and a thread's reply box.
 * What is sent is a mention of the bot (POST /play/mention), its text as Slack's client stores
 * what was typed (typed.js).
 */

import { post } from './api.js';
import { $, button, el } from './dom.js';
import { app } from './state.js';
import { storedText } from './typed.js';

const SUGGESTIONS = [
  "Write a note about today's plan",
  'Delete a file in the workspace (shows a tool only #ops offers)',
  'List the files forever (shows a valve)',
  'Write my secret to secrets/token.txt (shows a deny)',
  'Write a long report on the folder (shows a file)',
  "Book room 4B for the retro (shows a server's form)",
  "Sign in to the wiki (shows a server's link)",
];

/** Enter sends, Shift+Enter starts a new line. */
function enterSends(e, go) {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    go();
  }
}

async function sendMention(input, sendButton, threadTs) {
  const typed = input.value.trim();
  if (!typed || sendButton.disabled) return;
  const text = storedText(typed);
  sendButton.disabled = true;
  const reply = await post('/play/mention', { user: app.user, text, thread_ts: threadTs, channel: app.channel });
  sendButton.disabled = false;
  if (!reply || !reply.ok) return; // the error strip says why; the text stays
  input.value = '';
  if (threadTs) app.drafts.delete(threadTs);
  const list = $('messages');
  list.scrollTop = list.scrollHeight;
}

/** Wire the channel's message box, its Send button and the suggestion chips. */
export function setupComposer() {
  const input = $('composer');
  const send = $('send');
  const go = () => sendMention(input, send, null);
  send.addEventListener('click', go);
  input.addEventListener('keydown', (e) => enterSends(e, go));
  for (const label of SUGGESTIONS) {
    $('chips').append(button(label, 'chip', () => {
      input.value = label.replace(/\s*\(shows [^)]*\)$/, ''); // the hint is for the reader only
      input.focus();
    }));
  }
}

/** A thread's reply box, keeping what was typed in it across renders. */
export function renderReplyBox(parentTs) {
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
