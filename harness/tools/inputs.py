"""What an MCP server asks a person in the middle of a call, and what the person answered.

A server that needs something only a person can give (a value it cannot guess, a visit to a page
for a secret, a payment or a third-party sign-in) answers a `tools/call` with an input request
(MCP 2026-07-28 `input_required`): questions keyed by the server, and an opaque `requestState`.
The client calls again with the answers and that state, exactly as sent. Between the two calls the
run is parked like an approval, so the question can wait for a person for as long as a card can.

`InputAsk` is what a call waits on: the server, its questions (`InputQuestion`: a form of flat
fields, or a URL to visit) and its state, with the answers gathered so far, one question at a
time. An answer holds the person's action (accept, decline, cancel) and, for a form accepted, a
reference to the values, kept outside the run's state (`store.inputs`): values reach the server,
never the run's record, a log, the audit or a trace.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import date
from typing import Any, Literal
from urllib.parse import urlsplit

Action = Literal["accept", "decline", "cancel"]
ACTIONS: tuple[Action, ...] = ("accept", "decline", "cancel")

# Field formats and flags that mark a value as a secret: never asked for in Slack (a modal's values
# pass through Slack and this process); the server must ask for it by URL instead.
_SECRET_FORMATS = frozenset({"password"})
_SECRET_FLAGS = ("writeOnly", "x-secret", "secret", "sensitive")

EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
QUESTIONS_MAX = 8  # questions in one round; more is a server misbehaving (answered with an error)
URL_MAX = 3_000  # Slack's limit for a link button's url
MESSAGE_MAX = 2_000  # characters of a question's message kept (a card shows less)
FIELDS_MAX = 20  # fields of one form (a Slack modal holds 100 blocks; a person, far fewer)


class BadInputRequest(ValueError):
    """An input request this client cannot put to a person (said to the model, nothing asked)."""


@dataclass(frozen=True)
class InputQuestion:
    """One question of a round: a form (`schema`: flat properties) or a URL to visit."""

    key: str  # the server's key for it, echoed in the answer
    mode: Literal["form", "url"]
    message: str
    schema: dict[str, Any] = field(default_factory=dict)  # form: the requested schema
    url: str = ""  # url: where the person goes

    @property
    def domain(self) -> str:
        """The host a URL question sends the person to, shown before they click: in its ASCII form
        (`xn--…`) when it has other characters, so a look-alike of a known name shows as what it is."""
        host = urlsplit(self.url).hostname or ""
        if host.isascii():
            return host
        try:
            return host.encode("idna").decode("ascii")
        except UnicodeError:
            return host.encode("ascii", "backslashreplace").decode("ascii")

    @property
    def fields(self) -> dict[str, dict[str, Any]]:
        """The form's fields by name (none for a URL question)."""
        props = self.schema.get("properties")
        return {str(k): v for k, v in props.items() if isinstance(v, dict)} if isinstance(props, dict) else {}

    @property
    def required(self) -> tuple[str, ...]:
        names = self.schema.get("required")
        return tuple(str(n) for n in names) if isinstance(names, list) else ()

    @property
    def secret_fields(self) -> tuple[str, ...]:
        """Fields that ask for a secret: such a form is never put to a person in Slack."""
        return tuple(name for name, spec in self.fields.items() if is_secret(spec))

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"key": self.key, "mode": self.mode, "message": self.message}
        if self.mode == "form":
            data["schema"] = self.schema
        else:
            data["url"] = self.url
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InputQuestion:
        mode: Literal["form", "url"] = "url" if data.get("mode") == "url" else "form"
        schema = data.get("schema")
        return cls(
            key=str(data["key"]),
            mode=mode,
            message=str(data.get("message") or ""),
            schema=schema if isinstance(schema, dict) else {},
            url=str(data.get("url") or ""),
        )


@dataclass(frozen=True)
class InputAnswer:
    """A person's answer to one question: the action, who, and for a form accepted the reference
    of its values in `store.inputs` (never the values)."""

    action: Action
    by: str | None = None
    ref: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "by": self.by, "ref": self.ref}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InputAnswer:
        action = data.get("action")
        if action not in ACTIONS:
            raise ValueError(f"unknown input action {action!r}")
        return cls(action, data.get("by"), data.get("ref"))


@dataclass(frozen=True)
class InputAsk:
    """What a call waits on: its server's questions of this round, its opaque state, the answers."""

    server: str
    questions: tuple[InputQuestion, ...]
    state: str | None = None  # `requestState`: sent back exactly as it came, never read
    answers: dict[str, InputAnswer] = field(default_factory=dict)  # by question key
    rounds: int = 1  # how many input requests this call has met (a server that never stops asking)

    def question_id(self, question: InputQuestion) -> str:
        """What an answer binds to: this round's question (16 hex digits), so a prompt of an earlier
        round, or a forged one, answers nothing."""
        text = f"{self.rounds}\x00{question.key}\x00{question.message}"
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]

    @property
    def next_question(self) -> InputQuestion | None:
        """The first question still unanswered; None when every one is."""
        return next((q for q in self.questions if q.key not in self.answers), None)

    def answered(self, key: str, answer: InputAnswer) -> InputAsk:
        return replace(self, answers={**self.answers, key: answer})

    def to_json(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "questions": [q.to_json() for q in self.questions],
            "state": self.state,
            "answers": {k: a.to_json() for k, a in self.answers.items()},
            "rounds": self.rounds,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InputAsk:
        answers = data.get("answers") or {}
        return cls(
            server=str(data["server"]),
            questions=tuple(InputQuestion.from_json(q) for q in data["questions"]),
            state=data.get("state") if isinstance(data.get("state"), str) else None,
            answers={str(k): InputAnswer.from_json(v) for k, v in answers.items()},
            rounds=int(data.get("rounds") or 1),
        )


@dataclass(frozen=True)
class InputReply:
    """What goes back to the server with the call again: each question's response, and the state."""

    responses: dict[str, dict[str, Any]]  # key -> an ElicitResult (action, content)
    state: str | None
    rounds: int = 1  # the input requests this call met so far

    def to_json(self) -> dict[str, Any]:
        return {"responses": self.responses, "state": self.state, "rounds": self.rounds}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InputReply:
        responses = data.get("responses") or {}
        state = data.get("state")
        rounds = int(data.get("rounds") or 1)
        return cls(
            {str(k): dict(v) for k, v in responses.items()}, state if isinstance(state, str) else None, rounds
        )


@dataclass(frozen=True)
class MidCallQuestion:
    """A question a server of the protocol before 2026-07-28 asks while its call waits for the
    answer (`elicitation/create`): the call cannot park, so a person is asked while it waits."""

    who: str  # the run the call is for
    server: str
    tool: str
    question: InputQuestion
    seconds: float  # how long the call may still wait for the answer


# What answers a mid-call question: an ElicitResult as JSON (`action`, and `content` for a form).
PersonAsker = Callable[[MidCallQuestion], Awaitable[dict[str, Any]]]


def is_secret(spec: dict[str, Any]) -> bool:
    """Whether a form field asks for a secret (a password format, or a flag saying so)."""
    return spec.get("format") in _SECRET_FORMATS or any(spec.get(flag) is True for flag in _SECRET_FLAGS)


def cancelled(ask: InputAsk) -> InputReply:
    """The reply that tells the server nobody will answer (a Stop, or the run ended meanwhile)."""
    return InputReply({q.key: {"action": "cancel"} for q in ask.questions}, ask.state, ask.rounds)


def reply_to(ask: InputAsk, values: dict[str, dict[str, Any]]) -> InputReply:
    """The reply carrying every answer of `ask` (`values`: an accepted form's values, by question
    key, read from where they were kept: `store.inputs`)."""
    responses: dict[str, dict[str, Any]] = {}
    for question in ask.questions:
        answer = ask.answers.get(question.key)
        if answer is None:
            responses[question.key] = {"action": "cancel"}
        elif answer.action == "accept" and question.mode == "form":
            responses[question.key] = {"action": "accept", "content": values.get(question.key, {})}
        else:
            responses[question.key] = {"action": answer.action}
    return InputReply(responses, ask.state, ask.rounds)


def question_of(key: str, method: str, params: dict[str, Any]) -> InputQuestion:
    """One embedded request of an `input_required` result as a question; `BadInputRequest` for
    what this client does not offer (sampling, roots) or cannot show."""
    if method != "elicitation/create":
        raise BadInputRequest(f"it asked for {method!r}, which this client does not offer")
    message = str(params.get("message") or "")[:MESSAGE_MAX]
    if params.get("mode") == "url":
        url = str(params.get("url") or "")
        parts = urlsplit(url)
        if parts.scheme != "https" or not parts.hostname:
            raise BadInputRequest("it asked the person to visit an address that is not https")
        if len(url) > URL_MAX:
            raise BadInputRequest(f"it asked the person to visit an address longer than {URL_MAX} characters")
        return InputQuestion(key, "url", message, url=url)
    schema = params.get("requestedSchema")
    if schema is None:
        schema = params.get("requested_schema")
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise BadInputRequest("its form has no flat object schema")
    question = InputQuestion(key, "form", message, schema=schema)
    if not question.fields and not question.message:
        raise BadInputRequest("its form asks nothing")
    if len(question.fields) > FIELDS_MAX:
        raise BadInputRequest(f"its form has more than {FIELDS_MAX} fields")
    for name, spec in question.fields.items():
        kind = spec.get("type")
        if kind not in ("string", "number", "integer", "boolean", "array"):
            raise BadInputRequest(f"its field {name!r} is of a type a form cannot ask ({kind!r})")
    return question


def typed_answer(text: str, spec: dict[str, Any]) -> Any:
    """`text`, typed by a person for a field of `spec`, as the schema's type within its bounds;
    ValueError says, in a few words for the person, what is wrong."""
    kind = spec.get("type")
    if kind in ("number", "integer"):
        try:
            number: int | float = int(text) if kind == "integer" else float(text)
        except ValueError:
            raise ValueError("Enter a whole number." if kind == "integer" else "Enter a number.") from None
        low, high = spec.get("minimum"), spec.get("maximum")
        if isinstance(low, int | float) and number < low:
            raise ValueError(f"At least {low}.")
        if isinstance(high, int | float) and number > high:
            raise ValueError(f"At most {high}.")
        return number
    if kind == "boolean":
        return text == "true"
    shortest, longest = spec.get("minLength"), spec.get("maxLength")
    if isinstance(shortest, int) and len(text) < shortest:
        raise ValueError(f"At least {shortest} characters.")
    if isinstance(longest, int) and len(text) > longest:
        raise ValueError(f"At most {longest} characters.")
    fmt = spec.get("format")
    if fmt == "email" and not EMAIL.fullmatch(text):
        raise ValueError("Enter an email address.")
    if fmt == "uri" and not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://\S+$", text):
        raise ValueError("Enter an address (https://…).")
    if fmt == "date" and not is_date(text):
        raise ValueError("Enter a date (YYYY-MM-DD).")
    return text


def is_date(text: str) -> bool:
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return len(text) == 10
