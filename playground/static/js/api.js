/*
 * The page's calls to the playground server: POSTs of what a person does, and the state kept
 * current (GET /play/state whenever /play/events announces a new version, polling while the
 * event stream is down). The error strip says when a call failed.
 */

import { $, button, el } from './dom.js';
import { app } from './state.js';

const CONNECTION_ERROR = 'Lost the connection to the playground server; retrying every second…';
let onState = () => {}; // called after each new snapshot (main.js's render)

/** Add a dismissable line to the error strip (the same text is shown once). */
export function showError(message) {
  const strip = $('error');
  for (const item of strip.querySelectorAll('.error-text')) if (item.textContent === message) return;
  const row = el('div', 'error-item');
  const x = button('×', 'error-dismiss', () => { row.remove(); strip.hidden = !strip.children.length; });
  x.setAttribute('aria-label', 'Dismiss');
  row.append(el('span', 'error-text', message), x);
  strip.append(row);
  strip.hidden = false;
}

export function clearError(message) {
  const strip = $('error');
  for (const item of strip.querySelectorAll('.error-text')) if (item.textContent === message) item.parentNode.remove();
  strip.hidden = !strip.children.length;
}

/**
 * POST JSON; returns the reply, or null after showing why in the error strip. With
 * `allowErrors`, a reply {ok:false, errors} (a modal's field errors) is left to the caller.
 */
export async function post(path, body, allowErrors) {
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

/** Keep `app.state` current from now on, calling `render` after each new snapshot. */
export function followState(render) {
  onState = render;
  fetchState();
  connectEvents();
}

/** GET /play/channels (each channel's profile and tools: fixed while the server runs) into `app.channels`. */
async function fetchChannels() {
  try {
    const res = await fetch('/play/channels', { cache: 'no-store' });
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    app.channels = (await res.json()).channels || [];
    if (app.state) onState();
  } catch (e) {
    showError(`Could not load /play/channels (${e.message})`);
  }
}

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
    onState();
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
  es.onopen = () => { stopPolling(); fetchState(); fetchChannels(); }; // the server may have restarted
  // Any version but the one shown (a lower one: the server restarted) means fetch again.
  es.onmessage = (e) => { if (!app.state || String(app.state.version) !== e.data.trim()) fetchState(); };
  es.onerror = () => {
    startPolling();
    if (es.readyState === EventSource.CLOSED) setTimeout(connectEvents, 3000); // it gave up: retry
  };
}
