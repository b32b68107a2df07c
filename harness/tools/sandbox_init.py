"""The first program in a stdio MCP server's sandbox: it closes the last doors, then runs the server.

Run by bubblewrap as `python -I -S sandbox_init.py [--egress DOOR --port N] -- PROGRAM ARGS…`,
inside the sandbox's namespaces, as a script (it imports nothing of the project: only the standard
library of the interpreter that runs it). It

1. takes `PWD` out of the environment (bubblewrap sets it, whatever it was told);
2. with `--egress`: listens on 127.0.0.1:N in the sandbox's own network namespace and connects
   once to DOOR, the Unix socket of the worker's egress proxy (`harness.tools.egress`) bound into
   the sandbox. Each connection accepted on N is handed over that door as a file descriptor
   (SCM_RIGHTS); the proxy serves it, to public addresses only. The server reaches it through
   `HTTP_PROXY`/`HTTPS_PROXY` and has no other way out;
3. installs a seccomp filter (after `PR_SET_NO_NEW_PRIVS`, so it binds every process started
   from here on and cannot be undone), refusing:
   - `socket()` of any family but IPv4, IPv6 and netlink: a read-only mount does not stop a
     `connect()` to a Unix socket file (Redis's, Docker's, the bot's), so no new Unix socket is
     made at all (`socketpair()` stays: it reaches nothing); no vsock, which no namespace covers;
   - new namespaces (`unshare`, `setns`, `clone` with a namespace flag; `clone3` answers ENOSYS,
     which C libraries take as "use clone"), mounts, `chroot`, `pivot_root`;
   - `ptrace`, `process_vm_readv`/`writev` (this program holds the door), the kernel keyrings,
     `bpf`, `perf_event_open`, `userfaultfd`, and io_uring (which makes sockets past seccomp);
   - system calls of another ABI than the native one (i386 or x32 on x86-64);
4. becomes the server (`exec`), or, with `--egress`, starts it as its child and hands connections
   over until it ends, then ends with its status.

A filter that cannot be installed (an unknown architecture, a kernel without seccomp) ends this
program with one line on stderr and status 126 before the server is started; a program that cannot
be run in here (it vanished since the worker looked for it, or its `#!` interpreter is not there)
with one line and status 127.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import signal
import socket
import struct
import sys
import threading

EXIT_REFUSED = 126
EXIT_NOT_FOUND = 127  # the server's program (or its #! interpreter) cannot be run in here, as a shell says
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2

_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg 0's low half: little endian)

_EPERM, _EACCES, _ENOSYS = 1, 13, 38
_FAMILIES = (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK)
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
_CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# Per architecture: its AUDIT_ARCH, whether x32 numbers must be refused, and the system calls.
_ARCHES = {
    "x86_64": (0xC000003E, True),
    "aarch64": (0xC00000B7, False),
}
_SYSCALLS = {  # name: (x86_64, aarch64)
    "socket": (41, 198),
    "clone": (56, 220),
    "clone3": (435, 435),
    "unshare": (272, 97),
    "setns": (308, 268),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "keyctl": (250, 219),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
}
_REFUSED = {  # name: errno
    **dict.fromkeys(("unshare", "setns", "mount", "umount2", "pivot_root", "chroot"), _EPERM),
    **dict.fromkeys(("open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick"), _EPERM),
    **dict.fromkeys(("mount_setattr", "ptrace", "process_vm_readv", "process_vm_writev"), _EPERM),
    **dict.fromkeys(("add_key", "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd"), _EPERM),
    **dict.fromkeys(("clone3", "io_uring_setup", "io_uring_enter", "io_uring_register"), _ENOSYS),
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_program(machine: str) -> bytes:
    """The filter (classic BPF) for `machine` (`platform.machine()`); `ValueError` if unknown."""
    if machine not in _ARCHES:
        raise ValueError(f"no seccomp filter for the {machine} architecture")
    audit_arch, x32 = _ARCHES[machine]
    column = 0 if machine == "x86_64" else 1
    nr = {name: numbers[column] for name, numbers in _SYSCALLS.items()}
    refuse = _RET_ERRNO | _EPERM
    ops = [_op(_LD_ABS, _ARCH), _op(_JEQ, audit_arch, 1, 0), _op(_RET, refuse), _op(_LD_ABS, _NR)]
    if x32:
        ops += [_op(_JGE, 0x40000000, 0, 1), _op(_RET, refuse)]
    for name, errno in _REFUSED.items():
        ops += [_op(_JEQ, nr[name], 0, 1), _op(_RET, _RET_ERRNO | errno)]
    # clone: a namespace flag is refused; the rest goes on.
    ops += [_op(_JEQ, nr["clone"], 0, 4), _op(_LD_ABS, _ARG0), _op(_JSET, _CLONE_NAMESPACES, 0, 1)]
    ops += [_op(_RET, refuse), _op(_RET, _RET_ALLOW)]
    # socket: only the families that stay inside the sandbox's own network namespace.
    families = len(_FAMILIES)
    ops += [_op(_JEQ, nr["socket"], 0, families + 2), _op(_LD_ABS, _ARG0)]
    for i, family in enumerate(_FAMILIES):
        ops.append(_op(_JEQ, family, families - i, 0))
    ops += [_op(_RET, _RET_ERRNO | _EACCES), _op(_RET, _RET_ALLOW)]
    ops.append(_op(_RET, _RET_ALLOW))
    return b"".join(ops)


def install_filter() -> None:
    """No new privileges, then the filter, for this process and all it starts; `OSError` if not."""
    program = seccomp_program(platform.machine())
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    buffer = ctypes.create_string_buffer(program, len(program))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(program) // 8, ctypes.addressof(buffer))
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def _hand_over(listener: socket.socket, door: socket.socket) -> None:
    """Each connection accepted on `listener` goes to the egress proxy over `door`, as a descriptor."""
    while True:
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        # The proxy gone, the connection closes, as a refused one would.
        with connection, contextlib.suppress(OSError):
            socket.send_fds(door, [b"c"], [connection.fileno()])


def main(argv: list[str]) -> int:
    try:
        split = argv.index("--")
    except ValueError:
        print("sandbox_init: usage: [--egress DOOR --port N] -- PROGRAM ARGS", file=sys.stderr)
        return 2
    options, command = argv[:split], argv[split + 1 :]
    os.environ.pop("PWD", None)
    listener = door = None
    if options[:1] == ["--egress"]:
        door = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        door.connect(options[1])
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", int(options[3])))
        listener.listen(64)
    try:
        install_filter()
    except (OSError, ValueError) as exc:
        print(f"harness sandbox: cannot install the seccomp filter ({exc})", file=sys.stderr)
        return EXIT_REFUSED
    if listener is None or door is None:
        return _become(command)
    pid = os.fork()
    if pid == 0:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        listener.close()
        door.close()
        os._exit(_become(command))
    # The server's stdin and stdout are its own: this process must not hold them open.
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    threading.Thread(target=_hand_over, args=(listener, door), daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: os.kill(pid, number))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue
    return os.waitstatus_to_exitcode(status) % 256


def _become(command: list[str]) -> int:
    """Become the server; if its program cannot be run in here, one line says so (not a traceback)."""
    try:
        os.execv(command[0], command)
    except OSError as exc:
        print(f"harness sandbox: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
    return EXIT_NOT_FOUND


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
