/*
 * The page's state: the last /play/state snapshot and what this tab adds to it (the selected user,
 * drafts, the open modal's fields …), and who is who in the snapshot.
 */

export const app = {
  state: null, // the last /play/state snapshot
  user: null, // the selected user's id
  channel: null, // the selected channel's id
  channels: [], // GET /play/channels: each channel's profile, tools and who may do what there
  pane: 'channel', // 'channel' or 'home'
  fetching: false, // a /play/state request is in flight
  refetch: false, // a change was announced while it was: fetch once more
  sigs: {}, // what each part was last rendered from, to skip work (and keep focus) when unchanged
  drafts: new Map(), // thread ts -> text typed in that thread's reply box
  openThreads: new Set(), // top-level ts whose reply box was opened while it had no replies
  modal: { key: null, values: {}, errors: {} }, // what was typed in the open modal, and its errors
  dismissed: new Set(), // modal keys hidden after submit/close until the state drops them
  pollTimer: null, // set while /play/events is down
  confirmDone: null, // answers the open confirmation (Escape says no)
  flashed: null, // the ts of the message the last permalink followed led to (it keeps its mark)
};

/** The selected channel as /play/channels describes it (its id and name alone until that answers). */
export function currentChannel() {
  const fromState = ((app.state && app.state.channels) || []).find((c) => c.id === app.channel) || null;
  return app.channels.find((c) => c.id === app.channel) || fromState;
}

/** The channel `id`'s name, or the id itself for a channel the workspace does not have. */
export function channelName(id) {
  const found = ((app.state && app.state.channels) || []).find((c) => c.id === id);
  return found ? found.name : id;
}

/** The snapshot's user `id`, or null. */
export function userById(id) {
  return (app.state && app.state.users.find((u) => u.id === id)) || null;
}

/** The handle of user group `id` (what Slack shows a `<!subteam^…>` as), or null. */
export function groupHandle(id) {
  const found = ((app.state && app.state.groups) || []).find((g) => g.id === id);
  return found ? found.handle : null;
}

/** Whether `id` is the bot's own user. */
export function isBotUser(id) {
  return !!(app.state && app.state.bot && app.state.bot.user_id === id);
}

/** The name the page shows for user `id` (the id itself for a stranger). */
export function displayName(id) {
  if (isBotUser(id)) return app.state.bot.name;
  const u = userById(id);
  return u ? u.real_name || u.name : id;
}
