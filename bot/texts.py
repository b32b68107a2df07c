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
UNRENDERABLE = "(Turn {turn} happened, but its summary could not be shown.)"
TOO_MANY_RECOVERIES = (
    "Stopped: this run's worker died {times} times while running it, so it was not tried again. "
    "Nothing more was run."
)
BUSY_USER = (
    "You already have {limit} requests going (running or waiting for approval). "
    "This one was not started: mention me again once one of them is done."
)
BUSY_CHANNEL = (
    "This channel already has {limit} requests going (running or waiting for approval). "
    "This one was not started: mention me again once one of them is done."
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
NO_EDIT_WITH_QUORUM = (
    "This call needs several approvals, so it cannot be edited: decline it with a reason instead."
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
HOME_TITLE = "Waiting on you"
HOME_UPDATED = "Approvals you may decide now, the soonest to expire first. As of {at}."
HOME_EMPTY = "Nothing is waiting on you: there is no open approval you may decide right now."
HOME_MORE = "…and more are waiting on you: decide some of these, then open this tab again."
HOME_OPEN_CARD = "Open the card"
HOME_NO_LINK = "(its card's link could not be read: find the card in that channel)"
