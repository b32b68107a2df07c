"""The walls around a stdio MCP server: what of the machine it sees, and where it may write.

A stdio server is a program the operator names, but what it does is its own (and its package's,
and whatever a prompt talks it into). The sandbox (`harness.tools.sandbox`) gives it a fresh
`/proc`, no network and no secrets in its environment; this module decides its filesystem, as
bubblewrap mount operations, from four lists:

- **masked**: `/tmp`, `/var/tmp` (its own empty temporary directories, writable) and `/run`,
  `/var/run` (empty, read-only): other processes' sockets, locks and `/run/secrets` are not there;
- **secret**: what it may not see at all: the `HARNESS_CONFIG` file, `HARNESS_AUDIT_DIR`, every
  `.env*` entry of the process's working directory, the usual credential places of the process's
  user (`CREDENTIAL_PLACES` under `$HOME` and under the user's home in the password database),
  files named by credential variables of the process (`GOOGLE_APPLICATION_CREDENTIALS`, `…_FILE`),
  and the directories the caller hides (the relay's);
- **needed**: its command (and the virtual environment it lives in), every file or directory its
  arguments name, and the interpreter and script of the sandbox's own first process: readable,
  even where they lie under a masked directory;
- **writable**: its `cwd` and the directories of its `writable` key.

Everything else is the machine's filesystem, read-only. A secret is hidden by *rebuilding* the
directory that holds it: an empty read-only tmpfs in its place, with every other entry bound back
one by one (a symlink made again as a symlink). Binding `/dev/null` over the secret instead would
leave a hole: a file the operator replaces later by rename (as editors and config tools do) is a
new inode at the same path, and a mount on the old one hides nothing. Here, an entry that appears
in that directory after the server starts is simply not in its view.

A `cwd` or `writable` directory that holds a secret, lies inside one, or holds the process's own
code (its working directory, its Python environment) is refused: the server would be able to
replace what decides the policy, or the code that enforces it. So is a command or argument that
names a secret. Each refusal is a `WallsRefused` whose message says what and how to fix it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import stat
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# Under a user's home: the places tools keep credentials, tokens, keys and shell histories (which
# hold passwords typed on a command line, `redis-cli -a`, `AUTH`).
CREDENTIAL_PLACES = (
    ".ssh",
    ".aws",
    ".config/gcloud",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".gnupg",
    ".azure",
    ".oci",
    ".config/gh",
    ".config/hub",
    ".config/doctl",
    ".config/op",
    ".npmrc",
    ".yarnrc",
    ".pypirc",
    ".pgpass",
    ".my.cnf",
    ".vault-token",
    ".terraform.d",
    ".password-store",
    ".local/share/keyrings",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".gem/credentials",
    ".m2/settings.xml",
    ".bash_history",
    ".zsh_history",
    ".python_history",
    ".psql_history",
    ".mysql_history",
    ".rediscli_history",
    ".node_repl_history",
    ".claude",
    ".claude.json",
)
# Variables that name a credential file by convention; any other `…_FILE` variable is taken as one
# too (Docker's `POSTGRES_PASSWORD_FILE`, Terraform's `TF_CLI_CONFIG_FILE`), bar certificates.
CREDENTIAL_VARIABLES = frozenset(
    {
        "GOOGLE_APPLICATION_CREDENTIALS",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_CONFIG_FILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AZURE_CONFIG_DIR",
        "CLOUDSDK_CONFIG",
        "KUBECONFIG",
        "DOCKER_CONFIG",
        "NETRC",
        "GNUPGHOME",
        "PGPASSFILE",
        "VAULT_CONFIG_PATH",
    }
)
_PUBLIC = re.compile(r"CERT|(?:^|_)CA_")  # `SSL_CERT_FILE`, `…_CA_CERTS_FILE`: certificates, public
TEMPORARY = ("/tmp", "/var/tmp")  # masked and writable: the server's own temporary directories
RUNTIME = ("/run", "/var/run")  # masked, read-only
_ENV_ENTRY = re.compile(r"\.env.*")


class WallsRefused(ValueError):
    """A server cannot be started behind its walls as configured; the message says how to fix it."""


@dataclass(frozen=True)
class Places:
    """The facts of this process the walls are built from (taken once, from its environment)."""

    config: str | None = None  # HARNESS_CONFIG, absolute
    audit_dir: str | None = None  # HARNESS_AUDIT_DIR, absolute
    workdir: str = "/"  # the process's working directory
    homes: tuple[str, ...] = ()  # $HOME and the user's home in the password database
    credential_files: tuple[str, ...] = ()  # named by credential variables
    code: tuple[str, ...] = ()  # its Python environments and packages: never writable, nor inside
    import_roots: tuple[str, ...] = ()  # where it imports from (sys.path): never a writable's own
    hidden: tuple[str, ...] = ()  # the caller's (the relay's directory)

    @classmethod
    def of_process(cls, environ: Mapping[str, str], hidden: Sequence[str] = ()) -> Places:
        """The places of this process, as `environ` and the password database tell them."""
        workdir = os.getcwd()

        def absolute(path: str | None) -> str | None:
            return os.path.abspath(os.path.join(workdir, path)) if path else None

        homes = [environ.get("HOME", "")]
        with contextlib.suppress(KeyError):
            homes.append(pwd.getpwuid(os.geteuid()).pw_dir)
        files = []
        for name, value in environ.items():
            named = name in CREDENTIAL_VARIABLES or (name.endswith("_FILE") and not _PUBLIC.search(name))
            if named and value:
                files += [p for p in value.split(os.pathsep) if os.path.isabs(p)]
        return cls(
            config=absolute(environ.get("HARNESS_CONFIG")),
            audit_dir=absolute(environ.get("HARNESS_AUDIT_DIR")),
            workdir=workdir,
            homes=tuple(dict.fromkeys(h for h in homes if os.path.isabs(h) and h != "/")),
            credential_files=tuple(files),
            code=_real(sys.prefix, sys.base_prefix, *_packages()),
            import_roots=_real(*(p for p in sys.path if p and os.path.isdir(p))),
            hidden=tuple(os.path.abspath(h) for h in hidden),
        )

    def secrets(self) -> list[str]:
        """Every secret path that exists, as given and as its symlinks resolve."""
        found: list[str] = []
        candidates = [self.config, self.audit_dir, *self.credential_files, *self.hidden]
        for home in self.homes:
            candidates += [os.path.join(home, place) for place in CREDENTIAL_PLACES]
        with contextlib.suppress(OSError):
            candidates += [
                os.path.join(self.workdir, e.name)
                for e in os.scandir(self.workdir)
                if _ENV_ENTRY.match(e.name)
            ]
        for path in candidates:
            if path and os.path.lexists(path):
                found.append(os.path.normpath(path))
                found.append(os.path.realpath(path))
        return list(dict.fromkeys(found))


@dataclass(frozen=True)
class Plan:
    """A server's filesystem as bubblewrap arguments, and the directory it starts in."""

    args: tuple[str, ...]
    cwd: str


def plan(
    places: Places,
    *,
    cwd: str,
    writable: Sequence[str] = (),
    needed: Iterable[str] = (),
    programs: Iterable[str] = (),
    bound: Sequence[tuple[str, str]] = (),
) -> Plan:
    """The mounts that give a server its view: `WallsRefused` when it cannot have one.

    `cwd` and `writable` are absolute directories that exist; `needed` are paths (the command, the
    paths its arguments name, the sandbox's own program) to keep readable where they exist;
    `programs` are where programs live (the command, as given and as its links resolve): under a
    masked directory, the whole directory they stand in right below it stays readable, since a
    program reads its neighbours (a Node package its `node_modules`, a venv its `lib`);
    `bound` are (source, target) pairs bound read-only at a target under `/run` (the egress door).
    """
    secrets = places.secrets()
    writable = tuple(dict.fromkeys(os.path.realpath(w) for w in (cwd, *writable)))
    for directory in writable:
        _check_writable(directory, secrets, places)
    shown = [os.path.realpath(p) for p in needed if os.path.lexists(p)]
    shown += [top for p in programs if (top := _top_under_mask(p)) is not None]
    for path in shown:
        if (secret := _covering(path, secrets)) is not None:
            raise WallsRefused(
                f"{path} lies in {secret}, which a stdio server may never see (a secret of the worker); "
                "name another path in its command and args"
            )
    ops: list[tuple[int, int, list[str]]] = []  # (depth, order, args): shallow first, stable

    def add(path: str, args: list[str]) -> None:
        ops.append((_depth(path), len(ops), args))

    add("/", _rebuilt("/", secrets, skip={"proc", "dev", "sys", "tmp", "run"}))
    add("/proc", ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"])
    add("/proc", ["--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger"])
    add("/dev", ["--dev", "/dev"])
    add("/sys", ["--ro-bind-try", "/sys", "/sys"])
    masks = [*TEMPORARY, *(r for r in RUNTIME if not os.path.islink(r))]
    for masked in masks:
        if os.path.isdir(masked) and not os.path.islink(masked):
            add(masked, ["--tmpfs", masked])
    for source, target in bound:
        add(target, ["--ro-bind", source, target])
    exposed = [p for p in shown if _under_any(p, masks)]
    for path in exposed:
        add(path, ["--ro-bind", path, path])
    rebuilt = {"/"}
    read_only = {"/", *(r for r in RUNTIME if r in masks and os.path.isdir(r))}
    for secret in secrets:
        parent = os.path.dirname(secret)
        if parent in rebuilt or (_under_any(parent, masks) and not _under_any(parent, [*exposed, *writable])):
            continue  # already hidden: under an empty mask, or its directory already rebuilt
        rebuilt.add(parent)
        read_only.add(parent)
        add(parent, _rebuilt(parent, secrets))
    args = [arg for _, _, part in sorted(ops) for arg in part]
    for directory in writable:  # last: over whatever read-only view the path had
        args += ["--bind", directory, directory]
    for directory in sorted(read_only, key=_depth, reverse=True):
        args += ["--remount-ro", directory]
    return Plan(tuple(args), writable[0])


def _top_under_mask(path: str) -> str | None:
    """`/tmp/checkout` for `/tmp/checkout/.venv/bin/python`: the directory right below the masked
    one that holds `path`; None when `path` is under no mask."""
    for masked in (*TEMPORARY, *RUNTIME):
        if _inside(path, masked) and path != masked:
            first = path[len(masked.rstrip("/")) + 1 :].split("/", 1)[0]
            return os.path.join(masked, first)
    return None


def _rebuilt(
    directory: str, secrets: Sequence[str], skip: set[str] | frozenset[str] = frozenset()
) -> list[str]:
    """`directory` as an empty tmpfs with each of its entries but the secrets bound back, read-only."""
    args = [] if directory == "/" else ["--tmpfs", directory]
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return args
    for entry in entries:
        path = os.path.join(directory, entry.name)
        if entry.name in skip or path in secrets:
            continue
        try:
            mode = entry.stat(follow_symlinks=False).st_mode
        except OSError:
            continue
        if stat.S_ISLNK(mode):
            args += ["--symlink", os.readlink(path), path]
        elif stat.S_ISDIR(mode) or stat.S_ISREG(mode):
            args += ["--ro-bind-try", path, path]
        # sockets, FIFOs and devices are left out: a server has no business with another's
    return args


def _check_writable(directory: str, secrets: Sequence[str], places: Places) -> None:
    if (secret := _covering(directory, secrets)) is not None:
        raise WallsRefused(
            f"{directory} lies in {secret}, which a stdio server may never see; give it another directory"
        )
    for secret in secrets:
        if _inside(secret, directory):
            raise WallsRefused(
                f"{directory} holds {secret}, which a stdio server may never see nor change; "
                "give it a directory of its own (cwd, writable)"
            )
    for code in places.code:
        if _inside(code, directory) or _inside(directory, code):
            raise WallsRefused(
                f"{directory} and {code} overlap: a stdio server may not change the worker's own code "
                "(its Python environment, its packages); give it a directory of its own (cwd, writable)"
            )
    for root in (places.workdir, *places.import_roots):
        if _inside(root, directory):
            raise WallsRefused(
                f"{directory} holds {root}, the worker's working directory or a place it imports from, "
                "which a stdio server may not change; give it a directory of its own (cwd, writable)"
            )


def _real(*paths: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(os.path.realpath(p) for p in paths))


def _packages() -> list[str]:
    """The directories of this project's own packages (in a checkout or in site-packages)."""
    import importlib.util

    found = []
    for name in ("harness", "workers", "bot", "messages", "playground"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            found += list(spec.submodule_search_locations)
    return found


def _covering(path: str, secrets: Sequence[str]) -> str | None:
    return next((s for s in secrets if _inside(path, s)), None)


def _inside(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or lies under it."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _under_any(path: str, directories: Iterable[str]) -> bool:
    return any(_inside(path, d) for d in directories)


def _depth(path: str) -> int:
    return 0 if path == "/" else path.rstrip("/").count("/")


def private_home(state_dir: str, server: str) -> str:
    """A server's own directory (its default `cwd` and its `HOME`), kept across its restarts."""
    path = os.path.join(state_dir, "mcp", server)
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def state_directory(environ: Mapping[str, str]) -> str:
    """Where the servers' own directories live: `HARNESS_STATE_DIR`, else the XDG state home's."""
    if configured := environ.get("HARNESS_STATE_DIR"):
        return os.path.abspath(configured)
    base = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "slack-harness")
