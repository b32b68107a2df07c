"""`approvers_from` callables for the tests: each answers one way, whoever imports it (the bot's
process or the test's own)."""

from __future__ import annotations

import threading

from gates.approvers_from import ApprovalClick, ApproverAnswer, no, unknown, yes

RELEASE = threading.Event()  # set by an in-process test to let `stuck` return
SEEN: list[ApprovalClick] = []  # what the in-process callables were given


def only_ann(click: ApprovalClick) -> ApproverAnswer:
    SEEN.append(click)
    if click.clicker == "UANN":
        return yes(f"UANN may approve {click.tool} <!channel> <@U999>")
    return no(f"only UANN may approve {click.tool}")


def not_sure(click: ApprovalClick) -> ApproverAnswer:
    return unknown("the rota could not be read")


def raises(click: ApprovalClick) -> ApproverAnswer:
    raise KeyError("secret-looking detail that must not reach Slack")


def stuck(click: ApprovalClick) -> ApproverAnswer:
    RELEASE.wait(60)  # past any timeout a test sets: a callable that hangs
    return yes("too late")


def garbage(click: ApprovalClick) -> object:
    return True  # not an answer: refused


def pair(click: ApprovalClick) -> tuple[str, str]:
    return ("yes", "a pair will do")


def under_docs(click: ApprovalClick) -> ApproverAnswer:
    paths = click.paths or ()
    if paths and all(p.startswith("docs/") for p in paths):
        return yes("every path is under docs/")
    return no("a path outside docs/")


def edited_only(click: ApprovalClick) -> ApproverAnswer:
    return yes("an edit") if click.edited and click.arguments.get("path") == "ok.md" else no("not that")


NOT_CALLABLE = 42
