"""What Slack shows of a run while it works, waits for a person, and ends.

Three ways, the first that works for the run:

1. The agent session of the thread (`agents.sessions.setStatus`): `processing` (Slack adds its own
   stop button, which sends `agent_session_stopped`), `suspended` while the run waits for a
   decision, `closed` when it ends. Only an app set up as an agent may call it.
2. In a direct message (the assistant pane's threads are DM threads), the assistant thread's status
   line (`assistant.threads.setStatus`, shown as "harness is working on it…"). Slack clears it
   whenever the app posts in the thread, and after two minutes without a post, so it is set again
   after the posts that go out beside every step; an empty status clears it.
3. The :eyes: reaction the bot adds to every message that starts a run, whatever happens here.

Every call is a courtesy: a refusal never fails a run. A method Slack refuses (an app that is no
agent, a missing scope, a thread that is no assistant thread) is remembered in the run's record
and not called again for that run; a rate limit or an outage only skips this one change.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from enum import StrEnum

from slack_sdk.errors import SlackApiError

from messages import texts
from messages.text import cut, visible
from store import IM, RunRecord
from workers.services import Services

log = logging.getLogger(__name__)

SESSION = "agents.sessions.setStatus"
ASSISTANT = "assistant.threads.setStatus"
REFUSED = "refused"
ASSISTANT_POSTED = "assistant.posted"  # RunRecord.posted when the line was set: a post since clears it
TITLE_CHARS = 200  # Slack's limit for an agent session's title
NAMED = 3  # approvers named in the status line while a run waits; the rest are counted
NAME_CHARS = 40
_names: dict[str, str] = {}  # user id -> the name the status line shows (per process)


class Phase(StrEnum):
    """Where the run is in its life, named as Slack names the agent session's status."""

    WORKING = "processing"
    WAITING = "suspended"
    ENDED = "closed"


def show(svc: Services, record: RunRecord, phase: Phase) -> RunRecord:
    """Show `phase` of the run in Slack, as far as Slack lets it; `record` with what was learned.

    The first method not refused for this run is the one in charge; the next is tried only once
    Slack has refused the one before it. A call that would change nothing is not made.
    """
    shown = dict(record.status_shown)
    for method in (SESSION, ASSISTANT) if record.surface == IM else (SESSION,):
        if shown.get(method) == REFUSED:
            continue
        wanted = phase.value if method == SESSION else _assistant_text(svc, record, phase)
        if not _changes_anything(record, shown, method, wanted):
            break
        outcome = _call(svc, method, record, wanted)
        if outcome is not None:
            shown[method] = outcome
            if method == ASSISTANT:
                shown[ASSISTANT_POSTED] = str(record.posted)
        if outcome != REFUSED:
            break
    return replace(record, status_shown=shown)


def _changes_anything(record: RunRecord, shown: dict[str, str], method: str, wanted: str) -> bool:
    """Whether setting `wanted` would change what Slack shows now."""
    last = shown.get(method)
    if wanted in ("", Phase.ENDED.value):
        return last not in (None, "", Phase.ENDED.value)  # nothing opened is closed, nothing cleared twice
    if method == ASSISTANT and shown.get(ASSISTANT_POSTED) != str(record.posted):
        return True  # a post since it was set has cleared it
    return last != wanted


def _call(svc: Services, method: str, record: RunRecord, wanted: str) -> str | None:
    """Set `wanted` with `method`: what it now shows, REFUSED, or None when Slack could not say."""
    client = svc.courtesy_slack
    try:
        if method == SESSION:
            client.agents_sessions_setStatus(
                channel_id=record.channel,
                thread_ts=record.thread_ts,
                status=wanted,
                title=_title(record.task),  # used when this call creates the session
                initiator_user_id=record.requester,
            )
        else:
            client.assistant_threads_setStatus(
                channel_id=record.channel, thread_ts=record.thread_ts, status=wanted
            )
        return wanted
    except SlackApiError as exc:
        error = exc.response.get("error")
        if exc.response.status_code == 429 or exc.response.status_code >= 500:
            log.info("run %s: %s skipped for now (%s)", record.run_id, method, error)
            return None
        log.info("run %s: Slack refused %s (%s); not called again for this run", record.run_id, method, error)
        return REFUSED
    except OSError as exc:  # Slack could not be reached: try again at the next change
        log.info("run %s: %s skipped for now (%s)", record.run_id, method, exc)
        return None


def _assistant_text(svc: Services, record: RunRecord, phase: Phase) -> str:
    if phase is Phase.WORKING:
        return texts.STATUS_WORKING
    if phase is Phase.ENDED:
        return ""  # clears it
    approvers = svc.settings_of(record).approvals.approvers
    if not approvers:
        return texts.STATUS_WAITING_ON_YOU
    names = list(dict.fromkeys(_name(svc, who) for who in approvers[:NAMED]))
    who = ", ".join(names)
    if len(approvers) > NAMED:
        who = texts.STATUS_MORE.format(names=who, more=len(approvers) - NAMED)
    return texts.STATUS_WAITING_FOR.format(who=who)


def _name(svc: Services, who: str) -> str:
    """A person as the status line names them (it is plain text: a mention would show as its id).

    `users.info` once per person and process; a user group, or a person Slack cannot name, is
    "an approver". Names are people's own words: shown visible and cut.
    """
    if not who.startswith(("U", "W")):
        return texts.STATUS_SOMEONE
    if who not in _names:
        try:
            profile = svc.courtesy_slack.users_info(user=who)["user"]
            name = profile.get("profile", {}).get("display_name") or profile.get("real_name") or ""
        except (SlackApiError, OSError, KeyError, TypeError):
            return texts.STATUS_SOMEONE  # not remembered: asked again next time
        if len(_names) > 1000:
            _names.clear()
        _names[who] = cut(" ".join(visible(str(name)).split()), NAME_CHARS) or texts.STATUS_SOMEONE
    return _names[who]


def _title(task: str) -> str:
    """The session's title: the task as asked, without the leading mention of the bot."""
    words = task.split()
    while words and words[0].startswith("<@") and words[0].endswith(">"):
        words.pop(0)
    return " ".join(words)[:TITLE_CHARS] or "harness"
