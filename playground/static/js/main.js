/*
 * The playground page: shows the server's /play/state as a Slack channel and sends what a person
 * does (mentions, button clicks, modal submits) back to the server as JSON. This module wires the
 * parts together; each draws one thing (channel.js, message.js, composer.js, blocks.js, modals.js,
 * dialogs.js, home.js) from the state in state.js, and api.js talks to the server.
 *
 * Safety rule for every module: text that comes from the state (model answers, tool arguments,
 * user names …) only ever reaches the page through textContent, createTextNode or attribute
 * values checked in mrkdwn.js (link hrefs are http/https/mailto only). No innerHTML anywhere.
 */

import { followState } from './api.js';
import { setPending } from './blocks.js';
import { renderChannel, showMessage } from './channel.js';
import { setupComposer } from './composer.js';
import { $, el } from './dom.js';
import { openHome, renderHome, showPane } from './home.js';
import { closeModal, renderModal, topView } from './modals.js';
import { app, displayName } from './state.js';

const STORE_KEY = 'playground.user';

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
  // A permalink into this channel (mrkdwn.js marks it) scrolls to its message instead of a new tab.
  document.addEventListener('click', (e) => {
    const link = e.target instanceof Element && e.target.closest('a[data-permalink]');
    if (!link) return;
    e.preventDefault();
    showMessage(link.dataset.permalink);
  });
  followState(render);
}

document.addEventListener('DOMContentLoaded', setup);
