"""A hostile MCP server (`tests/fakes/mcp_odd_server.py`, a real process over stdio) against the hub.

What it lists (two tools of one name, names the Messages API refuses), what it claims (every
tool says `readOnlyHint: true`, the destructive one too) and what it answers (huge text, many
and large images, an image repeated in `structuredContent`, audio) must never break a run,
set a tier, or make a request the API would refuse.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from harness.config import Config, load_config
from harness.tools import ToolContext, mcp_bounds
from harness.tools.catalog import Catalog
from harness.tools.mcp import McpHub
from harness.tools.relay import RelayServer
from tests.mcp_support import calls, odd_table
from tests.stack import ROOT

REFUSED_NAMES = ("twin", "l" * 60, "has.dot")


def config_of(tmp_path: Path, toml: str) -> Config:
    path = tmp_path / "harness.toml"
    path.write_text(toml)
    return load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path)})


@pytest.fixture
def log(tmp_path: Path) -> Path:
    """Where the server logs its calls: a directory of its own, which its walls let it write."""
    (tmp_path / "server").mkdir(exist_ok=True)
    return tmp_path / "server" / "calls.jsonl"


@pytest.fixture
def odd(tmp_path: Path, log: Path, caplog: pytest.LogCaptureFixture) -> Iterator[tuple[Catalog, McpHub]]:
    """The hostile server, untrusted (the default), its hub started, and the catalog that offers it."""
    config = config_of(tmp_path, odd_table("odd", log) + "timeout_seconds = 30\n")
    with caplog.at_level(logging.WARNING, logger="harness.mcp"), McpHub(config.resolved_servers({})) as hub:
        yield Catalog.from_config(config, host=hub), hub


def run(catalog: Catalog, name: str, args: dict[str, Any], tmp_path: Path) -> Any:
    return catalog.registry().run(name, args, ToolContext(workspace=tmp_path))


# --- names -------------------------------------------------------------------------------------


def test_two_tools_of_one_name_are_left_out_and_every_other_tool_still_works(
    odd: tuple[Catalog, McpHub], tmp_path: Path, log: Path
) -> None:
    """Today the job's tool list raises DuplicateTool: every run fails, built-in-only ones too."""
    catalog, _ = odd
    registry = catalog.registry()  # raised DuplicateTool before
    names = registry.names()
    assert "odd__twin" not in names
    assert {"odd__echo", "odd__wipe", "get_time", "read_file"} <= set(names)
    assert not run(catalog, "get_time", {}, tmp_path).is_error  # a built-in-only run works
    assert run(catalog, "odd__echo", {"text": "hi"}, tmp_path).content == "hi"
    twin = run(catalog, "odd__twin", {}, tmp_path)
    assert twin.is_error and "no tool" in twin.content.lower()  # never offered, never sent
    assert [c["tool"] for c in calls(log)] == ["echo"]


def test_names_past_64_characters_or_outside_the_apis_pattern_are_left_out(
    odd: tuple[Catalog, McpHub],
) -> None:
    catalog, hub = odd
    listed = [t.qualified for t in hub.listing().tools]
    assert all(len(n) <= 64 for n in listed) and not any("." in n for n in listed)
    assert f"odd__{'l' * 59}"[:64] not in catalog.registry().names()
    assert len("odd__" + "l" * 60) == 65  # one past the API's limit: the old 128 let it through


def test_every_refused_name_is_named_in_one_log_line(
    odd: tuple[Catalog, McpHub], caplog: pytest.LogCaptureFixture
) -> None:
    listed = caplog.get_records("setup") + caplog.records  # the hub lists its tools as it starts
    lines = [r.getMessage() for r in listed if "not offered" in r.getMessage()]
    assert len(lines) == 1, lines
    for name in REFUSED_NAMES:
        assert repr(name) in lines[0]
    assert "2 tools share this name" in lines[0] and "^[a-zA-Z0-9_-]{1,64}$" in lines[0]


# --- annotations are claims ----------------------------------------------------------------------


def tier_and_why(catalog: Catalog, name: str) -> tuple[str, str]:
    found = catalog.registry().get(name)
    assert found is not None, name
    ruling = load_config(env={}).policy.decide(name, {}, found.own_tier, found.own_tier_why)
    return ruling.tier.value, ruling.why


def test_a_read_only_claim_of_an_untrusted_server_sets_no_tier_and_keeps_side_effects(
    odd: tuple[Catalog, McpHub],
) -> None:
    """`wipe` says readOnlyHint: true. Today that makes it allow, and never re-run after a crash."""
    catalog, _ = odd
    tier, why = tier_and_why(catalog, "odd__wipe")
    assert tier == "ask"  # the default: the claim gave nothing
    assert why == "policy.default (readOnlyHint not trusted: trust_annotations is false for server odd)"
    wipe = catalog.registry().get("odd__wipe")
    assert wipe is not None and wipe.side_effects is True  # fail safe: outcome unknown, never re-run
    assert wipe.annotations["readOnlyHint"] is True  # the card still shows what the server claims


def test_a_trusted_servers_read_only_claim_allows(tmp_path: Path, log: Path) -> None:
    config = config_of(tmp_path, odd_table("odd", log, trust=True))
    with McpHub(config.resolved_servers({})) as hub:
        catalog = Catalog.from_config(config, host=hub)
        tier, why = tier_and_why(catalog, "odd__wipe")
        assert (tier, why) == (
            "allow",
            "tool's own tier (MCP readOnlyHint, trusted: trust_annotations = true for server odd)",
        )
        wipe = catalog.registry().get("odd__wipe")
        assert wipe is not None and wipe.side_effects is False


@pytest.mark.e2e
def test_list_tools_says_why_an_untrusted_read_only_claim_is_not_allow(tmp_path: Path, log: Path) -> None:
    config = tmp_path / "harness.toml"
    config.write_text(odd_table("odd", log) + odd_table("trusted", log, trust=True))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "HARNESS_", "SLACK_"))}
    env.update(PYTHONPATH=str(ROOT), HARNESS_CONFIG=str(config), HARNESS_WORKSPACE=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-m", "harness", "--list-tools"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = {line.split("\t")[0]: line.split("\t")[1:] for line in done.stdout.splitlines()}
    assert lines["odd__wipe"] == [
        "ask",
        "policy.default (readOnlyHint not trusted: trust_annotations is false for server odd)",
    ]
    assert lines["trusted__wipe"] == [
        "allow",
        "tool's own tier (MCP readOnlyHint, trusted: trust_annotations = true for server trusted)",
    ]


# --- bounded results -----------------------------------------------------------------------------


def images_of(result: Any) -> list[dict[str, Any]]:
    return [b for b in result.content if b["type"] == "image"] if isinstance(result.content, list) else []


def test_a_60_mb_answer_costs_linear_time_once_and_comes_back_cut(
    odd: tuple[Catalog, McpHub], tmp_path: Path
) -> None:
    """The SDK's stdio reader joined every 64 KB chunk onto the line so far: quadratic, past 30 s."""
    catalog, _ = odd
    cpu = time.process_time()
    answer = run(catalog, "odd__big_text", {"chars": 60_000_000}, tmp_path)
    spent = time.process_time() - cpu
    assert not answer.is_error, answer.content
    assert answer.content.startswith("y" * 20_000) and "60,000,000 characters" in answer.content
    assert len(answer.content) < 20_200
    assert spent < 8.0, f"{spent:.1f} s of CPU for a 60 MB answer"


def test_an_answer_past_the_wire_limit_is_not_read_and_the_session_goes_on(
    odd: tuple[Catalog, McpHub], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog, _ = odd
    monkeypatch.setattr(mcp_bounds, "WIRE_LINE_MAX", 1024 * 1024)
    answer = run(catalog, "odd__big_text", {"chars": 3_000_000}, tmp_path)
    assert answer.is_error and "more than 1 MB" in answer.content and "not read" in answer.content
    assert run(catalog, "odd__echo", {"text": "still up"}, tmp_path).content == "still up"


def test_images_are_capped_in_number_each_size_and_all_together(
    odd: tuple[Catalog, McpHub], tmp_path: Path
) -> None:
    catalog, _ = odd
    many = run(catalog, "odd__images", {"count": 10, "kb": 10}, tmp_path)
    assert len(images_of(many)) == 4
    assert many.text.count("an image was left out") == 6
    huge = run(catalog, "odd__images", {"count": 1, "kb": 4200}, tmp_path)  # 4.3 MB of base64
    assert images_of(huge) == [] and "an image was left out" in huge.text
    big = run(catalog, "odd__images", {"count": 3, "kb": 2500}, tmp_path)  # 2.56 MB each, 7.7 MB in all
    assert len(images_of(big)) == 2 and big.text.count("an image was left out") == 1
    for result in (many, huge, big):
        assert sum(len(i["source"]["data"]) for i in images_of(result)) <= mcp_bounds.IMAGES_TOTAL_BASE64
    # Well inside the API: 5 MB per image, 32 MB per request (several results may share one).
    assert mcp_bounds.IMAGE_MAX_BASE64 < 5 * 1024 * 1024 and mcp_bounds.IMAGES_TOTAL_BASE64 * 4 < 32_000_000


def test_an_image_the_api_would_refuse_is_left_out(odd: tuple[Catalog, McpHub], tmp_path: Path) -> None:
    """A bad image in one result is in every later request of the run: the API refuses them all."""
    catalog, _ = odd
    bad = run(catalog, "odd__bad_image", {}, tmp_path)
    assert images_of(bad) == []
    assert "not base64" in bad.text and "not a image/png" in bad.text


def test_structured_content_repeating_an_image_is_not_sent_twice(
    odd: tuple[Catalog, McpHub], tmp_path: Path
) -> None:
    """read_media_file of server-filesystem: the image, and its base64 again in structuredContent."""
    catalog, _ = odd
    media = run(catalog, "odd__media", {}, tmp_path)
    [image] = images_of(media)
    data = image["source"]["data"]
    assert data not in media.text  # today 20,079 characters of base64 as text for a real picture
    assert "content block 1" in media.text and "image/png" in media.text


def test_audio_is_named_as_an_audio_block(odd: tuple[Catalog, McpHub], tmp_path: Path) -> None:
    catalog, _ = odd
    audio = run(catalog, "odd__audio", {}, tmp_path)
    assert audio.content.startswith("a beep") and "[an audio block was left out" in audio.content


def test_the_relay_carries_the_largest_result_and_refuses_a_longer_line(
    odd: tuple[Catalog, McpHub], tmp_path: Path
) -> None:
    """The relay read lines of up to 64 MB: far past anything a capped result can be."""
    _, hub = odd
    relay = RelayServer(hub).start()
    try:
        client = relay.client()
        largest = client.call("odd", "images", {"count": 4, "kb": 1536}, False)  # 6 MB of base64 in all
        assert len(images_of(largest)) == 4 and "left out" not in largest.text
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(relay.path)
            try:
                sock.sendall(b"x" * (mcp_bounds.RELAY_LINE_MAX + 1) + b"\n")
                answer = sock.recv(100)
            except OSError:  # closed while the line was still being sent
                answer = b""
        assert answer == b""  # not read, not answered
        assert client.call("odd", "echo", {"text": "on"}, False).content == "on"
    finally:
        relay.close()


# --- the stdio reader, fed by hand -------------------------------------------------------------


class Chunks:
    """A byte stream that hands out the given chunks, then ends."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)

    async def receive(self) -> bytes:
        if not self.chunks:
            raise anyio.EndOfStream
        return self.chunks.pop(0)


def read_all(*chunks: bytes) -> list[str]:
    async def drain() -> list[str]:
        return [text async for text in mcp_bounds.WholeLines(Chunks(*chunks))]

    return anyio.run(drain)


def test_the_reader_hands_out_whole_lines_however_the_bytes_arrive() -> None:
    snow = "☃".encode()
    got = read_all(b'{"a": 1}\n{"b"', b': 2}\n{"c": "' + snow[:1], snow[1:] + b'"}\n', b"tail without end")
    assert got == ['{"a": 1}\n', '{"b": 2}\n', '{"c": "☃"}\n']
    assert all(text.endswith("\n") for text in got)


def test_a_line_past_the_limit_answers_its_request_with_an_error_wherever_its_id_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mcp_bounds, "WIRE_LINE_MAX", 1000)
    body = b'"result": {"content": [{"type": "text", "text": "' + b"z" * 5000 + b'"}]}'
    python_sdk = b'{"jsonrpc": "2.0", "id": 7, ' + body + b"}\n"
    typescript_sdk = b"{" + body + b',"jsonrpc":"2.0","id":"req-8"}\n'
    after = b'{"jsonrpc": "2.0", "id": 9, "result": {}}\n'
    got = read_all(python_sdk[:700], python_sdk[700:3000], python_sdk[3000:] + typescript_sdk + after)
    answers = [json.loads(line) for text in got for line in text.splitlines()]
    assert [a["id"] for a in answers] == [7, "req-8", 9]
    assert "more than 1,000 bytes in one message" in answers[0]["error"]["message"]
    assert all("not read" in a["error"]["message"] for a in answers[:2]) and answers[2]["result"] == {}


def test_a_line_past_the_limit_with_no_id_to_be_found_ends_the_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mcp_bounds, "WIRE_LINE_MAX", 1000)
    notification = b'{"jsonrpc": "2.0", "method": "x", "params": "' + b"q" * 3000 + b'"}\n'
    assert read_all(notification, b'{"id": 1}\n') == []  # the session closes, and opens again
