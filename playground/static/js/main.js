/*
 * The playground page: shows the server's /play/state as a Slack workspace of a few channels and
 * sends what a person does (mentions, button clicks, modal submits) back to the server as JSON.
 * This module wires the parts together; each draws one thing (channel.js, message.js,
 * composer.js, blocks.js, modals.js, dialogs.js, home.js) from the state in state.js, and api.js
 * talks to the server. /play/channels says which profile each channel has and what it offers.
 *
 * Safety rule for every module: text that comes from the state (model answers, tool arguments,
 * user names …) only ever reaches the page through textContent, createTextNode or attribute
 * values checked in mrkdwn.js (link hrefs are http/https/mailto only). No innerHTML anywhere.
 */

import { followState, showError } from './api.js';
import { setPending } from './blocks.js';
import { onSwitchChannel, renderChannel, showMessage } from './channel.js';
import { setupComposer } from './composer.js';
import { $, button, el } from './dom.js';
import { openHome, renderHome, showPane } from './home.js';
import { closeModal, renderModal, topView } from './modals.js';
import { app, currentChannel, displayName } from './state.js';

const STORE_KEY = 'playground.user';
const CHANNEL_KEY = 'playground.channel';

/** The selected user's note in the selected channel (approver, may not ask here …). */
function noteOf(user) {
  const channel = currentChannel();
  if (channel && channel.notes) return channel.notes[user.id] || '';
  return user.note || '';
}

function renderUsers() {
  const state = app.state;
  const saved = localStorage.getItem(STORE_KEY);
  if (!state.users.some((u) => u.id === app.user)) {
    app.user = state.users.some((u) => u.id === saved) ? saved : (state.users[0] || {}).id || null;
  }
  const labels = state.users.map((u) => [u.id, `${u.real_name || u.name}${noteOf(u) ? ` (${noteOf(u)})` : ''}`]);
  const sig = JSON.stringify(labels);
  const select = $('user');
  if (sig !== app.sigs.users) {
    app.sigs.users = sig;
    select.replaceChildren(...labels.map(([id, label]) => {
      const opt = el('option', null, label);
      opt.value = id;
      return opt;
    }));
  }
  select.value = app.user;
}

/** Select channel `id` (kept across reloads) and draw it. */
function switchChannel(id) {
  if (id === app.channel) return;
  app.channel = id;
  localStorage.setItem(CHANNEL_KEY, id);
  app.openThreads.clear();
  render();
}

function renderChannelList() {
  const channels = app.state.channels || [];
  if (!channels.some((c) => c.id === app.channel)) {
    const saved = localStorage.getItem(CHANNEL_KEY);
    app.channel = channels.some((c) => c.id === saved) ? saved : (channels[0] || {}).id || null;
  }
  const sig = JSON.stringify([channels, app.channel, app.pane]);
  if (sig === app.sigs.channels) return;
  app.sigs.channels = sig;
  $('nav-channels').replaceChildren(...channels.map((c) => {
    const item = button('', 'nav-item', () => { switchChannel(c.id); showPane('channel'); });
    item.dataset.channel = c.id;
    item.classList.toggle('active', app.pane === 'channel' && c.id === app.channel);
    item.append(el('span', 'hash', '#'), el('span', 'nav-channel-name', c.name));
    return item;
  }));
}

/** The strip under the channel's name: its profile, the tools a run here is offered, its rules. */
function renderProfile() {
  const channel = currentChannel();
  const strip = $('channel-profile');
  const sig = JSON.stringify(channel);
  if (sig === app.sigs.profile) return;
  app.sigs.profile = sig;
  strip.hidden = !(channel && channel.header);
  if (strip.hidden) return;
  $('profile-name').textContent = channel.profile ? `profile: ${channel.profile}` : 'no profile';
  $('profile-header').textContent = channel.header;
  const tools = $('profile-tools');
  tools.replaceChildren(el('span', 'profile-label', 'Tools here:'));
  for (const tool of channel.tools || []) {
    const pill = el('span', `tool-pill tier-${tool.tier}`, `${tool.name} · ${tool.tier}`);
    pill.dataset.tool = tool.name;
    pill.title = tool.rules ? `${tool.why}; an argument rule may decide some calls` : tool.why;
    tools.append(pill);
  }
  for (const other of channel.elsewhere || []) tools.append(el('span', 'tool-pill tier-other', `+ ${other}`));
  const rules = [];
  for (const down of channel.down || []) { // a server the worker cannot start: shown, never as if it worked
    const pill = el('span', 'tool-pill tier-down', `${down.name} · down`);
    pill.dataset.down = down.name;
    pill.title = down.why;
    tools.append(pill);
    rules.push(`${down.name} is down: ${down.why}.`);
  }
  if (channel.restricted) rules.push('Only some people may ask here (see the user switcher).');
  const budgets = channel.budgets || {};
  if (budgets.per_user_daily_tokens) {
    rules.push(`Budget: ${budgets.per_user_daily_tokens.toLocaleString('en')} tokens per person per day.`);
  }
  if (budgets.per_channel_daily_tokens) {
    rules.push(`Budget: ${budgets.per_channel_daily_tokens.toLocaleString('en')} tokens for the channel per day.`);
  }
  $('profile-rules').textContent = rules.join(' ');
  $('profile-rules').hidden = !rules.length;
}

/** Which model the workers talk to: the demo model, or the model's name (a channel's profile may name
 * its own). Shown always, so that nobody mistakes the demo's scripted replies for Claude's or Claude's
 * (which cost tokens) for the demo's. */
function renderModel(model, channel) {
  const banner = $('model-banner');
  const own = !model.demo && channel && channel.model;
  banner.hidden = false;
  banner.classList.toggle('demo', Boolean(model.demo));
  banner.textContent = model.demo
    ? `🤖 ${model.label || 'Offline demo model'}`
    : own ? `Model: ${channel.model}` : (model.label || 'Model: unknown');
}

let lostShown = 0; // how many of the messages the bot never took are in the error strip already
const plural = (n, word) => `${n} ${word}${n === 1 ? '' : 's'}`;

/** Whether the bot takes what is sent to it: starting, messages kept for Slack-style retries, or
 * messages it never took (those go to the error strip). Kept messages are delivered by themselves. */
function renderDelivery(delivery) {
  const strip = $('bot-status');
  const kept = delivery.kept || [];
  let text = '';
  if (!delivery.bot_answered) {
    text = kept.length
      ? `The bot is starting… ${plural(kept.length, 'message')} kept for it: delivered as soon as it answers.`
      : 'The bot is starting… what you send now is kept and delivered as soon as it answers.';
  } else if (kept.length) {
    const next = kept[0];
    const at = new Date(next.at * 1000).toLocaleTimeString();
    text = `The bot does not answer (${next.reason}): ${plural(kept.length, 'message')} kept for it; `
      + `Slack's retry ${next.retry} of ${next.of} goes by ${at}.`;
  }
  strip.textContent = text;
  strip.hidden = !text;
  const lost = delivery.lost || [];
  if (lost.length < lostShown) lostShown = 0; // the server restarted
  for (const item of lost.slice(lostShown)) showError(`${item.what}: ${item.why}`);
  lostShown = lost.length;
}

function render() {
  const state = app.state;
  state.messages = state.messages || [];
  state.ephemerals = state.ephemerals || [];
  state.users = state.users || [];
  renderChannelList();
  renderUsers();
  const channel = currentChannel() || { name: '' };
  const team = (state.team && state.team.name) || 'Playground';
  $('workspace-name').textContent = team;
  $('sidebar-workspace').textContent = team;
  document.title = `#${channel.name} · ${team}`;
  $('channel-name').textContent = channel.name;
  $('nav-home-name').textContent = `${state.bot.name} · Home`;
  $('composer').placeholder = `Message #${channel.name} (Enter to send, Shift+Enter for a new line)`;
  $('sidebar-foot').textContent = `Acting as ${displayName(app.user)}`;
  renderModel(state.model || {}, currentChannel());
  renderDelivery(state.delivery || { bot_answered: true });
  renderProfile();
  renderChannel();
  renderHome();
  renderModal();
  // "disabled until the next state render": buttons kept from an earlier render come back
  for (const node of document.querySelectorAll('[data-pending]')) setPending(node, false);
}

/*
 * A render rebuilds the channel's nodes. One between a press and its release (a run streaming into
 * the thread re-renders it several times a second) took the button away from under the pointer:
 * the release fell on a new node and the click never fired. While a pointer is down, a new state
 * waits; it is drawn after the click that the release makes (or after a second, whatever happens).
 */
const PRESS_HOLD_MS = 1000;
let pressedAt = 0;
let owed = false;

function onState() {
  // For the tests: how many states reached the page (drawn now or after the release).
  document.body.dataset.states = String(Number(document.body.dataset.states || 0) + 1);
  renderWhenReleased();
}

function renderWhenReleased() {
  if (pressedAt && performance.now() - pressedAt < PRESS_HOLD_MS) {
    owed = true;
    return;
  }
  owed = false;
  render();
}

function holdRendersWhilePressed() {
  document.addEventListener('pointerdown', () => { pressedAt = performance.now(); }, true);
  const release = () => {
    pressedAt = 0;
    if (owed) setTimeout(renderWhenReleased, 0); // a task after this release's click
  };
  document.addEventListener('pointerup', release, true);
  document.addEventListener('pointercancel', release, true);
}

function setup() {
  holdRendersWhilePressed();
  app.user = localStorage.getItem(STORE_KEY);
  app.channel = localStorage.getItem(CHANNEL_KEY);
  setupComposer();
  onSwitchChannel(switchChannel);
  $('user').addEventListener('change', (e) => {
    app.user = e.target.value;
    localStorage.setItem(STORE_KEY, app.user);
    app.openThreads.clear();
    render();
    if (app.pane === 'home') openHome();
  });
  $('nav-home').addEventListener('click', () => showPane('home'));
  document.addEventListener('keydown', (e) => {
    if (e.key !== 'Escape') return;
    if (app.confirmDone) app.confirmDone(false);
    else if (app.state && topView()) closeModal(topView().entry.id);
  });
  // A permalink into a channel (mrkdwn.js marks it) scrolls to its message instead of a new tab.
  document.addEventListener('click', (e) => {
    const link = e.target instanceof Element && e.target.closest('a[data-permalink]');
    if (!link) return;
    e.preventDefault();
    showMessage(link.dataset.permalink, link.dataset.channel);
  });
  followState(onState);
}

document.addEventListener('DOMContentLoaded', setup);
