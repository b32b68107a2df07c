/*
 * The app's Home tab as the selected user sees it, and switching between it and the channel.
 */

import { post } from './api.js';
import { renderBlocks } from './blocks.js';
import { $, el } from './dom.js';
import { app, displayName } from './state.js';

/** Show the channel or the Home tab; opening Home tells the bot (app_home_opened). */
export function showPane(pane) {
  const changed = app.pane !== pane;
  app.pane = pane;
  $('channel-pane').hidden = pane !== 'channel';
  $('home-pane').hidden = pane !== 'home';
  for (const node of document.querySelectorAll('#nav-channels .nav-item')) {
    node.classList.toggle('active', pane === 'channel' && node.dataset.channel === app.channel);
  }
  $('nav-home').classList.toggle('active', pane === 'home');
  if (pane === 'home' && changed) openHome();
}

/** The selected user opened Home: ask the bot for it and draw what there is meanwhile. */
export function openHome() {
  app.sigs.home = null;
  post('/play/home', { user: app.user });
  renderHome();
}

/** Draw the selected user's Home view from the state (skipped when unchanged). */
export function renderHome() {
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
