"""A process whose `/proc` entries (environment, memory) other processes of its user cannot read.

The worker and the terminal agent call `protect_process()` first: not dumpable, their own `/proc`
entries are closed to every other process of their user that lacks `CAP_SYS_PTRACE`, sandboxed or
not. Defence in depth: the walls around a stdio server (`harness.tools.sandbox`) already hide them.
This module imports nothing of the project, so a test can load it alone, as another user.
"""

from __future__ import annotations

import ctypes

_PR_SET_DUMPABLE = 4


def protect_process() -> bool:
    """Make this process not dumpable: its `/proc` entries close to other processes of its user.

    Forked children (RQ's work horses) keep it; a program it executes does not (its servers are
    started with a clean environment instead). False where the kernel has no `prctl`.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False
