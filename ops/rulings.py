"""The audit entry of one call's tier decision: everything `python -m workers replay` needs to rule
the call again under another config, and nothing more.

One entry per `tool_use` block of a reply, written when the reply's calls are ruled (calls answered
at once, an unknown tool or input the schema refuses, included). It holds where and for whom the
call was made, the tool and where it came from, its own tier, the tier the policy gave and why, the
call's fingerprint and the hash of its arguments, which of them hold paths (`path_args`), and the
arguments themselves, bounded: a string value longer than `ARG_CHARS` keeps its start, and its key
is listed in `cut`, so that replay can say a rule over it is uncertain. The arguments are what the
model sent: no secret of the process is ever in them unless the model wrote it there.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from harness.state import PendingCall
from harness.tools.base import Tool
from store.records import RunRecord

RULED = "ruled"  # the `event` of a tier decision's entry
ARG_CHARS = 2048  # characters kept of one top-level string argument (its start)
INPUT_CHARS = 16_384  # characters of JSON kept of all arguments together
KEY_CHARS = 128  # an argument's name longer than this is not kept (no rule can name it usefully)
CUT_KEYS = 32  # names of cut arguments listed; more are counted in `cut_more`
TEXT_CHARS = 1000  # a tool name, a why: text that came from the model or the config


def ruling_entry(
    record: RunRecord, call: PendingCall, found: Tool | None, source: str, *, now: float | None = None
) -> dict[str, Any]:
    """The audit entry of `call` as just ruled in `record`'s run; `found` is the tool it names
    (None: not offered), `source` where that tool comes from (`Catalog.source`)."""
    text = json.dumps(call.input, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    kept, cut = bounded_input(call.input)
    entry: dict[str, Any] = {
        "event": RULED,
        "at": time.time() if now is None else now,
        "run_id": record.run_id,
        "call_id": call.id,
        "team": record.team,
        "channel": record.channel,
        "thread_ts": record.thread_ts,
        "requester": record.requester,
        "profile": record.profile,
        "tool": call.name[:TEXT_CHARS],
        "source": source,
        "own_tier": found.own_tier.value if found is not None and found.own_tier else None,
        "own_why": (found.own_tier_why if found is not None else "")[:TEXT_CHARS],
        "tier": call.tier.value,
        "why": call.why[:TEXT_CHARS],
        "fingerprint": call.fingerprint,
        "input_sha256": hashlib.sha256(text.encode("utf-8", "replace")).hexdigest(),
        "input_chars": len(text),
        "input": kept,
    }
    if found is not None:
        # Which arguments hold paths: a suggested rule must constrain every one (the Home tab's
        # bot knows no tool schema).
        entry["path_args"] = found.path_args.to_json()
    if cut:
        entry["cut"] = cut[:CUT_KEYS]
        if len(cut) > CUT_KEYS:
            entry["cut_more"] = len(cut) - CUT_KEYS
    if found is not None and source.startswith("mcp:"):
        # Whether the server claims the tool read-only: under a draft that trusts (or stops
        # trusting) its annotations, the tool's own tier changes.
        hints = found.annotations
        entry["claims_read_only"] = (
            hints.get("readOnlyHint") is True and hints.get("destructiveHint") is not True
        )
        if found.always_ask_why:  # its server asks a person for every call (`_meta`): any draft asks too
            entry["requires_interaction"] = True
    if call.result is not None:
        entry["answered"] = "not_offered" if found is None else "error"  # at once, never asked about
    return entry


def bounded_input(raw: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """`raw` (a call's arguments) kept within bounds, and the names of the arguments not kept whole.

    A string value is cut to its first `ARG_CHARS` characters; any other value is kept whole or,
    past `ARG_CHARS` of JSON, left out; once `INPUT_CHARS` are used, the rest are left out. A name
    past `KEY_CHARS` is left out, and listed cut to that length.
    """
    if not isinstance(raw, dict):
        return None, []
    kept: dict[str, Any] = {}
    cut: list[str] = []
    used = 2
    for key, value in raw.items():
        name = str(key)
        if len(name) > KEY_CHARS:
            cut.append(name[:KEY_CHARS])
            continue
        whole = True
        if isinstance(value, str) and len(value) > ARG_CHARS:
            value, whole = value[:ARG_CHARS], False
        size = len(json.dumps({name: value}, ensure_ascii=False))
        if (not isinstance(value, str) and size > ARG_CHARS + len(name) + 4) or used + size > INPUT_CHARS:
            cut.append(name)
            continue
        kept[name] = value
        used += size
        if not whole:
            cut.append(name)
    return kept, cut
