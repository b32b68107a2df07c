"""The tag every message of ours carries (`messages.metadata`), read back from a thread as Slack
returns it: hostile or foreign metadata is never taken for ours, and a stream is the one message of
ours without it."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from messages.metadata import EVENT_TYPE, LIVE_KEY, tag_of, tagged, untagged_streams

OURS = ("UBOT", "BBOT")


def msg(ts: str, user: str = "UBOT", **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"ts": ts, "user": user, **extra}
    if user == "UBOT":
        out["bot_id"] = "BBOT"
    return out


def test_a_tag_reads_back_as_written() -> None:
    assert tag_of({"metadata": tagged("run-1", "3")}) == ("run-1", "3")
    assert tag_of({"metadata": tagged("run-1", LIVE_KEY)}) == ("run-1", "live")


def test_metadata_not_ours_or_malformed_is_no_tag() -> None:
    assert tag_of({}) is None
    assert tag_of({"metadata": {"event_type": "other_app", "event_payload": {"run": "r"}}}) is None
    assert tag_of({"metadata": "harness_message"}) is None
    assert tag_of({"metadata": {"event_type": EVENT_TYPE, "event_payload": ["run", "r"]}}) is None
    assert tag_of({"metadata": {"event_type": EVENT_TYPE}}) is None


def test_only_our_untagged_messages_after_the_ask_are_streams() -> None:
    thread = [
        msg("100.000001", user="UANN"),  # the ask
        msg("100.000002"),  # ours, untagged, but before the ask we start from
        msg("100.000010", metadata=tagged("run-1", "1")),  # a post of ours
        msg("100.000011", user="UANN"),  # a person's reply
        msg("100.000012", user="UEVE", bot_id="BOTHER"),  # another app's message
        msg("100.000013", files=[{"name": "report-1a2b3c4d-2.md"}]),  # a file of ours (its name tells)
        msg("100.000014", metadata={"event_type": "other_app", "event_payload": {}}),  # not our tag
        msg("100.000020"),  # the stream nobody stopped
        {"ts": "100.000021", "bot_id": "BBOT"},  # ours by bot id alone
        {"user": "UBOT"},  # no ts: nothing to act on
    ]
    found = untagged_streams(thread, ours=OURS, after="100.000002")
    assert found == ["100.000014", "100.000020", "100.000021"]


def test_ts_compare_as_numbers_not_as_text() -> None:
    thread = [msg("99.9"), msg("100.5"), msg("1000.000001")]
    assert untagged_streams(thread, ours=OURS, after="100.000001") == ["100.5", "1000.000001"]


def test_no_identity_finds_nothing() -> None:
    assert untagged_streams([msg("200.1"), {"ts": "200.2", "user": ""}], ours=("", ""), after="1.0") == []


@given(st.lists(st.dictionaries(st.sampled_from(["ts", "user", "bot_id", "metadata", "files"]), st.text())))
def test_any_thread_reads_without_error(thread: list[dict[str, Any]]) -> None:
    for ts in untagged_streams(thread, ours=OURS, after="0.0"):
        assert any(m.get("ts") == ts for m in thread)
