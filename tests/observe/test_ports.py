"""Who holds a port a process could not listen on (`observe.ports`), read from the real /proc."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from observe import ports
from tests.stack import free_port


def test_a_port_this_process_listens_on_is_taken_and_names_this_process() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert ports.taken("127.0.0.1", port)
        assert ports.holder(port) == f"pid {os.getpid()} ({Path('/proc/self/comm').read_text().strip()})"
        line = ports.taken_line("the bot", "127.0.0.1", port)
    assert line.startswith(
        f"error: the bot cannot listen on 127.0.0.1:{port}: the port is taken by pid {os.getpid()}"
    )


def test_a_free_port_is_not_taken_and_has_no_holder() -> None:
    port = free_port()
    assert not ports.taken("127.0.0.1", port) and ports.holder(port) is None


def test_a_socket_bound_but_not_listening_holds_no_port_for_a_server() -> None:
    """Only a listener counts: a client's connection on the port's number is not its holder."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        assert ports.holder(port) is None
