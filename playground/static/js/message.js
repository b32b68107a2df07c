/*
 * One message as the channel and its threads show it: avatar, author, time, a stream's tasks,
 * blocks or text, files, reactions; an ephemeral one says only its user sees it.
 */

import { renderBlocks } from './blocks.js';
import { el } from './dom.js';
import { EMOJI, renderMrkdwn } from './mrkdwn.js';
import { app, displayName, isBotUser } from './state.js';

/** "1764780000.000100" -> "14:40:00" in local time. */
function formatTs(ts) {
  const d = new Date(parseFloat(ts) * 1000);
  if (isNaN(d.getTime())) return '';
  const pad = (n) => String(n).padStart(2, '0');
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

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
export function renderMessage(msg, eph) {
  const bot = !!msg.bot_id || isBotUser(msg.user);
  const node = el('div', `message${eph ? ' ephemeral' : ''}${bot ? ' from-bot' : ''}${msg.streaming ? ' streaming' : ''}`);
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
  // Slack keeps a stream's tasks when it stops and when chat.update settles it: above its blocks.
  if (Array.isArray(msg.tasks) && msg.tasks.length) body.append(renderTasks(msg.tasks, msg.task_display_mode));
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

const TASK_STATUS = {
  pending: { mark: '○', word: 'pending' },
  in_progress: { mark: '◌', word: 'in progress' },
  complete: { mark: '✓', word: 'complete' },
  error: { mark: '✗', word: 'error' },
};

/** A streaming message's tasks (task_update chunks), in the order first seen: status, title, details. */
function renderTasks(tasks, mode) {
  const list = el('ol', `stream-tasks${mode === 'plan' ? ' plan' : ''}`);
  list.setAttribute('aria-label', 'Tasks');
  for (const task of tasks) {
    const status = TASK_STATUS[task.status] ? task.status : 'pending';
    const item = el('li', `task task-${status}`);
    item.dataset.taskId = task.id;
    item.dataset.status = status;
    const mark = el('span', 'task-mark', TASK_STATUS[status].mark);
    mark.title = TASK_STATUS[status].word;
    mark.setAttribute('aria-label', TASK_STATUS[status].word);
    mark.setAttribute('role', 'img');
    item.append(mark, el('span', 'task-title', task.title || ''));
    if (task.details) item.append(el('span', 'task-details', task.details));
    if (task.output) item.append(el('div', 'task-output', task.output));
    list.append(item);
  }
  return list;
}
