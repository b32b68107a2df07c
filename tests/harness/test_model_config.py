"""`[model]`: the operator's system prompt and model name reach the Messages API as configured."""

from __future__ import annotations

from pathlib import Path

from harness.agent import SYSTEM_PROMPT
from harness.client import make_client
from harness.config import load_config
from harness.loop import Agent, step
from harness.state import new_run
from tests.fakes.messages_api import FakeMessagesAPI, reply, text


def first_request(model: FakeMessagesAPI, config_text: str, tmp_path: Path, env: dict[str, str]) -> dict:
    path = tmp_path / "conf" / "harness.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(config_text)
    config = load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path), **env})
    client = make_client(base_url=model.base_url, api_key="sk-test", max_retries=0)
    model.script(reply(text("hi")))
    step(new_run("hello"), Agent.from_config(config, client=client))
    return model.requests[-1]


def test_the_operators_system_prompt_replaces_the_built_in_one(
    model: FakeMessagesAPI, tmp_path: Path
) -> None:
    sent = first_request(model, '[model]\nsystem = "You are Tess, the release bot."\n', tmp_path, {})
    assert [b["text"] for b in sent["system"]] == ["You are Tess, the release bot."]


def test_a_system_file_is_read_relative_to_the_config_file(model: FakeMessagesAPI, tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "prompt.md").write_text("Answer in French.\n")
    sent = first_request(model, '[model]\nsystem_file = "prompt.md"\n', tmp_path, {})
    assert [b["text"] for b in sent["system"]] == ["Answer in French."]


def test_without_one_the_built_in_prompt_is_sent(model: FakeMessagesAPI, tmp_path: Path) -> None:
    sent = first_request(model, "", tmp_path, {})
    assert [b["text"] for b in sent["system"]] == [SYSTEM_PROMPT]


def test_harness_model_wins_over_the_config_name(model: FakeMessagesAPI, tmp_path: Path) -> None:
    assert (
        first_request(model, '[model]\nname = "claude-from-file"\n', tmp_path, {})["model"]
        == "claude-from-file"
    )
    sent = first_request(
        model, '[model]\nname = "claude-from-file"\n', tmp_path, {"HARNESS_MODEL": "claude-env"}
    )
    assert sent["model"] == "claude-env"
