"""The playground in a real browser: `make run` as a user starts it, driven in headless Chromium.

Debian's `chromium` driven by Playwright for Python through `executable_path` (Playwright's own
browser download cannot work on a machine without the internet). Without either the tests skip,
saying why; `.ci/run` installs the browser when it may.

The screenshots in the README come from here: with ``PLAYGROUND_SCREENSHOTS=DIR`` (``make
screenshots``) the tests save them into DIR as well as into their own temporary folder.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from slack_sdk import WebClient

from launch.modes import PLAYGROUND_CONFIG
from playground.slack import CHANNEL_ID, OPS_CHANNEL_ID, TEAM_ID
from tests.mcp_support import require_bwrap
from tests.playground_support import (
    ALICE,
    BOB,
    CAROL,
    Page,
    Running,
    playground,
    playground_env,
    runs_started_by,
    stand_in,
)
from tests.stack import free_port, wait_until

pytestmark = pytest.mark.e2e

CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-background-networking",  # no calls home on a machine without the internet
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TIMEOUT_MS = 60_000


def _browser_or_skip() -> Any:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip(
            "browser tests skipped: Playwright for Python is not installed (pip install -e '.[test]')"
        )
    if CHROMIUM is None:
        pytest.skip(
            "browser tests skipped: no Chromium on PATH; install Debian's `chromium` "
            "(.ci/run does when it runs as root) or set CHROMIUM to a Chromium binary"
        )
    return sync_playwright


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_playwright = _browser_or_skip()
    from playwright.sync_api import expect

    # expect()'s own default is 5 s, which a loaded CI machine can pass while a process starts:
    # every expectation here waits as long as any other step, and passes as soon as it holds.
    expect.set_options(timeout=TIMEOUT_MS)
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("browser-workspace")


@pytest.fixture(scope="module")
def redis_db(redis_server: Any) -> str:
    return str(redis_server.url.rsplit("/", 1)[0] + "/15")


@pytest.fixture(scope="module")
def running(browser: Any, redis_db: str, workspace: Path) -> Iterator[Running]:
    """The README's run command, `make run`, with no Slack settings and no API key."""
    with playground(redis_db, workspace, make=True) as started:
        yield started


@contextmanager
def opened(browser: Any, url: str) -> Iterator[Any]:
    """A fresh page on `url`; fails the test on any console error or page error."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(url)
    yield page
    context.close()
    assert problems == [], problems


@pytest.fixture
def tab(browser: Any, running: Running) -> Iterator[Any]:
    """A fresh page on the playground."""
    with opened(browser, running.url) as page:
        yield page


def shoot(tab: Any, name: str, tmp_path: Path) -> None:
    tab.screenshot(path=str(tmp_path / name))
    folder = os.environ.get("PLAYGROUND_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / name, Path(folder) / name)


def mention(tab: Any, text: str) -> Any:
    """Type a mention in the composer and send it; the thread's parent message, once shown."""
    tab.fill("#composer", text)
    tab.press("#composer", "Enter")
    # The top-level message, not a reply that quotes the task (a card, a summary).
    parent = tab.locator('#messages .message[data-thread-ts=""]', has_text=text).last
    parent.wait_for()
    return parent


def as_user(tab: Any, user: str) -> None:
    tab.select_option("#user", user)


def test_a_first_approval_in_the_browser(tab: Any, running: Running, workspace: Path, tmp_path: Path) -> None:
    expect = pytest.importorskip("playwright.sync_api").expect
    expect(tab.locator("#model-banner")).to_contain_text("Offline demo model")
    as_user(tab, ALICE)
    mention(tab, "write a note about today's plan")

    turn = tab.locator("#messages [data-ts]", has_text="Turn 1").first
    expect(turn).to_contain_text("get_time")
    expect(turn).to_contain_text("list_files")
    approve = tab.locator("button[data-action-id=approve]").last
    approve.wait_for()
    assert approve.inner_text().strip() == "Approve"  # the Block Kit button's own text
    assert not (workspace / "notes.md").exists()
    shoot(tab, "playground-approval.png", tmp_path)

    approve.click()
    expect(tab.get_by_text("Approved by").first).to_be_visible()
    footer = tab.get_by_text("That took 3 turns of tool calls across 4 model requests.")
    expect(footer.first).to_be_visible()
    expect(tab.get_by_text("offline demo model").last).to_be_visible()
    assert "today's plan" in (workspace / "notes.md").read_text()
    shoot(tab, "playground-answer.png", tmp_path)

    tab.locator("button[data-feedback=good]").last.click()  # Slack's thumbs under the answer
    expect(tab.get_by_text("your feedback on this answer is recorded").first).to_be_visible()


def test_decline_with_a_reason_in_the_modal(tab: Any, workspace: Path, tmp_path: Path) -> None:
    expect = pytest.importorskip("playwright.sync_api").expect
    before = sorted(p.name for p in workspace.iterdir())
    as_user(tab, ALICE)
    mention(tab, "write a note for the retro")
    tab.locator("button[data-action-id=decline_with_reason]").last.click()
    modal = tab.locator("#modal")
    expect(modal).to_be_visible()
    modal.locator("textarea, input[type=text]").first.fill("we agreed to keep notes elsewhere")
    shoot(tab, "playground-decline-modal.png", tmp_path)
    tab.click("#modal-submit")
    expect(modal).to_be_hidden()

    expect(tab.get_by_text("Declined").first).to_be_visible()
    answer = tab.get_by_text("I did not write").last
    expect(answer).to_be_visible()
    expect(tab.get_by_text("we agreed to keep notes elsewhere").last).to_be_visible()
    assert sorted(p.name for p in workspace.iterdir()) == before


def test_someone_not_allowed_gets_a_reply_only_they_see(tab: Any, running: Running) -> None:
    expect = pytest.importorskip("playwright.sync_api").expect
    as_user(tab, ALICE)
    parent = mention(tab, "write a note about lunch")
    ts = parent.get_attribute("data-ts")
    tab.locator("button[data-action-id=approve]").last.wait_for()
    as_user(tab, CAROL)
    tab.locator("button[data-action-id=approve]").last.click()
    refused = tab.locator(".ephemeral", has_text="may decide this approval")
    expect(refused.first).to_be_visible()
    expect(refused.first).to_contain_text("Only visible to you")
    as_user(tab, ALICE)
    expect(refused).to_have_count(0)
    tab.locator("button[data-action-id=decline]").last.click()  # tidy: the run ends
    Page(running.url).wait_text(str(ts), "That took")


def test_model_and_user_text_is_shown_never_run(tab: Any, running: Running) -> None:
    expect = pytest.importorskip("playwright.sync_api").expect
    as_user(tab, ALICE)
    payload = 'loop <img src=x onerror="window.pwned=1"> <script>window.pwned=2</script> <b>bold?</b>'
    mention(tab, payload)
    expect(tab.get_by_text("for no progress").first).to_be_visible()
    assert tab.evaluate("window.pwned") is None
    assert tab.locator("#messages img[src=x], #messages script").count() == 0
    assert tab.locator("#messages b, #messages strong", has_text="bold?").count() == 0
    expect(tab.get_by_text('<img src=x onerror="window.pwned=1">').first).to_be_visible()


def test_a_report_too_long_for_a_message_opens_whole_from_its_file(tab: Any) -> None:
    expect = pytest.importorskip("playwright.sync_api").expect
    as_user(tab, ALICE)
    mention(tab, "write a long report on the folder")
    expect(tab.get_by_text("the whole table is in the file below").first).to_be_visible()
    file = tab.locator("details.file", has_text="The whole answer").last
    expect(file).to_be_visible()
    file.locator("summary").click()
    expect(file.locator("pre")).to_contain_text("All 400 checks passed.")


def test_open_the_card_on_the_home_tab_shows_the_card_in_the_channel(tab: Any, running: Running) -> None:
    """A permalink into the channel scrolls to its message and flashes it, in this tab, not a new one."""
    expect = pytest.importorskip("playwright.sync_api").expect
    as_user(tab, ALICE)
    parent = mention(tab, "write a note about the home tab")
    tab.locator("button[data-action-id=approve]").last.wait_for()
    tab.click("#nav-home")
    link = tab.locator("#home a.link", has_text="Open the card").first
    href = link.get_attribute("href") or ""
    permalink = re.search(r"/p(\d{10})(\d{6})", href)
    assert permalink, href
    seconds, fraction = permalink.groups()
    link.click()

    expect(tab.locator("#channel-pane")).to_be_visible()
    expect(tab.locator("#home-pane")).to_be_hidden()
    flashed = tab.locator(f'#messages .message.flash[data-ts="{seconds}.{fraction}"]')
    expect(flashed).to_contain_text("Approval needed")
    assert len(tab.context.pages) == 1  # no new tab
    tab.locator("button[data-action-id=decline]").last.click()  # tidy: the run ends
    Page(running.url).wait_text(str(parent.get_attribute("data-ts")), "That took")
    expect(tab.locator("#messages")).to_contain_text("That took")  # the channel was drawn again ...
    expect(flashed).to_contain_text("Declined")  # ... and the linked message keeps its mark


def in_channel(tab: Any, channel: str) -> None:
    tab.click(f'#nav-channels [data-channel="{channel}"]')


def test_ops_has_its_own_profile_tools_and_requesters(
    tab: Any, redis_db: str, workspace: Path, tmp_path: Path
) -> None:
    """Switching channel switches profile: the label, the tools offered, who may ask, what asks."""
    expect = pytest.importorskip("playwright.sync_api").expect
    in_channel(tab, CHANNEL_ID)
    expect(tab.locator("#profile-name")).to_have_text("profile: playground")
    expect(tab.locator("#profile-tools [data-tool=write_file]")).to_have_text("write_file · ask")
    expect(tab.locator("#profile-tools [data-tool=delete_file]")).to_have_count(0)

    in_channel(tab, OPS_CHANNEL_ID)
    expect(tab.locator("#channel-name")).to_have_text("ops")
    expect(tab.locator("#profile-header")).to_have_text(
        "# profile: ops (channel C0OPS is in profiles[ops].channels)"
    )
    expect(tab.locator("#profile-tools [data-tool=delete_file]")).to_have_text("delete_file · ask")
    expect(tab.locator("#profile-tools [data-tool=write_file]")).to_have_text("write_file · allow")
    expect(tab.locator("#profile-rules")).to_contain_text("tokens for the channel per day")
    expect(tab.locator("#composer")).to_have_attribute("placeholder", re.compile(r"^Message #ops "))

    as_user(tab, BOB)  # on call: may ask in #ops, where writes run without a card
    parent = mention(tab, "write a note about the ops handover")
    ops_thread = str(parent.get_attribute("data-ts"))
    answer = tab.locator(f'#messages .thread[data-thread="{ops_thread}"]', has_text="That took 3 turns")
    expect(answer).to_be_visible()
    assert answer.locator("button[data-action-id=approve]").count() == 0
    assert "ops handover" in (workspace / "notes.md").read_text()

    as_user(tab, CAROL)
    expect(tab.locator(f"#user option[value={CAROL}]")).to_contain_text("may not ask here")
    parent = mention(tab, "delete a file")
    refused = tab.locator(".ephemeral", has_text="may start a run")
    expect(refused).to_be_visible()
    expect(refused).to_contain_text("@oncall")  # the group by its handle, as Slack names it
    expect(refused).to_contain_text("Only visible to you")
    shoot(tab, "playground-ops-refused.png", tmp_path)
    assert runs_started_by(redis_db, str(parent.get_attribute("data-ts"))) == []  # nothing started

    in_channel(tab, CHANNEL_ID)  # #playground shows none of #ops
    expect(tab.locator("#profile-name")).to_have_text("profile: playground")
    expect(tab.locator("#messages .message", has_text="ops handover")).to_have_count(0)
    expect(tab.locator(".ephemeral", has_text="may start a run")).to_have_count(0)


def test_a_stream_grows_with_its_tasks_then_settles_with_the_tasks_above_its_blocks(
    browser: Any, tmp_path: Path
) -> None:
    """What the worker's streamed reply looks like: text growing, tasks ticking, then settled blocks."""
    expect = pytest.importorskip("playwright.sync_api").expect
    token = "xoxb-browser-stream"
    with stand_in(token) as server, opened(browser, server.playground.base_url) as tab:
        bot = WebClient(token=token, base_url=server.playground.base_url + "api/")
        ts = server.playground.workspace.post_as(ALICE, "tidy the folder", None)["ts"]
        opened_stream = bot.chat_startStream(
            channel=CHANNEL_ID,
            thread_ts=ts,
            recipient_team_id=TEAM_ID,
            recipient_user_id=ALICE,
            markdown_text="Looking",
            chunks=[{"type": "task_update", "id": "t1", "title": "List the files", "status": "pending"}],
        )
        stream = {"channel": CHANNEL_ID, "ts": opened_stream["ts"]}
        message = tab.locator(f'#messages .message[data-ts="{opened_stream["ts"]}"]')
        first = message.locator(".task[data-task-id=t1]")
        expect(message).to_have_class(re.compile(r"\bstreaming\b"))
        expect(first.locator(".task-mark")).to_have_text("○")
        expect(first.locator(".task-title")).to_have_text("List the files")

        bot.chat_appendStream(**stream, markdown_text=" at the folder")
        expect(message.locator(".mrkdwn")).to_have_text("Looking at the folder")  # the text grows
        bot.chat_appendStream(
            **stream,
            chunks=[
                {"type": "task_update", "id": "t1", "title": "Listing the files", "status": "in_progress"},
                {"type": "task_update", "id": "t2", "title": "Delete notes.md", "status": "pending"},
            ],
        )
        expect(first.locator(".task-mark")).to_have_text("◌")
        expect(first.locator(".task-mark")).to_have_attribute("aria-label", "in progress")
        expect(message.locator(".task .task-title")).to_have_text(["Listing the files", "Delete notes.md"])
        shoot(tab, "playground-streaming.png", tmp_path)

        bot.chat_stopStream(
            **stream,
            chunks=[
                {"type": "task_update", "id": "t1", "title": "List the files", "status": "complete"},
                {
                    "type": "task_update",
                    "id": "t2",
                    "title": "Delete notes.md",
                    "status": "error",
                    "output": "declined",
                },
            ],
        )
        expect(message).not_to_have_class(re.compile(r"\bstreaming\b"))
        expect(message.locator(".task .task-mark")).to_have_text(["✓", "✗"])
        expect(message.locator(".task[data-task-id=t2] .task-output")).to_have_text("declined")

        blocks = [
            {"type": "section", "text": {"type": "mrkdwn", "text": "*Settled:* one file listed"}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": "That took 1 turn"}]},
        ]
        bot.chat_update(**stream, text="Settled: one file listed", blocks=blocks)
        expect(message).to_contain_text("That took 1 turn")
        expect(message.locator(".task .task-mark")).to_have_text(["✓", "✗"])  # the tasks stay …
        above = message.evaluate(
            "m => !!(m.querySelector('.stream-tasks').compareDocumentPosition("
            "m.querySelector('.blocks')) & Node.DOCUMENT_POSITION_FOLLOWING)"
        )
        assert above  # … above the settled blocks
        assert message.locator(".edited").count() == 0  # settling a stream is no edit


def test_a_persons_mentions_and_links_show_as_slack_shows_them_and_the_bots_quote_of_them_stays_inert(
    tab: Any, running: Running
) -> None:
    """The composer stores what a person types as Slack's client does (a typed @channel is
    `<!channel>`, a pasted URL `<url>`, a literal < > & escaped, markup a person writes kept), and a
    person's message shows its mentions and links as Slack does; the bot quoting them stays inert."""
    expect = pytest.importorskip("playwright.sync_api").expect
    as_user(tab, ALICE)
    typed = (
        "write a note for @channel and <!here> about <http://example.com/plan|the plan>, "
        "https://example.org/a?b=1&c=2. a < b & c > d <javascript:alert(1)|x> `@everyone <x>`"
    )
    tab.fill("#composer", typed)
    tab.press("#composer", "Enter")
    parent = tab.locator('#messages .message[data-thread-ts=""]', has_text="write a note for @channel").last
    parent.wait_for()
    ts = str(parent.get_attribute("data-ts"))
    stored = next(m for m in Page(running.url).state()["messages"] if m["ts"] == ts)["text"]
    assert stored == (
        "<@U0HARNESS> write a note for <!channel> and <!here> about <http://example.com/plan|the plan>, "
        "<https://example.org/a?b=1&amp;c=2>. a &lt; b &amp; c &gt; d &lt;javascript:alert(1)|x&gt; "
        "`@everyone &lt;x&gt;`"
    )
    expect(parent.locator(".mention.special")).to_have_text(["@channel", "@here"])
    expect(parent.locator("a")).to_have_text(["the plan", "https://example.org/a?b=1&c=2"])
    assert [a.get_attribute("href") for a in parent.locator("a").all()] == [
        "http://example.com/plan",
        "https://example.org/a?b=1&c=2",
    ]
    expect(parent).to_contain_text(". a < b & c > d <javascript:alert(1)|x>")  # shown as typed
    expect(parent.locator("code")).to_have_text("@everyone <x>")  # code is never converted

    thread = tab.locator(f'.thread[data-thread="{ts}"]')
    thread.locator("button[data-action-id=approve]").click()
    answer = thread.locator(".message.from-bot", has_text="Reading it back")
    expect(answer).to_contain_text("<!channel> and <!here> about <http://example.com/plan|the plan>")
    bot_says = thread.locator(".message.from-bot")
    assert bot_says.locator(".mention.special").count() == 0
    assert bot_says.locator("a").count() == 0  # the bot's own output links nowhere


def test_hostile_markup_in_a_persons_message_is_shown_as_text_and_links_only_to_the_web(
    browser: Any,
) -> None:
    """A person's text as Slack stores it may hold any markup: only http(s) and mailto become links,
    and nothing in it is ever parsed as HTML."""
    expect = pytest.importorskip("playwright.sync_api").expect
    with stand_in("xoxb-browser-hostile") as server, opened(browser, server.playground.base_url) as tab:
        text = (
            "<javascript:alert(1)|click me> <http://a.example|&lt;img src=x onerror=window.pwned=1&gt;> "
            '<http://b.example|<img src=x onerror="window.pwned=2">> <data:text/html,hi|data> '
            "<mailto:ops@example.com|mail ops> <!channel|&lt;b&gt;all&lt;/b&gt;>"
        )
        ts = server.playground.workspace.post_as(ALICE, text, None)["ts"]
        message = tab.locator(f'#messages .message[data-ts="{ts}"]')
        expect(message.locator("a")).to_have_count(2)
        assert tab.evaluate("window.pwned") is None
        assert tab.locator("#messages img, #messages script, #messages b").count() == 0
        links = message.locator("a")
        expect(links).to_have_text(["<img src=x onerror=window.pwned=1>", "mail ops"])
        assert [a.get_attribute("href") for a in links.all()] == [
            "http://a.example",
            "mailto:ops@example.com",
        ]
        shown = (
            "click me <img src=x onerror=window.pwned=1> "
            + '<http://b.example|<img src=x onerror="window.pwned=2">>'
        )
        expect(message).to_contain_text(f"{shown} data mail ops @channel")  # as text, never as HTML
        expect(message.locator(".mention.special")).to_have_text("@channel")


STATES_SEEN = "Number(document.body.dataset.states || 0)"  # states the page received (main.js)


def test_a_click_whose_press_spans_a_new_state_is_not_lost(browser: Any) -> None:
    """A run streaming into its thread re-renders the page several times a second, and a render
    between a press and its release took the button from under the pointer: the click never fired
    (seen as an Approve that did nothing, in a suite run). A new state now waits for the release."""
    expect = pytest.importorskip("playwright.sync_api").expect
    with stand_in("xoxb-browser-press") as server, opened(browser, server.playground.base_url) as tab:
        workspace = server.playground.workspace
        label = {"type": "plain_text", "text": "Approve"}
        approve = {"type": "button", "action_id": "approve", "text": label}
        blocks = [{"type": "actions", "block_id": "approval", "elements": [approve]}]
        message = {"channel": "C0PLAYGND", "text": "card", "blocks": blocks}
        posted = workspace.call("chat.postMessage", message, "xoxb-browser-press")
        card = tab.locator(f'.message[data-ts="{posted["ts"]}"] button[data-action-id=approve]')
        expect(card).to_be_visible()
        box = card.bounding_box()
        assert box is not None
        tab.route("**/play/action", lambda route: route.fulfill(json={"ok": True}))  # no bot here
        states = int(tab.evaluate(STATES_SEEN))
        tab.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        tab.mouse.down()
        workspace.post_as(ALICE, "a new state while the button is held", None)
        wait_until(lambda: int(tab.evaluate(STATES_SEEN)) > states)  # it reached the page
        with tab.expect_request(lambda r: r.url.endswith("/play/action")) as sent:
            tab.mouse.up()
        assert json.loads(sent.value.post_data or "{}")["action_id"] == "approve"
        expect(tab.locator("#messages")).to_contain_text("a new state while the button is held")  # then drawn


# `python -m bot` once the test writes to the FIFO named by argv[1]: the bot starts when the test says.
GATED_BOT = (
    "import os, sys\nopen(sys.argv[1]).read()\nos.execv(sys.executable, [sys.executable, '-m', 'bot'])\n"
)


def test_a_mention_typed_while_the_bot_starts_is_kept_then_delivered_and_answered_once(
    browser: Any, redis_server: Any, tmp_path: Path
) -> None:
    """Issue 23: the page answers before the bot does; a mention typed then was lost with an error.
    Now the page says the bot is starting and the mention reaches it by Slack's first retry."""
    import redis

    expect = pytest.importorskip("playwright.sync_api").expect
    url = redis_server.url.rsplit("/", 1)[0] + "/12"  # not the module's: its worker would take our run
    redis.Redis.from_url(url).flushdb()
    gate = tmp_path / "bot-gate"
    os.mkfifo(gate)
    (tmp_path / "workspace").mkdir()
    port = free_port()
    web = shlex.join([sys.executable, "-c", GATED_BOT, str(gate)])
    env = playground_env(url, tmp_path / "workspace", port, HARNESS_DEV_WEB_CMD=web)
    started = Running([sys.executable, "-m", "launch.local"], env, tmp_path, port)
    try:
        wait_until(lambda: "dev  | started web" in started.output(), timeout=60)
        with opened(browser, started.url) as tab:
            status = tab.locator("#bot-status")
            expect(status).to_contain_text("The bot is starting")
            as_user(tab, ALICE)
            parent = mention(tab, "list the files forever")
            expect(status).to_contain_text("1 message kept for it: delivered as soon as it answers")
            expect(tab.locator("#error")).to_be_hidden()
            expect(tab.locator("#composer")).to_have_value("")  # sent, not left to send again
            ts = str(parent.get_attribute("data-ts"))

            with gate.open("w") as opening:  # the bot starts now
                opening.write("go")
            expect(status).to_be_hidden()
            stop = tab.locator("#messages [data-ts]", has_text="That took")
            expect(stop.first).to_be_visible()
            expect(tab.locator("#error")).to_be_hidden()
        assert len(runs_started_by(url, ts)) == 1  # delivered once
        assert sum("That took" in m["text"] for m in Page(started.url).thread(ts)) == 1  # answered once
    finally:
        started.stop()


def test_an_mcp_server_whose_command_is_not_there_shows_as_down_and_why(
    browser: Any, redis_server: Any, tmp_path: Path
) -> None:
    """The page lists what a run there is offered: a server the worker cannot start is shown down."""
    expect = pytest.importorskip("playwright.sync_api").expect
    config = tmp_path / "harness.toml"
    missing = '\n[[mcp.servers]]\nname = "tickets"\ncommand = "tickets-mcp-not-installed"\n'
    config.write_text(PLAYGROUND_CONFIG.read_text() + missing)
    (tmp_path / "ws").mkdir()
    db = str(redis_server.url.rsplit("/", 1)[0] + "/14")
    with (
        playground(db, tmp_path / "ws", HARNESS_CONFIG=str(config)) as started,
        opened(browser, started.url) as tab,
    ):
        in_channel(tab, CHANNEL_ID)  # #ops offers no MCP server
        down = tab.locator('#profile-tools [data-down="MCP server tickets"]')
        expect(down).to_have_text("MCP server tickets · down")
        expect(tab.locator("#profile-rules")).to_contain_text(
            "MCP server tickets is down: its command is not on the PATH it is given: install it"
        )
        expect(tab.locator("#profile-tools")).not_to_contain_text("+ MCP server tickets")
        assert "tickets-mcp-not-installed" not in tab.content()  # the page never shows a command
        # The worker says it once, in its own log, naming the command and how to fix it.
        worker_said = wait_until(
            lambda: "MCP server tickets (stdio:" in started.output() and started.output()
        )
        assert (
            "cannot start: its command 'tickets-mcp-not-installed' is not on the PATH it is given"
            in worker_said
        )


# --- a tool's server asks the requester (the playground's own `rooms` MCP server) -------------


def test_a_booking_asks_the_requester_a_form_whose_wrong_answer_is_refused_under_its_field(
    tab: Any, redis_db: str, tmp_path: Path
) -> None:
    """The demo model calls `rooms__book_room`; the real server (over stdio, in bubblewrap) asks a form."""
    expect = pytest.importorskip("playwright.sync_api").expect
    require_bwrap()
    as_user(tab, ALICE)
    parent = mention(tab, "book room 4B for the retro")
    prompt = tab.locator(".ephemeral", has_text="rooms asks, before").last
    expect(prompt).to_contain_text("Only visible to you")
    expect(prompt).to_contain_text("It asks for: title, people, floor, lunch, day, equipment.")
    note = tab.locator("#messages [data-ts]", has_text="the run waits for their answer").last
    expect(note).to_be_visible()

    as_user(tab, CAROL)  # someone else sees the note, never the prompt, and cannot answer
    expect(tab.locator(".ephemeral", has_text="rooms asks, before")).to_have_count(0)
    note.locator("button[data-action-id=provide_input]").click()
    refused = tab.locator(".ephemeral", has_text="who asked for this run, can answer")
    expect(refused.first).to_be_visible()
    expect(tab.locator("#modal")).to_have_count(0)

    as_user(tab, ALICE)
    prompt.locator("button[data-action-id=provide_input]").click()
    modal = tab.locator("#modal")
    expect(modal).to_be_visible()
    modal.locator("#input-title").fill("Planning zq7")
    modal.locator("#input-people").fill("99")  # the form allows 1 to 12
    modal.locator("#input-floor").select_option("3")
    modal.get_by_label("Yes").check()
    modal.locator("#input-day").fill("2026-12-11")
    modal.locator("#input-equipment").select_option(["screen", "whiteboard"])
    tab.click("#modal-submit")
    people = modal.locator('.bk-input[data-block-id="people"]')
    expect(people.locator(".bk-error")).to_have_text("At most 12.")
    expect(modal.locator(".bk-error")).to_have_count(1)  # under that field alone
    expect(modal.locator("#input-title")).to_have_value("Planning zq7")  # what was typed is kept
    shoot(tab, "playground-input-form.png", tmp_path)

    modal.locator("#input-people").fill("6")
    tab.click("#modal-submit")
    expect(modal).to_be_hidden()
    booked = "Booked room 4B on the second floor on 2026-12-11 for 6 people, with lunch,"
    expect(tab.get_by_text(f"{booked} needing screen, whiteboard.").first).to_be_visible()
    expect(tab.locator("#messages")).not_to_contain_text("zq7")  # the title typed stays the server's
    expect(tab.get_by_text("That took 1 turns of tool calls across 2 model requests.").first).to_be_visible()
    expect(tab.get_by_text("answered what rooms asked").first).to_be_visible()
    assert len(runs_started_by(redis_db, str(parent.get_attribute("data-ts")))) == 1


def test_a_sign_in_asks_the_requester_to_visit_an_address_then_say_they_finished(tab: Any) -> None:
    expect = pytest.importorskip("playwright.sync_api").expect
    require_bwrap()
    # The address is on example.com, a documentation domain: the browser is given a page for it
    # here, offline, and the demo goes on when the person says they finished.
    visited: list[str] = []

    def serve(route: Any) -> None:
        visited.append(route.request.url)
        route.fulfill(status=200, content_type="text/html", body="<title>Signed in</title><p>Signed in.</p>")

    tab.context.route("https://example.com/**", serve)
    as_user(tab, ALICE)
    tab.locator(".chip", has_text="Sign in to the wiki").click()  # the page's own suggestion
    expect(tab.locator("#composer")).to_have_value("Sign in to the wiki")
    tab.press("#composer", "Enter")
    prompt = tab.locator(".ephemeral", has_text="rooms asks, before").last
    expect(prompt).to_contain_text("It sends you to example.com.")
    link = prompt.locator("a[data-action-id=open_input_url]")
    expect(link).to_have_attribute("href", "https://example.com/sign-in?service=wiki")
    expect(link).to_have_attribute("target", "_blank")
    with tab.context.expect_page() as opened_tab:
        link.click()  # a new tab, and the click goes to the bot too (it acks it), as in Slack
    opened_tab.value.wait_for_load_state()
    assert visited == ["https://example.com/sign-in?service=wiki"]
    opened_tab.value.close()

    prompt.locator("button[data-action-id=provide_input]").click()  # "I've finished"
    expect(tab.get_by_text("Signed in to wiki (a demo: nothing was signed in to).").first).to_be_visible()
    expect(tab.get_by_text("That took 1 turns of tool calls across 2 model requests.").last).to_be_visible()


def test_without_bubblewrap_the_playground_starts_and_shows_its_rooms_server_down_and_why(
    browser: Any, redis_server: Any, tmp_path: Path
) -> None:
    """No stdio server starts outside bubblewrap; the playground still does, and says why it is down."""
    expect = pytest.importorskip("playwright.sync_api").expect
    no_bwrap = tmp_path / "bin"  # every program on this PATH but bwrap
    no_bwrap.mkdir()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        for program in Path(folder).glob("*") if Path(folder).is_dir() else ():
            if program.name != "bwrap" and not (no_bwrap / program.name).exists():
                (no_bwrap / program.name).symlink_to(program)
    (tmp_path / "ws").mkdir()
    db = str(redis_server.url.rsplit("/", 1)[0] + "/13")
    with (
        playground(db, tmp_path / "ws", PATH=str(no_bwrap)) as started,
        opened(browser, started.url) as tab,
    ):
        down = tab.locator('#profile-tools [data-down="MCP server rooms"]')
        expect(down).to_have_text("MCP server rooms · down")
        expect(tab.locator("#profile-rules")).to_contain_text(
            "MCP server rooms is down: bubblewrap (bwrap) is not installed"
        )
        as_user(tab, ALICE)
        mention(tab, "book a room for the retro")
        expect(
            tab.get_by_text("it needs rooms__book_room, which this run does not offer").first
        ).to_be_visible()
        assert "bubblewrap (bwrap) is not installed" in started.output()  # the worker's log says so too
