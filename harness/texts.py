"""Every sentence the harness says to a person or to the model, in one place.

Stops are read by Slack users, not engineers: each names the valve and says why in plain words.
"""

from __future__ import annotations

# The contract's words, exactly, even for 1 turn: outside tests and readers rely on them.
FOOTER = "That took {turns} turns of tool calls across {requests} model requests."


def plural(n: int, word: str) -> str:
    """`1 word`, `2 words`, `1,234 words`: a count as a person would say it."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


# Valve stops (shown to the user): each names its valve in plain words ("max turns", "token
# budget", "no progress", "budget") and says why. Counts come through `plural`.
STOP_MAX_TURNS = (
    "Stopped at max turns: the model asked for another turn of tool calls, but this run is allowed "
    "only {turns}."
)
STOP_TOKEN_BUDGET = "Stopped at the token budget: the run has used {used}, at or over its budget of {limit}."
STOP_NO_PROGRESS_REPEAT = (
    "Stopped for no progress: the model asked for exactly the same tool calls "
    "as in the turn before ({signature}), so it was going round in circles."
)
STOP_NO_PROGRESS_CYCLE = (
    "Stopped for no progress: the last {turns} repeat the same cycle of "
    "{period} of tool calls, so the model was going round in circles."
)
STOP_MAX_TOKENS = (
    "Stopped: the model's reply was cut off at its limit of {limit} per request"
    "{cut_tools}. Ask for something shorter, or ask whoever runs this bot to raise max_tokens."
)
STOP_MAX_TOKENS_CUT_TOOLS = ", so the tool call it was writing was not run"
STOP_REFUSAL = "Stopped: the model declined to continue with this request (refusal)."
STOP_CONTEXT_WINDOW = (
    "Stopped: the conversation no longer fits in the model's context window. Start a new thread to carry on."
)
STOP_UNKNOWN_REASON = "Stopped: the model ended its reply for a reason I do not know ({reason})."
STOP_BUDGET = "Stopped at a daily budget: {detail}"
STOP_BY_USER = "Stopped at a person's request, before the next model request; calls not yet run were not run."

# A limit that asks ([limits] on_limit = "ask"): what the run reached, and what Continue grants.
LIMIT_MAX_TURNS = (
    "Reached max turns: the model asked for another turn of tool calls, but this run is allowed only {turns}."
)
LIMIT_TOKEN_BUDGET = "Reached the token budget: the run has used {used}, at or over its budget of {limit}."
LIMIT_BUDGET = "Reached a daily budget: {detail}"
LIMIT_MORE_TURNS = "{more:,} more turn{s} of tool calls"
LIMIT_MORE_TOKENS = "{more:,} more token{s}"
LIMIT_MORE_PAST_BUDGET = (
    "{more:,} more token{s} for this run past the daily budget (the day's spend then goes over it, "
    "by your choice)"
)

FAILED_MODEL_API = "The model API failed after retrying: {error}"

# Tool results the model reads.
RESULT_DENIED = "Not executed: the tool {name!r} is forbidden by policy (tier deny)."
RESULT_DENIED_ARGS = (
    "Not executed: {name} with {args} is forbidden by policy (tier deny). The tool itself is not: "
    "other arguments may be allowed."
)
RESULT_DECLINED = "Not executed: the user declined this call."
RESULT_DECLINED_REASON = "Not executed: the user declined this call, saying: {reason}"
RESULT_EXPIRED = (
    "Not executed: the approval request expired before anyone decided on it. Ask again if it is still needed."
)
RESULT_BAD_INPUT = "Error: invalid input for {name}: {problems}"
RESULT_TOOL_RAISED = "Error: {name} failed: {error}"
RESULT_OUTCOME_UNKNOWN = (
    "Outcome unknown: {name} was started, but the worker running it stopped before its result "
    "was recorded. It was NOT run again; check its effect before trying again."
)
RESULT_DUPLICATE_ID = (
    "Not executed: this reply had more than one tool_use block with the id {id!r}; none of them was "
    "run. Give every tool call its own id."
)
RESULT_NOT_RUN_STOPPED = "Not executed: the run was stopped before this call ran ({valve})."
RESULT_CUT = "\n[… cut: the tool returned {total:,} characters; only the first {kept:,} are shown]"
RESULT_TIMED_OUT = "Error: {name} did not finish within {seconds:g} seconds"
RESULT_TIMED_OUT_OUTCOME_UNKNOWN = (
    "Outcome unknown — it may still complete: {name} did not finish within {seconds:g} seconds and "
    "was left running. It was NOT run again; check its effect before trying again."
)

# The file tools' refusals (the model reads them). Paths are always relative to the workspace.
FILE_BAD_PATH = "a path must be a non-empty relative path inside the workspace"
FILE_ABSOLUTE = "{path!r} is an absolute path; use a path relative to the workspace"
FILE_GOES_UP = "{path!r} goes up with '..'; paths must stay inside the workspace"
FILE_HIDDEN = (
    "{path} is hidden (a name on its path starts with '.'); the file tools do not touch hidden "
    "files or directories"
)
FILE_SYMLINK = (
    "{path} is a symbolic link; the file tools do not follow links, since one could lead outside "
    "the workspace"
)
FILE_HARD_LINK = "{path} has other hard links; the file tools do not touch a file that also lives elsewhere"
FILE_NOT_FOUND = "no such file or directory: {path}"
FILE_IS_DIRECTORY = "{path} is a directory"
FILE_NOT_REGULAR = "{path} is not a regular file"
FILE_NOT_DIRECTORY = "{path} is not a directory"
FILE_BINARY = "{path} is a binary file; only text files can be read"
FILE_OS_ERROR = "{path}: {reason}"
FILE_NO_WORKSPACE = "the workspace directory cannot be opened: {reason}"
FILE_WROTE = "Wrote {chars} characters to {path}"
FILE_DELETED = "Deleted {path}"
FILE_EMPTY_DIRECTORY = "(empty directory)"
FILE_MORE_ENTRIES = "… and {more} more"

# Terminal front end.
CLI_REQUESTS_TOOL = "[turn {turn}] model requests tool: {name}({args})"
CLI_TOOL_RETURNED = "[turn {turn}] tool returned: {result}"
CLI_WRAPS_UP = "[turn {turn}] model wraps up ({stop_reason})"
CLI_APPROVE_PROMPT = (
    "[approve] About to run high-impact action {name}({args}) — Enter to allow / type n to decline: "
)
CLI_STOPPED = "[turn {turn}] {reason}"
CLI_INPUT_ASKS = "[input] {server} asks, before {name} can go on: {message}"
CLI_FLOW_LINE = (
    "# flow: policy.flows.sends_out lists it ({glob}): once its run has read the output of an "
    "untrusted_output tool, it asks"
)
CLI_TASK_WORKS = "[task] {server} works on {name} as a task; waiting for it to end (Ctrl-C stops)"
CLI_TASK_STATUS = "[task] {server}: {message}"
CLI_INPUT_URL = "[input] Open {url} and finish there."
CLI_INPUT_URL_DONE = "[input] Type y once finished / Enter to decline: "
CLI_INPUT_SECRET = (
    "[input] It asks for a secret ({fields}) in a form: declined (a server should ask for one by a link)."
)
CLI_INPUT_ANSWER = "[input] Enter to answer / type n to decline: "
CLI_INPUT_FIELD = "  {name} ({kind}): "
CLI_LIMIT_PROMPT = "[limit] {question} Continue with {more}? Enter to continue / type n to stop: "
CLI_NO_API_KEY = (
    "error: ANTHROPIC_API_KEY is not set. Create a key at "
    "https://console.anthropic.com/settings/keys and run: export ANTHROPIC_API_KEY=sk-ant-..."
)
CLI_USAGE = (
    'usage: python -m harness "TASK"\n'
    "       python -m harness --list-tools [--channel C…] [--team T…] [--user U…]\n"
    "       python -m harness --explain-call NAME 'JSON-ARGUMENTS' [--channel C…] [--team T…] [--user U…]\n"
    "       python -m harness --version"
)
CLI_BAD_ID = "error: {flag} must be {expected}, got {value!r}"
CLI_FLAG_TWICE = "error: {flag} is given twice"
CLI_FLAG_NEEDS_VALUE = "error: {flag} needs a value"
CLI_WHERE_ALONE = "error: --channel, --team and --user go with --list-tools or --explain-call"
CLI_REQUESTER_ANYONE = "# requester: {user} may start a run here ({key} is empty: anyone may)"
CLI_REQUESTER_TOP = "# requester: {user} may start a run here (the top level lets anyone ask)"
CLI_REQUESTER_LISTED = "# requester: {user} may start a run here ({key} lists {user})"
CLI_REQUESTER_GROUPS = (
    "# requester: {user} is not listed in {key}; they may start a run here only as a member of "
    "{groups} (user groups cannot be resolved offline: ask Slack)"
)
CLI_REQUESTER_REFUSED = (
    "# requester: {user} may not start a run here ({key} lists only {who}): their mention gets an "
    "ephemeral reply and starts nothing"
)
CLI_BUDGETS = "# budgets: per user {user}, per channel {channel} (UTC days; {key})"
CLI_BUDGET_TOKENS = "{tokens:,} tokens a day"
CLI_NO_BUDGET = "none"
# Added to the system prompt while some MCP servers' tools are deferred (`harness.tools.tool_search`):
# the model sees none of their tools until it searches, so it is told what there is to find.
SYSTEM_DEFERRED_TOOLS = (
    "More tools are loaded on demand, those of these MCP servers: {servers}. When the task needs one, "
    "find it with the tool search tool before saying no tool can do it."
)
# `--explain-call` of a tool an MCP server's `include_tools` / `exclude_tools` leave out.
WHY_LEFT_OUT = "left out by {why}: never offered nor callable"
WHY_NOT_OFFERED_HERE = "not offered under {where}: answered as an error, never run"
CLI_RULES_MAY_DECIDE = "; {rules} may decide a call by its arguments"
CLI_RULES_COUNT = "; {rules} may decide a call past a limit (what already ran)"
# `--list-tools`, after the tool lines: a tool of an MCP server its globs leave out (never offered).
CLI_LEFT_OUT = "# left out: {name} ({why})"
# `--list-tools`, after the tool lines: what each MCP server's tool definitions add to every request,
# then all the tool definitions together (estimated as JSON characters / 3, `harness.tools.tool_search`).
CLI_SERVER_COST = (
    "# mcp server {server}: {tools} tools, about {tokens:,} tokens a request ({share} of {budget})"
)
CLI_SERVER_DEFERRED = (
    "# mcp server {server}: {tools} tools, deferred ({why}): nothing a request until a search finds "
    "one, each found then loaded; about {tokens:,} tokens if all were found ({share} of {budget})"
)
CLI_TOOLS_COST = (
    "# tool definitions: about {tokens:,} tokens every request ({share} of {budget}), "
    "estimated as JSON characters / 3"
)
# `--explain-call`: one line per counting rule the call matches, and what its window holds.
CLI_COUNTER = "# counter: {rule}: {measure} per {per} by {scope}: {state}"
CLI_COUNTER_NOT_READ = (
    "not read (python -m harness reads no Redis; python -m workers explain-call does): the tier above "
    "assumes room in it; past it the call would be {tier}"
)
CLI_COUNTER_NEEDS = "not read: give {flags} to name its window; the tier above assumes room in it"
CLI_COUNTER_UNREAD = "could not be read ({scope} window): the tier above counts it as past its limit"
CLI_COUNTER_SEEN = "{seen} in the {scope} window now, this call adds {adds}: {verdict}"
CLI_COUNTER_WITHIN = "within the limit"
CLI_COUNTER_PAST = "past the limit, so {tier}"
CLI_COUNTER_NOT_NUMBER = "this call's {arg} is missing or not a number, so {tier}"
CLI_EXPLAIN_BAD_JSON = "error: --explain-call: the arguments are not a JSON object: {error}"
CLI_INTERRUPTED = "Interrupted: stopped cleanly; no tool was left running."

# Why a call has its tier (cards, turn summaries, --list-tools).
WHY_BUILTIN = "tool's own tier (built-in)"
WHY_MCP_READ_ONLY = (
    "tool's own tier (MCP readOnlyHint, trusted: trust_annotations = true for server {server})"
)
# Why a tool that claims to be read-only gets no tier of its own: the policy's default follows it.
WHY_MCP_CLAIM_NOT_TRUSTED = "readOnlyHint not trusted: trust_annotations is false for server {server}"
# Why a tool whose server asks for a person on every call asks, whatever else the policy says.
WHY_MCP_ALWAYS_ASK = "MCP _meta anthropic/requiresUserInteraction (server {server})"
RESULT_IMAGE_PLACEHOLDER = "[{kind}]"
WHY_UNKNOWN_TOOL = "no tool of that name is offered: answered as an error, never run"
WHY_DECIDED_AGAIN = "{why} (decided again right before running; it was {was})"
# A counting rule past its limit (`harness.counting`): the rule, its limit, and what its window held.
# Read back by `harness.counting.read_limit`: change them together.
WHY_LIMIT = "{rule}: {measure} per {per} by {scope}, {tail}"
WHY_LIMIT_CALLS = "max_calls = {limit}"
WHY_LIMIT_SUM = "max_sum = {limit} of {arg}"
WHY_LIMIT_RAN = "{seen} ran"
WHY_LIMIT_SUMMED = "{seen} ran, this call adds {adds}"
WHY_LIMIT_NOT_NUMBER = "this call's {arg} is missing or not a number"
WHY_LIMIT_UNREAD = "its counter could not be read"
RESULT_DENIED_LIMIT = (
    "Not executed: {name} is forbidden by policy (tier deny) past a limit: {limit}. "
    "It may run again once the window has room."
)
RESULT_NOT_OFFERED = (
    "Not executed: no tool named {name!r} is offered now, so it did not run. Available tools: {names}."
)

# MCP servers (tool results the model reads).
MCP_SERVER_AWAY = (
    "Not executed: the MCP server {server!r} is not reachable right now ({reason}), so {name} did not run. "
    "It is being started again; try later or do without it."
)
MCP_LOST = (
    "Error: the MCP server {server!r} went away during {name} (the connection broke); "
    "it is being started again."
)
MCP_LOST_OUTCOME_UNKNOWN = (
    "Outcome unknown: the MCP server {server!r} went away during {name}, after the call was sent. "
    "It may or may not have taken effect; it was NOT run again. Check before trying again."
)
MCP_CALL_FAILED = "Error: {name} failed: {error}"
# A side-effecting MCP call past its timeout: the SDK sends the server notifications/cancelled as
# the wait is given up (harness/tools/mcp.py `_timed_out`), so it was asked to stop, not left running.
MCP_TIMED_OUT_OUTCOME_UNKNOWN = (
    "Outcome unknown: {name} did not finish within {seconds:g} seconds, and the MCP server was asked "
    "to cancel it. It may have taken effect, in part or in full, before it stopped. It was NOT run "
    "again; check its effect before trying again."
)
# The description a run's requests give a tool its history names that is no longer offered (the API
# refuses a history naming a tool it is not given): harness/tools/registry.py `keeping`.
TOOL_NO_LONGER_OFFERED = "No longer offered: do not call it; a call of it is refused."
MCP_TOOL_GONE = (
    "Not executed: the MCP server {server!r} no longer offers {name} (its tools changed), so it did not run."
)
MCP_IMAGE_DROPPED = "[an image was left out: {why}]"
MCP_BLOB_RESOURCE = "(binary resource {uri}, not shown)"
MCP_CONTENT_DROPPED = "[a block of type {kind!r} was left out: the model cannot read it]"
MCP_AUDIO_DROPPED = "[an audio block was left out: the model cannot hear audio]"
MCP_IMAGE_TYPE = "{mime_type!r} is not an image type the model reads (PNG, JPEG, GIF, WebP)"
MCP_IMAGE_TOO_LARGE = "{size:,} characters of base64, more than the {limit:,} allowed per image"
MCP_IMAGE_TOO_MANY = "more than {limit} images in one result"
MCP_IMAGES_TOO_LARGE = "the result's images together would pass {limit:,} characters of base64"
MCP_IMAGE_NOT_BASE64 = "its data is not base64"
MCP_IMAGE_NOT_ITS_TYPE = "its bytes are not a {mime_type} image"
MCP_BLOCKS_LEFT_OUT = "[{count:,} more content blocks were left out]"
MCP_STRUCTURED_UNREADABLE = "(structured content too deeply nested to show)"
MCP_SAME_AS_BLOCK = "[the same as content block {number}]"
MCP_ANSWER_TOO_LARGE = (
    "the server answered with more than {limit} in one message, which was not read "
    "(the call did reach the server)"
)
MCP_EMPTY_RESULT = "(the tool returned nothing)"
MCP_INPUT_WAITING = "(waiting: the server of {name} asked the requester for input)"
MCP_INPUT_REFUSED = (
    "Error: {name} asked for input this client cannot put to a person: {why}. Nothing was asked."
)
MCP_INPUT_ROUNDS = "Error: {name} asked for input {rounds} times in one call; the call was given up."
# MCP Tasks (harness/tools/mcp_tasks.py): a call the server answered with a task, and how it ended.
MCP_TASK_WAITING = (
    "(waiting: the MCP server {server!r} runs {name} as a task; "
    "its result answers this call when the task ends)"
)
MCP_TASK_BAD = (
    "Error: the MCP server {server!r} answered {name} with a task this client cannot follow ({why}); "
    "whether the work started is unknown."
)
MCP_TASK_FAILED = "Error: {name} ran as a task on the MCP server {server!r} and failed: {error}"
MCP_TASK_CANCELLED = "Error: the MCP server {server!r} cancelled the task of {name}: {message}"
MCP_TASK_ASKS_INPUT = (
    "Error: the task of {name} on the MCP server {server!r} asked for input while it ran, which this "
    "client cannot answer yet; the task was cancelled."
)
MCP_TASK_GONE = (
    "Error: the MCP server {server!r} no longer knows the task of {name} (it restarted?); "
    "its result is lost, and whether the work was done is unknown."
)
IMAGE_FROM_EARLIER_TURN = "[an image from an earlier turn: no longer shown; call the tool again to see it]"
IMAGE_OVER_TURN_BUDGET = (
    "[an image was left out: this turn's results already hold as many images as one request may]"
)
# Inside RESULT_BAD_INPUT: the server's inputSchema could not be used, so nothing was sent.
SCHEMA_UNUSABLE = (
    "the input could not be checked against the tool's inputSchema ({why}), so the call was not sent"
)
# Why a stdio MCP server is not started (harness/tools/sandbox.py): the log line and MCP_SERVER_AWAY.
SANDBOX_MISSING = (
    "bubblewrap (bwrap) is not installed, and stdio MCP servers run only in its sandbox: "
    "install it (Debian, Ubuntu: apt-get install bubblewrap)"
)
SANDBOX_REFUSED = (
    "bubblewrap cannot make a sandbox here ({error}), and stdio MCP servers run only in one: "
    "allow user namespaces (kernel.unprivileged_userns_clone=1; in a container, a seccomp profile "
    "that permits them)"
)
SANDBOX_WALLS_REFUSED = "it cannot be started behind its walls: {why}"
SANDBOX_NO_DIRECTORY = (
    "its directory {path} does not exist, and a stdio server writes only to its cwd, its temporary "
    "directory and its writable directories: create it, or name another in cwd / writable"
)
# Why a stdio MCP server's command cannot be run (harness/tools/mcp_command.py): the log line,
# MCP_SERVER_AWAY and `python -m workers status` fill {command} (" 'tickets-mcp'"), {where}
# (" (/usr/local/bin/tickets-mcp)") and {path} (" (/usr/bin:/bin)"); the playground's page leaves
# them empty, as it never shows a server's command.
MCP_COMMAND_NOT_ON_PATH = (
    "its command{command} is not on the PATH it is given{path}: install it, or set command to "
    "its absolute path, or give the server a PATH in its env"
)
MCP_COMMAND_NO_FILE = (
    "its command{command} does not exist{where}: install it there, or set command to where it is"
)
MCP_COMMAND_NOT_EXECUTABLE = (
    "its command{command}{where} is not an executable file: make it one (chmod +x), or set "
    "command to the program that runs it, with the file in args"
)
MCP_COMMAND_NO_INTERPRETER = (
    "its command{command}{where} is a script for '{interpreter}' (its #! line), which is not "
    "there: install it, or set command to an interpreter that is, with the script in args"
)
MCP_STDERR_CUT = " [{bytes:,} more bytes cut]"

# What the model reads in place of an old tool result cleared to keep a request within
# [limits] max_input_tokens (harness/context.py).
RESULT_CLEARED = (
    "[tool result cleared to keep the conversation within the input limit; call the tool again "
    "if you need it]"
)
RESULT_EDITED = (
    "A reviewer edited the arguments before approving; the call ran with these instead: {arguments}"
)
RESULT_EDIT_DENIED = (
    "Not executed: the reviewer's edited arguments for {name} are forbidden by policy (tier deny)."
)
PREVIEW_NEW_FILE = "(a new file: {path}, {chars:,} characters)"
PREVIEW_TOO_BIG = "({path} is too big or not text: no diff shown)"
PREVIEW_NO_CHANGE = "(no change: the file already has exactly this content)"
PREVIEW_REMOVES = "(removes {path}: {lines:,} lines, {size:,} bytes)"
PREVIEW_REMOVES_UNSHOWN = "(removes {path}: {size:,} bytes, too big or not text to show)"
PREVIEW_REMOVES_MORE = "(and {more:,} more lines)"

# A call its server worked on as a task (harness/tools/tasks.py), once the run ended it.
MCP_TASK_STOPPED = (
    "Stopped: the run was stopped while {server} worked on {name} as a task; the server was asked "
    "to cancel it. It may have taken effect, in part or in full, before it stopped. It was NOT run "
    "again; check its effect before trying again."
)
MCP_TASK_HOLDER_GONE = (
    "Outcome unknown: the worker that ran {server} ended while {server} worked on {name} as a task, "
    "and the server's process ended with it. It was NOT run again; check its effect before trying again."
)
MCP_TASK_RESULT_LOST = (
    "Outcome unknown: {server} ended its task for {name}, but its result could not be read back. "
    "It was NOT run again; check its effect before trying again."
)

# Approval receipts (`harness.receipts`): the worker's start and `python -m workers audit verify-receipt`.
RECEIPT_KEY_SHORT = (
    "{name} must be at least {least} characters "
    "(make one: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
)
RECEIPT_KEY_TO_SERVER = (
    "{key} uses ${{{name}}}: that key would let the server sign any receipt; give it its own "
    "(python -m workers audit receipt-key mcp:SERVER) in a variable of its own"
)
RECEIPT_BAD_AUDIENCE = "error: an audience is mcp:SERVER or module:MODULE, not {audience!r}"
RECEIPT_KEY_ID_BAD = "{name} must be at most 64 printable characters"
RECEIPTS_OFF = "approval receipts are off: HARNESS_RECEIPT_KEY is not set, so tools get no receipt"
RECEIPTS_ON = "approval receipts are on: every module or MCP tool call gets one (key id {kid})"
RECEIPT_MALFORMED = "not a receipt: {error}"
RECEIPT_NOT_OURS = "not an approval receipt made here: {found} (a receipt has alg {alg!r}, typ {typ!r})"
RECEIPT_OTHER_KEY = "signed with key id {kid!r}, not with this key ({ours!r}): check it with that key"
RECEIPT_BAD_SIGNATURE = "invalid signature: not signed with this key, or changed since it was signed"
RECEIPT_EXPIRED = "expired {seconds} s ago (the signature is valid)"
RECEIPT_OTHER_ARGUMENTS = (
    "the arguments given are not the ones approved: they hash to {given}, the receipt says {signed}"
)
RECEIPT_VALID = "valid: a receipt for {sub} ({aud}), {how}{by}; it expires in {seconds} s"
RECEIPT_NOT_VALID = "not valid: {problem}"
RECEIPT_NO_KEY = "error: HARNESS_RECEIPT_KEY is not set: there is no key to check a receipt with"
RECEIPT_BAD_ARGS = "error: --args is not JSON ({error})"
RECEIPT_NO_TOKEN = "error: no receipt given (pass it, or - to read it from standard input)"
