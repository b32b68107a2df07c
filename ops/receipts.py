"""`python -m workers audit verify-receipt` and `receipt-key`: the operator's side of approval receipts.

`verify-receipt TOKEN [--args JSON]` checks a receipt with `HARNESS_RECEIPT_KEY` (`harness.receipts`):
the first line says whether it is valid and, if not, why (a receipt whose signature holds but whose
time is up says so apart from one that is forged or changed); then, once the signature holds, its
claims as JSON. Exit 0: valid (for exactly those arguments, given `--args`); 1: not valid; 2: it
could not be checked (no key, `--args` not JSON, no receipt). `TOKEN` `-` reads it from standard input,
out of the shell's history and the process list.

`receipt-key AUDIENCE` prints the key that service verifies its receipts with (`mcp:SERVER`,
`module:MODULE`), derived from `HARNESS_RECEIPT_KEY`; never the key itself.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from harness import receipts, texts

log = logging.getLogger(__name__)

COMMANDS = ("verify-receipt", "receipt-key")
_AUDIENCE = re.compile(r"(mcp|module):\S+")


def add_commands(audit_sub: Any) -> None:
    """The two commands, under `python -m workers audit`."""
    verify = audit_sub.add_parser("verify-receipt", help="check an approval receipt (HARNESS_RECEIPT_KEY)")
    verify.add_argument("token", metavar="TOKEN", help="the receipt, or - to read it from standard input")
    verify.add_argument("--args", metavar="JSON", help="the arguments the tool got: must be the signed ones")
    key = audit_sub.add_parser("receipt-key", help="print the key a service checks its receipts with")
    key.add_argument("audience", metavar="AUDIENCE", help="mcp:SERVER or module:MODULE")


def announce(signer: receipts.Signer | None) -> None:
    """Say once, at a worker's start, whether its tools get receipts (and under which key id)."""
    if signer is None:
        log.info(texts.RECEIPTS_OFF)
    else:
        log.info(texts.RECEIPTS_ON.format(kid=signer.key_id or "none"))


def run(
    args: argparse.Namespace,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
    stdin: TextIO | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run the receipts command `args` names; its exit code."""
    env = os.environ if env is None else env
    out, err = out or sys.stdout, err or sys.stderr
    master = env.get(receipts.KEY_SETTING, "")
    if not master:
        print(texts.RECEIPT_NO_KEY, file=err)
        return 2
    if args.audit_command == "receipt-key":
        if not _AUDIENCE.fullmatch(args.audience):
            print(texts.RECEIPT_BAD_AUDIENCE.format(audience=args.audience), file=err)
            return 2
        print(receipts.audience_key(master, args.audience), file=out)
        return 0
    return _verify(args, master, env, clock(), stdin or sys.stdin, out, err)


def _verify(
    args: argparse.Namespace,
    master: str,
    env: Mapping[str, str],
    now: float,
    stdin: TextIO,
    out: TextIO,
    err: TextIO,
) -> int:
    token = (stdin.read() if args.token == "-" else args.token).strip()
    if not token:
        print(texts.RECEIPT_NO_TOKEN, file=err)
        return 2
    given: dict[str, Any] = {}
    if args.args is not None:
        try:
            given["arguments"] = json.loads(args.args)
        except ValueError as exc:
            print(texts.RECEIPT_BAD_ARGS.format(error=exc), file=err)
            return 2
    key_id = env.get(receipts.KEY_ID_SETTING, "").strip() or None
    checked = receipts.verify(token, master, now, key_id=key_id, **given)
    claims = checked.claims
    if checked.valid and claims is not None:
        by = ", ".join(claims.get("approvers") or ())
        print(
            texts.RECEIPT_VALID.format(
                sub=claims["sub"],
                aud=claims["aud"],
                how=claims["how"],
                by=f" by {by}" if by else "",
                seconds=int(claims["exp"] - now),
            ),
            file=out,
        )
    else:
        print(texts.RECEIPT_NOT_VALID.format(problem=checked.problem), file=out)
    if claims is not None:  # the signature holds: what it says is the harness's word
        print(json.dumps(claims, indent=2, sort_keys=True, ensure_ascii=False), file=out)
    return 0 if checked.valid else 1
