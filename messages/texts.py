"""Every sentence the bot and its workers say in Slack, in one place."""

from __future__ import annotations

EMPTY_TASK = (
    "Mention me with a task, for example: `@harness read the first line of README.md, then tell me the time`."
)
QUEUED_IN_THREAD = (
    "I'm still on the previous request in this thread; I'll start on this one as soon as it's done."
)
RETRY_BUSY = "Another request is running in this thread. Press Retry again once it has finished."
RETRY_TAKEN = "Someone already pressed Retry on this failure."
RETRY_USER_BUSY = (
    "{{who}} already has {requests} going (running or waiting for approval), so this run "
    "was not retried: it would be one too many. Press Retry again once one of them is done."
)
RETRY_CHANNEL_BUSY = (
    "This channel already has {requests} going (running or waiting for approval), so this "
    "run was not retried. Press Retry again once one of them is done."
)
ANSWER_IN_FILE = "_The answer is longer than a message can hold: the whole of it is in the file below._"
ANSWER_FILE_TITLE = "The whole answer"
FILE_NOT_POSTED = (
    "Slack refused the file \u201c{title}\u201d, so the message above stays cut "
    "(the app may lack the files:write scope: paste manifest.yml again and reinstall it)."
)
RESULTS_IN_FILE = (
    "_Some results are longer than a message can hold: every call in full is in the file below._"
)
RESULTS_FILE_TITLE = "Turn {turn}: every call in full"
FEEDBACK_THANKS = "Thanks: your feedback on this answer is recorded."
FEEDBACK_SAME = "Your feedback on this answer was already recorded. Nothing more was recorded."
FEEDBACK_LIMITED = (
    "You have given feedback {times} in the last minute, so this click was not recorded, nor "
    "will the next ones be this minute. Try again in a minute."
)
FEEDBACK_UNKNOWN = "This answer can no longer take feedback (its run is gone). Nothing was recorded."
NOT_ALLOWED = "Only {who} may decide this approval. Nothing was changed."
NOT_ALLOWED_RETRY = "Only {who} may retry this run. Nothing was changed."
ALREADY_DECIDED = "This approval was already decided. Nothing was changed."
ALREADY_DECIDED_BY = "This approval was already {verdict} by {{who}}. Nothing was changed."
ALREADY_EXPIRED = "This approval has expired. Nothing was changed."
UNKNOWN_APPROVAL = "This approval is no longer open (the run moved on or expired). Nothing was changed."
WRONG_CHANNEL = "This button does not belong to this channel. Nothing was changed."
REFUSED_TO_CONTINUE = ":no_entry: I stopped this run without running anything more: {reason}"
DECISIONS_DO_NOT_MATCH = (
    "the recorded decisions do not match the calls that were waiting for one, so none of them was run"
)
UNREADABLE_RUN = (
    "This run's saved state cannot be read safely (it may come from an older version). Nothing was changed."
)
NEWER_RUN = (
    "A newer version of this app saved this run, and this version cannot read it: the run waits, "
    "untouched, for the newer version. Nothing was recorded; try again once the newer version is running."
)
UNRENDERABLE = "(Turn {turn} happened, but its summary could not be shown.)"
TOO_MANY_RECOVERIES = (
    "Stopped: this run's worker died {times} while running it, so it was not tried again. "
    "Nothing more was run."
)
NOT_A_REQUESTER = (
    "In this channel only {{who}} may start a run (the channel's profile `{profile}` says so). "
    "Nothing was started."
)
NOT_A_REQUESTER_NOW = (
    "In this channel only {{who}} may start or continue a run now (the channel's profile `{profile}` "
    "says so), and this run's requester is not among them. Nothing was changed."
)
# In the edit modal, beside an argument (no mentions render there).
NOT_A_REQUESTER_NOW_SHORT = (
    "This run's requester may no longer start or continue a run in this channel (its profile says "
    "so now), so it cannot be approved. Nothing was changed."
)
THREAD_PROFILE_CHANGED = (
    "This channel's settings changed since this thread's last request: this one runs under {now}, not {was}."
)
PROFILE_NAMED = "profile `{profile}`"
PROFILE_TOP_LEVEL = "the top-level settings"
BUSY_USER = (
    "You already have {requests} going (running or waiting for approval). "
    "This one was not started: mention me again once one of them is done."
)
BUSY_CHANNEL = (
    "This channel already has {requests} going (running or waiting for approval). "
    "This one was not started: mention me again once one of them is done."
)
# Daily budgets ([budgets]): which one is spent, its size, and when it resets.
BUDGET_USER = (
    "the daily budget per person{profile} of {budget:,} tokens (`per_user_daily_tokens`) is spent for "
    "the person who asked this: {spent:,} tokens used today. It resets at 00:00 UTC, in {left}."
)
BUDGET_CHANNEL = (
    "this {where}'s daily budget{profile} of {budget:,} tokens (`per_channel_daily_tokens`) is spent: "
    "{spent:,} tokens used today. It resets at 00:00 UTC, in {left}."
)
BUDGET_HELD = (
    "the daily budget {what} of {budget:,} tokens is held in full by requests in flight that did not "
    "finish in time ({spent:,} tokens used today). It resets at 00:00 UTC, in {left}."
)
BUDGET_PROFILE = " under profile `{profile}`"
BUDGET_SPENT_USER = (
    "You have used your daily budget{profile} of {budget:,} tokens ({spent:,} today), so nothing was "
    "started. It resets at 00:00 UTC, in {left}."
)
BUDGET_SPENT_CHANNEL = (
    "This {where} has used its daily budget{profile} of {budget:,} tokens ({spent:,} today), so nothing "
    "was started. It resets at 00:00 UTC, in {left}."
)
WRONG_TEAM = "This button does not belong to this workspace. Nothing was changed."
NOT_REVIEWABLE = (
    "These arguments are too large to review in Slack, so this call cannot be approved here. "
    "Decline it, or ask for a smaller change. Nothing was changed."
)
APPROVAL_COUNTED = (
    "Your approval counts: {count} of {required} so far. The call runs once enough people approve."
)
STALE_CARD = (
    "This card shows a version of the call that is no longer the one waiting (it changed or was "
    "asked again). Nothing was changed; decide on the current card."
)
NO_SELF_APPROVAL = (
    "You asked for this run, so someone else must approve its calls (four eyes). You may decline it. "
    "Nothing was changed."
)
NO_GRANTS = "Approving for the whole thread is not enabled here. Nothing was changed."
EDIT_SCHEMA_UNUSABLE = "The tool's input schema cannot be used to check an edit, so no edit can be approved."
EDIT_NOT_REVIEWABLE = (
    "⛔ *These arguments are too large to review in Slack*, so the call cannot be approved as it "
    "is. Replace the long ones below with something shorter, or cancel and decline it."
)
EDIT_REPLACE_HINT = (
    "{size} characters, too long to show here. What you type replaces them; left empty, they are "
    "kept, and the call still cannot be approved."
)
EDIT_STILL_NOT_REVIEWABLE = (
    "Still too large to review in Slack: nothing can be approved that nobody could read. "
    "Shorten or replace the long arguments."
)
EDIT_TOO_LONG = "Too long: {size}; at most {limit} allowed."
EDIT_TOO_SHORT = "Too short: {size}; it needs at least {limit}."
EDIT_DENIED = "Denied: {what} ({why}). This edit would never run."
NO_EDIT_WITH_QUORUM = (
    "This call needs several approvals, so it cannot be edited: decline it with a reason instead."
)
NO_SCOPED_GRANT = (
    "This call names no directory a grant could be limited to. Nothing was changed: approve it "
    "on its own, or for the thread."
)
NO_GRANT_ALWAYS_ASKS = (
    "No grant covers this tool: {why}, so a person decides each of its calls. Nothing was "
    "changed: approve this call on its own."
)
# Approvers computed at the click (`[approvals] approvers_from`); {function} is `module:function`.
CHECK_SAID_NO = (
    "Your approval was not recorded: `{function}` says you may not approve this call ({reason}). "
    "Someone else may approve it; you may still decline it. Nothing was changed."
)
CHECK_UNSURE = (
    "Your approval was not recorded: `{function}` could not say whether you may approve this call "
    "({reason}), and only a yes lets an approval through. Nothing was changed."
)
CHECK_EDIT_REFUSED = "Not approved: {function} answered {answer} ({reason})."
CHECK_NO_REASON = "no reason given"
NO_GRANT_WITH_CHECK = (
    "No grant covers this tool: `{function}` decides at each approval who may approve its calls, "
    "and a grant would let later calls run without asking it. Nothing was changed: approve this call "
    "on its own."
)
BATCH_CHECK_REFUSED = "Not approved (the card stays open for someone else): {calls}."
BATCH_CHECK_CALL = "{tool} — `{function}` answered {answer} ({reason})"
CARD_CHECKED = (
    "*Checked at each approval:* `{function}` must answer yes for the person who approves "
    "(no answer in time, or an error, counts as no); no grant covers this tool"
)
DECIDED_CHECKED = "`{function}` answered {answer} for {who}: {reason}"
CARD_ALWAYS_ASKS = (
    "*Every call:* approving approves this call only; no grant or *Approve all* covers this tool"
)
BATCH_ALWAYS_ASKS = "asked on every call: approve it on its own card"
BATCH_LEFT_OPEN = (
    "Left open: {calls} — a person approves each call of these tools on its own card "
    "(Approve all does not cover them)."
)
NO_SUCH_GRANT = (
    "There is no such grant in this thread any more (it expired or was revoked). Nothing was changed."
)
NOT_ALLOWED_REVOKE = (
    "Only {who}, the requester or whoever granted it may revoke this grant. Nothing was changed."
)
ESCALATION = (
    ":bell: {who}: nobody has decided {calls} yet (asked for by {requester}). You may decide it now, "
    "on the card above; it expires {expires}."
)
EXPIRY_REMINDER = (
    ":hourglass: {who}: {calls} (asked for by {requester}) still waits for a decision and expires "
    "{expires}. Decide it on the card above, or extend it."
)
EXTEND_RULE = "Extend keeps it open {duration} longer; it can be extended {left}."
EXTENDED = ":hourglass_flowing_sand: {who} extended this approval: it now expires {expires}."
EXTEND_NOT_ALLOWED = "Only {who} or the requester may extend this approval. Nothing was changed."
EXTEND_EXPIRED = (
    "This approval has already expired or been decided; it cannot be extended. Nothing was changed."
)
EXTEND_TAKEN = "This approval was already extended; it now expires {expires}. Nothing was changed."
EXTEND_MOST = (
    "This approval has been extended {count} already, the most allowed; it expires {expires}. "
    "Nothing was changed."
)
HOME_TITLE = "Waiting on you"
HOME_UPDATED = "Approvals you may decide now, the soonest to expire first. As of {at}."
HOME_EMPTY = "Nothing is waiting on you: there is no open approval you may decide right now."
HOME_MORE = "…and more are waiting on you: decide some of these, then open this tab again."
HOME_OPEN_CARD = "Open the card"
HOME_SUGGESTED_TITLE = "Suggested rules"
HOME_SUGGESTED_INTRO = (
    "Calls people here approved at least {n} times and never declined in the last {days} days. "
    "To stop being asked, add a rule to the config file (then reload):"
)
HOME_SUGGESTED_EFFECT = "Replaying the recorded calls with it: {effect}."
HOME_SUGGESTED_CAPPED = "(only the newest {n} entries of the audit were read)"
HOME_NO_LINK = "(its card's link could not be read: find the card in that channel)"

# Stopping a run (the Stop button, Slack's own stop) and limits that ask (on_limit = "ask").
WORKING = ":hourglass_flowing_sand: Working on it…"
WORKING_WHO = (
    "Stop ends the run before its next model request; a tool already running finishes first. "
    "The person who asked, or anyone who may decide its calls, can press it."
)
WORKING_DONE = ":white_check_mark: Done."
WORKING_DONE_BEFORE_STOP = (
    ":checkered_flag: Finished: the answer came before Stop (pressed by {who}) could take effect."
)
# A run that wrapped up although some of its calls did not run: no "Done", no ✅.
WORKING_FINISHED_NOT_RUN = ":no_entry_sign: Finished — {what}."
WORKING_FINISHED_NOT_RUN_BEFORE_STOP = (
    ":no_entry_sign: Finished before Stop (pressed by {who}) could take effect — {what}."
)
NOT_RUN_DECLINED = "{calls} declined"
NOT_RUN_EXPIRED = "{calls} expired (nobody decided in time)"
NOT_RUN_DENIED = "{calls} denied by the policy"
WORKING_STOPPED = ":octagonal_sign: Stopped."
WORKING_STOPPED_BY = ":octagonal_sign: Stopped by {who}."
WORKING_FAILED = ":warning: Paused: the model API failed (see below)."
STOPPED_BY = (
    ":octagonal_sign: Stopped by {who} with the Stop button, before the next model request. "
    "Calls not yet run were not run."
)
BATCH_HEAD = (
    ":raised_hand: *{count} calls of this turn wait for approval.* Each has its own card above; "
    "*Approve all* or *Decline all* decides every one still open that you may decide, as your own "
    "approval or decline of each."
)
BATCH_RULES = (
    "Asked for by {requester} · Quorum, four eyes and who may decide apply to each call · Expires {expires}"
)
BATCH_DONE = "All {count} calls of this turn are decided: {summary}."
BATCH_CLOSED = "These calls are no longer waiting for a decision (the run moved on). Nothing was changed."
BATCH_NOTHING_OPEN = "Every call of this batch is already decided. Nothing was changed."
BATCH_ALREADY_COUNTED = (
    "Your approval already counts on every call still open here; they run once enough people approve. "
    "Nothing was changed."
)
BATCH_COUNTED = "Your approval counts on {calls}; each runs once enough people approve it."
BATCH_NOT_REVIEWABLE = (
    "Not approved: {calls} — the arguments are too large to review in Slack, so they cannot be "
    "approved here. Decline them, or ask for something smaller."
)
CARD_STOPPED = ":octagonal_sign: Not run: the run was stopped by {who} at {when}."
CARD_CHANGED = (
    ":warning: Approved by {who} at {when}, but what the call would change is no longer what this "
    "card showed (the file changed after it was posted): the approval does not hold, and a new card "
    "shows the change as it is now."
)
LIMIT_CHOICE = "*Continue* gives it {more}. *Stop* ends the run here."
LIMIT_RULES = "Asked for by {requester} · Only {who} may choose · Expires {expires}: then the run stops"
LIMIT_CONTINUED = ":arrow_forward: Continued by {who} at {when}: {more}."
LIMIT_STOPPED = ":octagonal_sign: Stopped by {who} at {when}."
LIMIT_EXPIRED = ":hourglass: Expired at {when}: nobody chose in time, so the run stopped."
STOP_NOT_ALLOWED = "Only {who} may stop this run. Nothing was changed."
STOP_ALREADY = "This run is already being stopped (Stop pressed by {who}). Nothing more to do."
STOP_ALREADY_STOPPED = "This run was already stopped by {who}."
STOP_ENDED = "This run has already ended. Nothing was changed."
STOP_UNKNOWN = "This run is not known here (it may have ended long ago). Nothing was changed."
STOP_NOTHING_RUNNING = "Nothing of mine is running in this thread, so there was nothing to stop."
LIMIT_VOTES = "*Continue:* {count} of {required} needed (so far: {so_far}); one Stop stops the run"
LIMIT_FOUR_EYES = "*Four eyes:* {requester} asked for this run and may stop it, not continue it"
LIMIT_NO_SELF_CONTINUE = (
    "You asked for this run, so someone else must choose Continue (four eyes). You may Stop it. "
    "Nothing was changed."
)
LIMIT_CONTINUE_COUNTED = (
    "Your Continue counts: {count} of {required} so far. The run goes on once enough people choose it."
)
LIMIT_NOT_ALLOWED = "Only {who} may choose to continue or stop this run. Nothing was changed."
LIMIT_NOT_OPEN = "This limit is no longer waiting for an answer. Nothing was changed."
LIMIT_ALREADY = "This limit was already answered ({verdict}) by {{who}}. Nothing was changed."
LIMIT_ALREADY_EXPIRED = "This limit's question has expired; the run stopped. Nothing was changed."
LIMIT_STOP_REASON = "{reason} Stop was chosen at the limit."
LIMIT_EXPIRED_REASON = "{reason} Nobody chose Continue or Stop before the question expired."

# What Slack shows while a run works (workers.thread_status): the assistant thread's status line,
# which Slack shows as "harness <status>"; and what a new thread of the assistant pane suggests.
STATUS_WORKING = "is working on it…"
# A call's task in a streamed message (messages.tasks): plain text, each sentence true from when
# it is said on, as Slack adds a task's new details to what it showed.
TASK_WAITING = "Waiting for approval: see its card below."
TASK_WAITING_INPUT = "Waiting for the requester to answer what {server} asks."
TASK_WAITING_ON = "Waiting on {server}: {message}"
TASK_WAITING_ON_QUIET = "Waiting on {server}, which works on it as a task."
TASK_APPROVED = "Approved."
TASK_APPROVED_EDITED = "Approved with edited arguments."
TASK_GRANT_USED = "Let run by a standing grant."
TASK_DECLINED = "Declined: not run."
TASK_DECLINED_REASON = "Declined: not run. Reason given: {reason}"
TASK_EXPIRED = "Nobody decided in time: not run."
TASK_DENIED = "Denied by the policy: not run."
TASK_STOPPED = "Not run: the run was stopped."
STATUS_WAITING_ON_YOU = "is waiting for approval from you (the card above)"
STATUS_WAITING_FOR = "is waiting for approval from {who}"
STATUS_SOMEONE = "an approver"  # an id Slack could not name, or a user group
STATUS_MORE = "{names} and {more} more"
SUGGESTED_PROMPTS_TITLE = "Try one of these"
SUGGESTED_PROMPTS = (  # Slack shows at most four; manifest.yml lists the same ones
    ("Read a file", "Read the first lines of README.md and tell me what this project is."),
    ("List the folder", "List the files in the workspace and group them by kind."),
    ("Write a note", "Write a short notes.md that summarises README.md."),
    ("What time is it?", "What time is it?"),
)

# Why a call has its tier, said plainly on cards and turn summaries (messages.reasons); the
# config's own words (`policy.rules[2]`, `tool's own tier`) stay in --list-tools and the audit.
TIER_WORD = {"allow": "allowed", "ask": "needs approval", "deny": "denied"}
TIER_BEFORE = {
    "allow": "it was allowed before",
    "ask": "before, it needed approval",
    "deny": "it was denied before",
}
POLICY_OF_PROFILE = "the policy of profile {profile}"
WHY_RULE = "rule {number} of {policy}"
WHY_RULE_FOR = ", for {tool}"
WHY_RULE_MATCHES = "{argument} matches {glob}"
WHY_TOOLS = "the setting for {tool} in {policy}"
WHY_DEFAULT = "the default in {policy}, which has no setting for this tool"
WHY_CLAIM_NOT_TRUSTED = "; server {server} says the tool only reads, but is not trusted to say so"
WHY_CLAIM_TRUSTED = "server {server} says the tool only reads, and is trusted to say so"
WHY_BUILTIN = "the built-in setting for this tool"
WHY_OWN = "the tool's own setting"
WHY_AGAIN = "{why}; the policy changed while it waited: {was}"
WHY_FLOW = (
    "this run read the output of {read}, which may hold what a stranger wrote, and this call sends "
    "data out ({glob} in the policy's flows): a person looks at each such call"
)
WHY_ALWAYS_ASK = "{policy} lists it in always_ask ({glob}): a person approves every call of it"
WHY_SERVER_ALWAYS_ASKS = "server {server} asks a person to approve every call of this tool"
# A counting rule past its limit (`harness.counting`): what its window held, in plain words.
WHY_LIMIT_CALLS = "{seen} of at most {limit} calls of {tool} ran in the last {per} {scope}"
WHY_LIMIT_SUM = (
    "calls of {tool} add up {arg} to {seen} of at most {limit} in the last {per} {scope}, and this "
    "call adds {adds}"
)
WHY_LIMIT_NOT_NUMBER = "it adds up {arg} of calls of {tool}, and this call's {arg} is missing or not a number"
WHY_LIMIT_UNREAD = "it counts calls of {tool} in the last {per} {scope}, and its counter could not be read"
WHY_LIMIT_AGAIN = "{why} (it filled up after the call was asked for: {was})"
LIMIT_SCOPE = {
    "run": "in this run",
    "thread": "in this thread",
    "channel": "in this channel",
    "requester": "for this requester",
    "workspace": "in this workspace",
}
LIMIT_PER = {
    "s": ("second", "seconds"),
    "m": ("minute", "minutes"),
    "h": ("hour", "hours"),
    "d": ("day", "days"),
}
CARD_LIMIT = (
    "*Past a limit:* approving lets this call run, and it is counted; no grant covers calls past a limit"
)
DENIED = "⛔ {what} is denied by the policy (not run)"
NOT_RUN_STOPPED = "⏹️ not run: the run was stopped before it"

# --- a server's question to the requester (bot.listeners.inputs) ---------------------------------
INPUT_NOT_OPEN = "This question is no longer open (the run moved on, or it was answered). Nothing was sent."
INPUT_ONLY_REQUESTER = (
    "Only {who}, who asked for this run, can answer what the tool's server asks. Nothing was sent."
)
INPUT_ALREADY_ANSWERED = "This question was already answered. Nothing more was sent."
INPUT_EXPIRED = "Nobody answered this question in time; the server was told it was cancelled."
INPUT_SECRET = (
    "This question asks for a secret, which is never typed into Slack: the server must ask for it "
    "by a link instead. You can decline it."
)
