"""Approval receipts: a signed note, handed to a tool as its call runs, of how that exact call came
to run and who let it.

A receipt is a JWT (RFC 7519: JWS compact serialisation, HS256), so a service in any language can
check it with the JWT library it already has: `base64url(header).base64url(claims).base64url(HMAC)`,
the header `{"alg": "HS256", "typ": "approval-receipt+jwt"}` (plus `kid` when one is set). Its claims:

- `iss` "slack-harness"; `aud` where the call goes: `mcp:<server>` or `module:<module>`;
- `sub` the tool as the model calls it (`<server>__<tool>` for an MCP tool);
- `input_sha256` the SHA-256 (hex) of the canonical JSON of the arguments the tool runs with (a
  reviewer's edit, when there was one): `json.dumps(arguments, sort_keys=True, separators=(",", ":"),
  ensure_ascii=False)` encoded as UTF-8, the audit's `input_sha256` for an unedited call;
- `fp` the call's fingerprint (what its card and audit entries carry);
- `how`: "approved" (by people, on its card), "grant" (an earlier approval's grant covered it),
  "allow" (its tier was allow) or "rule" (an argument rule made it allow); `why` the policy's words;
- `approvers` the Slack user ids whose approval let it run ([] for allow and rule; the grantor for a
  grant), `edited` true when a reviewer changed the arguments;
- `requester`, `team`, `channel`, `run`, `call` (the `tool_use` id);
- `iat`, `exp` (a few minutes later) and `jti` (unique: a service may refuse one seen before).

The key. `HARNESS_RECEIPT_KEY` is never a signing key itself: each audience gets its own key, derived
as HMAC-SHA256(master, "slack-harness approval receipt v1" NUL audience) in hex, and its 64 ASCII
characters are the HS256 secret (`audience_key`). A service is given only its own key (`python -m
workers audit receipt-key AUDIENCE`), so the MCP server that checks its receipts cannot make one
for another server. Pure: no I/O, and the clock is passed in.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import jwt

from harness import texts
from harness.config import ConfigError
from harness.policy import read_why
from harness.state import GrantUse, PendingCall, Verdict, canonical_json
from harness.tools.mcp_meta import META_KEY

__all__ = ["META_KEY", "How", "Minter", "Signer", "audience_key", "input_sha256", "verify"]

ISSUER = "slack-harness"
TYPE = "approval-receipt+jwt"
ALGORITHM = "HS256"
TTL_SECONDS = 300
MIN_KEY_CHARS = 32  # a shorter key is refused: HMAC-SHA256 is only as strong as its key
KEY_SETTING, KEY_ID_SETTING = "HARNESS_RECEIPT_KEY", "HARNESS_RECEIPT_KEY_ID"
_KEY_INFO = b"slack-harness approval receipt v1\x00"
REQUIRED = ("iss", "aud", "sub", "input_sha256", "how", "iat", "exp", "jti")


class How(StrEnum):
    """How a call came to run."""

    APPROVED = "approved"
    GRANT = "grant"
    ALLOW = "allow"
    RULE = "rule"


class ReceiptKeyError(ConfigError):
    """`HARNESS_RECEIPT_KEY` (or its id) is set but unusable: the process says so and stops."""


def input_sha256(arguments: Any) -> str:
    """The SHA-256 (hex) of `arguments`' canonical JSON: what `input_sha256` says."""
    return hashlib.sha256(canonical_json(arguments).encode("utf-8", "replace")).hexdigest()


def audience_key(master: str, audience: str) -> str:
    """The HS256 secret of the receipts for `audience`, from the master key (64 hex characters)."""
    return hmac.new(master.encode(), _KEY_INFO + audience.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Signer:
    """The master key (never shown: not in a repr, a log, a card or the state) and its id."""

    key: str = field(repr=False)
    key_id: str | None = None
    ttl_seconds: int = TTL_SECONDS

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Signer | None:
        """The signer `HARNESS_RECEIPT_KEY` gives; None when unset (no receipts)."""
        key = env.get(KEY_SETTING, "")
        key_id = env.get(KEY_ID_SETTING, "").strip() or None
        if not key:
            return None
        if len(key) < MIN_KEY_CHARS:
            raise ReceiptKeyError(texts.RECEIPT_KEY_SHORT.format(name=KEY_SETTING, least=MIN_KEY_CHARS))
        if key_id is not None and (len(key_id) > 64 or not key_id.isprintable()):
            raise ReceiptKeyError(texts.RECEIPT_KEY_ID_BAD.format(name=KEY_ID_SETTING))
        return cls(key, key_id)

    def sign(self, claims: Mapping[str, Any]) -> str:
        """`claims` as a receipt, under the key of their `aud`."""
        headers = {"typ": TYPE, **({"kid": self.key_id} if self.key_id else {})}
        return jwt.encode(dict(claims), audience_key(self.key, str(claims["aud"])), ALGORITHM, headers)


@dataclass(frozen=True)
class RunFacts:
    """What every receipt of one run says of where it ran and for whom."""

    run: str
    requester: str
    team: str
    channel: str


def how_of(call: PendingCall) -> How:
    """How `call` (about to run, its tier decided again) came to run."""
    decision = call.decision
    if decision is not None and decision.verdict is Verdict.APPROVED:
        return How.GRANT if decision.grant is GrantUse.USED else How.APPROVED
    return How.RULE if read_why(call.why).step == "rule" else How.ALLOW


def claims_of(
    call: PendingCall, arguments: Any, audience: str, facts: RunFacts, now: float, ttl: int = TTL_SECONDS
) -> dict[str, Any]:
    """The claims of a receipt for `call` running with `arguments` at `now` (seconds since 1970)."""
    how = how_of(call)
    decision = call.decision if how in (How.APPROVED, How.GRANT) else None
    approvers = [] if decision is None else list(decision.approvers or filter(None, (decision.by,)))
    claims: dict[str, Any] = {
        "iss": ISSUER,
        "aud": audience,
        "sub": call.name,
        "input_sha256": input_sha256(arguments),
        "fp": call.fingerprint,
        "how": how.value,
        "why": call.why,
        "approvers": approvers,
        "requester": facts.requester,
        "team": facts.team,
        "channel": facts.channel,
        "run": facts.run,
        "call": call.id,
        "iat": int(now),
        "exp": int(now) + ttl,
        "jti": uuid.uuid4().hex,
    }
    if decision is not None and decision.edited_input is not None:
        claims["edited"] = True
    return claims


@dataclass(frozen=True)
class Minter:
    """Makes the receipt of each call of one run as it runs (`Agent.receipt`); none for a tool with
    no audience (a built-in: it has nobody to show one to)."""

    signer: Signer
    facts: RunFacts
    audience_of: Callable[[str], str | None]  # a tool's name -> `mcp:<server>`, `module:<name>`, None
    clock: Callable[[], float]

    def __call__(self, call: PendingCall, arguments: Any) -> str | None:
        audience = self.audience_of(call.name)
        if audience is None:
            return None
        claims = claims_of(call, arguments, audience, self.facts, self.clock(), self.signer.ttl_seconds)
        return self.signer.sign(claims)


@dataclass(frozen=True)
class Checked:
    """What `verify` found. `claims` only once the signature held; `problem` "" when valid."""

    claims: dict[str, Any] | None
    problem: str = ""
    expired: bool = False  # the signature holds, and the receipt is past its `exp`

    @property
    def valid(self) -> bool:
        return self.claims is not None and not self.problem


_UNGIVEN: Any = object()
# PyJWT checks the signature, the issuer, the audience and that every claim is there; the times are
# checked against the clock `verify` is given, so an expired receipt is told apart from a forged one.
_PYJWT: Any = {"verify_exp": False, "verify_iat": False, "verify_nbf": False, "require": list(REQUIRED)}


def verify(
    token: str, master: str, now: float, *, key_id: str | None = None, arguments: Any = _UNGIVEN
) -> Checked:
    """Check `token` against the master key at `now`: its form, signature, expiry and (given
    `arguments`) that it is for exactly those arguments."""
    try:
        header = jwt.get_unverified_header(token)
        unverified = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        return Checked(None, texts.RECEIPT_MALFORMED.format(error=exc))
    if header.get("alg") != ALGORITHM or header.get("typ") != TYPE:
        found = f"alg {header.get('alg')!r}, typ {header.get('typ')!r}"
        return Checked(None, texts.RECEIPT_NOT_OURS.format(found=found, alg=ALGORITHM, typ=TYPE))
    if key_id and header.get("kid") and header["kid"] != key_id:
        return Checked(None, texts.RECEIPT_OTHER_KEY.format(kid=header["kid"], ours=key_id))
    audience = unverified.get("aud")
    if not isinstance(audience, str):
        return Checked(None, texts.RECEIPT_MALFORMED.format(error="no audience (aud)"))
    try:
        claims = jwt.decode(
            token,
            audience_key(master, audience),
            algorithms=[ALGORITHM],
            audience=audience,
            issuer=ISSUER,
            options=_PYJWT,
        )
    except jwt.InvalidSignatureError:
        return Checked(None, texts.RECEIPT_BAD_SIGNATURE)
    except jwt.PyJWTError as exc:
        return Checked(None, texts.RECEIPT_MALFORMED.format(error=exc))
    if not isinstance(claims["exp"], int) or isinstance(claims["exp"], bool):
        return Checked(None, texts.RECEIPT_MALFORMED.format(error="exp is not a whole number"))
    if now >= claims["exp"]:
        return Checked(claims, texts.RECEIPT_EXPIRED.format(seconds=int(now - claims["exp"])), expired=True)
    signed = claims["input_sha256"]
    if arguments is not _UNGIVEN and (given := input_sha256(arguments)) != signed:
        return Checked(claims, texts.RECEIPT_OTHER_ARGUMENTS.format(given=given, signed=signed))
    return Checked(claims)
