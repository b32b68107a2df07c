"""How a run ends in its thread: the final answer and its feedback buttons, a stop, a failure.

The answer is the model's Markdown as mrkdwn, escaped and split over sections (cut, with the whole
of it in a file, when a message cannot hold it). A stop names the valve and why, or the person
who pressed Stop. A failure on a model API error offers Retry, and says who retried once pressed.
Each ends with the footer `That took N turns of tool calls across M model requests.` where the
run's counts are known.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from slack_sdk.models.blocks import (
    ActionsBlock,
    ButtonElement,
    ContextActionsBlock,
    FeedbackButtonObject,
    FeedbackButtonsElement,
)

from harness.texts import FOOTER
from messages import texts
from messages.blocks import Attachment, Message, context, fit, scaled, section, with_tail
from messages.limits import BUTTON_VALUE_MAX, SECTION_MAX, TEXT_MAX
from messages.markdown import FENCE, shorten_tables
from messages.text import (
    ELLIPSIS,
    answer_mrkdwn,
    inert,
    mention,
    mrkdwn_prefix_len,
    slack_date,
    units,
    visible,
)

ANSWER_LIMIT = 10500  # total escaped characters of a final answer across its sections
TABLE_ROWS_SHOWN = 10  # a longer table shows this many rows in the thread; the whole is in the file

FEEDBACK_GOOD, FEEDBACK_BAD = "good", "bad"  # the feedback buttons' values: "good:RUN", "bad:RUN"


def _footer(turns: int, requests: int) -> str:
    return FOOTER.format(turns=turns, requests=requests)


def _answer_sections(answer: str, total: int) -> tuple[list[str], bool]:
    """`answer` (Markdown) as mrkdwn, cut to `total` and split into sections of <= SECTION_MAX, and
    whether it had to be cut.

    Splits prefer line breaks, never fall inside an escaped entity, and a ``` block that spans a
    split is closed at the end of one section and reopened at the start of the next.
    """
    rest = answer_mrkdwn(answer)
    was_cut = units(rest) > total
    if was_cut:
        rest = rest[: mrkdwn_prefix_len(rest, total - len(ELLIPSIS))] + ELLIPSIS
    chunks: list[str] = []
    in_fence = False
    while rest:
        prefix = f"{FENCE}\n" if in_fence else ""
        room = SECTION_MAX - len(prefix) - len(FENCE) - 1
        n = mrkdwn_prefix_len(rest, room)
        if n < len(rest):
            newline = rest.rfind("\n", 0, n)
            if newline > n // 2:
                n = newline
            back = 0
            while back < 2 and n > 1 and rest[n - 1] == "`":  # never split a fence in two
                n, back = n - 1, back + 1
        piece, rest = rest[:n], rest[n:].lstrip("\n")
        if in_fence:
            piece = piece.lstrip("\n")
        if not piece.strip() and not in_fence:
            continue
        in_fence = (piece.count(FENCE) % 2 == 1) != in_fence
        chunks.append(prefix + piece + (f"\n{FENCE}" if in_fence else ""))
    return chunks, was_cut


def final_answer(answer: str, turns: int, requests: int, *, run_id: str | None = None) -> Message:
    """The model's answer (its Markdown as mrkdwn, escaped, split over sections), the footer, and
    with `run_id` Slack's feedback buttons (`feedback`: ``good:RUN`` or ``bad:RUN``).

    An answer longer than a message can hold is cut, says so, and comes whole as a file.
    """
    footer = _footer(turns, requests)
    feedback = [] if run_id is None else [feedback_buttons(run_id)]
    shown, rows_left_out = shorten_tables(answer, TABLE_ROWS_SHOWN)
    cut_off = [False]

    def build(scale: float) -> list[dict[str, Any]]:
        chunks, cut_off[0] = _answer_sections(shown, scaled(ANSWER_LIMIT, scale, 500))
        chunks = chunks or ["_(the model gave no answer)_"]
        note = [context(texts.ANSWER_IN_FILE)] if cut_off[0] else []
        return [*(section(chunk) for chunk in chunks), *note, context(footer), *feedback]

    blocks = fit(build)
    whole = (
        Attachment(answer_file_name(answer), texts.ANSWER_FILE_TITLE, visible(answer, answer=True))
        if cut_off[0] or rows_left_out
        else None
    )
    text = with_tail(answer, footer, mode="answer")
    return Message(text=text, blocks=blocks, attachment=whole)


def answer_file_name(answer: str) -> str:
    """A name a person can read for the file of a whole answer: its first heading in lowercase words
    joined by dashes ("Q3 sales, by region" is q3-sales-by-region.md), else answer.md."""
    heading = next((line.lstrip("#") for line in answer.splitlines() if line.startswith("#")), "")
    words = re.findall(r"[a-z0-9]+", heading.lower())
    slug = "-".join(words)[:40].strip("-")
    return f"{slug or 'answer'}.md"


def feedback_buttons(run_id: str) -> dict[str, Any]:
    """Thumbs up and down under an answer, as Slack shows them for AI apps (`context_actions`)."""
    return ContextActionsBlock(
        block_id="feedback",
        elements=[
            FeedbackButtonsElement(
                action_id="feedback",
                positive_button=FeedbackButtonObject(
                    text="👍", value=f"{FEEDBACK_GOOD}:{run_id}", accessibility_label="This answer helped"
                ),
                negative_button=FeedbackButtonObject(
                    text="👎",
                    value=f"{FEEDBACK_BAD}:{run_id}",
                    accessibility_label="This answer did not help",
                ),
            )
        ],
    ).to_dict()


def stopped(reason: str, turns: int, requests: int) -> Message:
    """A stop by a valve: which valve and why, and the footer."""
    footer = _footer(turns, requests)

    def build(scale: float) -> list[dict[str, Any]]:
        said = inert(reason, scaled(SECTION_MAX - 20, scale, 200))
        return [section(f":octagonal_sign: {said}"), context(footer)]

    return Message(text=with_tail(":octagonal_sign: " + reason, footer), blocks=fit(build))


def stopped_by(*, by: str | None, turns: int, requests: int) -> Message:
    """A run a person stopped (Stop, or Slack's own stop button): who, and the footer."""
    footer = _footer(turns, requests)
    said = texts.STOPPED_BY.format(who=mention(by) if by else "someone")
    return Message(text=f"{said}\n\n{footer}", blocks=[section(said), context(footer)])


def _failure_section(error: str, scale: float) -> dict[str, Any]:
    return section(":warning: The run failed: " + inert(error, scaled(SECTION_MAX - 40, scale, 200)))


def failed(*, run_id: str, error: str) -> Message:
    """A run that failed on a model API error, with a Retry button (value: the run id)."""
    if len(run_id) > BUTTON_VALUE_MAX:
        raise ValueError(f"run id of {len(run_id)} characters does not fit a button value")
    actions = ActionsBlock(
        block_id="failure",
        elements=[ButtonElement(text="Retry", action_id="retry", value=run_id, style="primary")],
    ).to_dict()

    def build(scale: float) -> list[dict[str, Any]]:
        return [_failure_section(error, scale), actions]

    return Message(text=inert("The run failed: " + error, TEXT_MAX), blocks=fit(build))


def retried_card(*, error: str, by: str, at: datetime) -> Message:
    """The failure message after Retry was clicked: no button, who retried and when."""
    retried = f":repeat: Retried by {mention(by)} at {slack_date(at)}"

    def build(scale: float) -> list[dict[str, Any]]:
        return [_failure_section(error, scale), context(retried)]

    return Message(text=with_tail("The run failed: " + error, retried), blocks=fit(build))
