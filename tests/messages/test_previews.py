"""Previews on approval cards: a diff cut to fit the card, whole behind "View all arguments"."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from harness.policy import Tier
from harness.state import PendingCall
from harness.tools import BUILTIN_TOOLS, ToolContext
from messages.blocks import Message
from messages.cards import CallCard, approval_card
from messages.modals import arguments_modal
from tests.fakes.slack_api import validate_blocks

CALL = PendingCall("toolu_1", "write_file", {"path": "notes.txt", "content": "new"}, Tier.ASK)
AT = datetime(2026, 12, 3, tzinfo=UTC)


def card(preview: str) -> Message:
    return approval_card(
        CallCard(
            run_id="0" * 32,
            call=CALL,
            requester="UA",
            tier_source="x",
            approvers=[],
            expires_at=AT,
            preview=preview,
        )
    )


def texts_of(blocks: list[dict]) -> str:
    return "\n".join(str(b.get("text", {}).get("text", "")) for b in blocks)


def test_a_long_diff_is_cut_on_the_card_and_whole_in_the_view_all_modal() -> None:
    diff = "\n".join(f"-old line {i}\n+new line {i}" for i in range(1500))
    msg = card(diff)
    assert validate_blocks(msg.blocks) == []
    assert "+new line 0" in texts_of(msg.blocks) and "+new line 1499" not in texts_of(msg.blocks)
    buttons = [e["action_id"] for b in msg.blocks if b["type"] == "actions" for e in b["elements"]]
    assert "view_args" in buttons  # the rest of the change is one click away
    modal = arguments_modal(call=CALL, preview=diff)
    assert validate_blocks(modal["blocks"]) == []
    shown = texts_of(modal["blocks"]).replace("```\n", "").replace("\n```", "")
    assert "+new line 1499" in shown and "-old line 0" in shown


def test_a_short_diff_needs_no_view_all_button() -> None:
    msg = card("-a\n+b")
    buttons = [e["action_id"] for b in msg.blocks if b["type"] == "actions" for e in b["elements"]]
    assert "view_args" not in buttons and "+b" in texts_of(msg.blocks)


def test_write_file_previews_a_unified_diff_of_an_existing_file(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("one\ntwo\n")
    write = next(t for t in BUILTIN_TOOLS if t.name == "write_file")
    assert write.preview is not None
    diff = write.preview(ToolContext(workspace=tmp_path), {"path": "notes.txt", "content": "one\nTWO\n"})
    assert diff is not None and "-two" in diff and "+TWO" in diff and "a/notes.txt" in diff
    new = write.preview(ToolContext(workspace=tmp_path), {"path": "fresh.txt", "content": "x"})
    assert new is not None and "new file" in new
    assert (tmp_path / "notes.txt").read_text() == "one\ntwo\n"  # a preview changes nothing


def test_delete_file_previews_what_it_removes_and_never_follows_a_link(tmp_path: Path) -> None:
    delete = next(t for t in BUILTIN_TOOLS if t.name == "delete_file")
    assert delete.preview is not None
    ctx = ToolContext(workspace=tmp_path)
    (tmp_path / "long.txt").write_text("".join(f"line {i}\n" for i in range(100)))
    shown = delete.preview(ctx, {"path": "long.txt"})
    assert shown is not None and shown.startswith("(removes long.txt: 100 lines, 790 bytes)")
    assert "-line 0" in shown and "-line 39" in shown and "-line 40" not in shown
    assert shown.endswith("(and 60 more lines)")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01" * 10)
    assert (
        delete.preview(ctx, {"path": "blob.bin"})
        == "(removes blob.bin: 20 bytes, too big or not text to show)"
    )
    outside = tmp_path.parent / "outside-secret.txt"
    outside.write_text("secret")
    (tmp_path / "link.txt").symlink_to(outside)
    assert delete.preview(ctx, {"path": "link.txt"}) is None  # the call itself refuses the link
    assert delete.preview(ctx, {"path": "../outside-secret.txt"}) is None
    assert delete.preview(ctx, {"path": "missing.txt"}) is None
    assert (tmp_path / "long.txt").exists()  # a preview changes nothing
