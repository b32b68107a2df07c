"""Where egress may go: which addresses are public, which names an allow-list lets through, and
what a name resolves to. Pure functions of an address or a name (resolving aside), apart from the
proxy that asks them, so the policy can be read, and tested with a table of cases, on its own.

What a request may reach. The proxy resolves the host name itself and connects only to the very
address it checked (no second resolution, so DNS rebinding between check and connect is moot):

- every address the name resolves to must be public (`is_public`): if any one is not, the whole
  name is refused, so a name cannot smuggle a private address in among public ones and rely on
  which one a retry picks. Literal addresses go through the same resolution, so the forms the
  resolver accepts (`2130706433`, `0x7f.1`, `[::ffff:127.0.0.1]`) are judged by what they mean;
- public means routable on the internet: not loopback, private, link-local (the cloud metadata
  address 169.254.169.254 included), CGNAT, multicast, reserved, unspecified, documentation or
  benchmarking ranges, and not an IPv6 form that embeds such an IPv4 address (IPv4-mapped, 6to4,
  NAT64 64:ff9b::/96). Teredo, the local NAT64 prefix, the rest of ::/8 and scoped addresses are
  refused outright;
- any port of a public address: what a public host serves on which port is its own business, and
  a port list would only break servers that talk to, say, a database in the cloud;
- with an allow-list (`open_door(server, hosts=[...])`), only the names listed, matched
  case-insensitively on the name the client asked for, before any resolution. `api.github.com`
  matches itself; `*.example.com` matches one label or more in front of `example.com`
  (`a.example.com`, `a.b.example.com`) but not `example.com`. An address literal matches only a
  pattern that spells it (never a wildcard). The allow-list narrows, it never widens: a listed
  name must still resolve to public addresses only.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
from collections.abc import Callable, Sequence
from typing import TypeAlias

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver: TypeAlias = Callable[[str, int], list[IPAddress]]


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_RESERVED_V6 = ipaddress.IPv6Network("::/8")  # ::, ::1, IPv4-compatible, NAT64 (handled first)
_TEREDO = ipaddress.IPv6Network("2001::/32")
_CGNAT = ipaddress.IPv4Network("100.64.0.0/10")


def is_public(address: IPAddress) -> bool:
    """Whether a connection to `address` would leave for the public internet, and only there.

    `is_global` alone is not enough on Python 3.11 (it calls multicast, fec0::/10 and ::7f00:1
    global), so each special kind is refused by name as well, and an IPv6 form that carries an
    IPv4 address is judged by that address.
    """
    if isinstance(address, ipaddress.IPv4Address):
        return _public_v4(address)
    if address.scope_id:
        return False
    embedded = address.ipv4_mapped or address.sixtofour
    if embedded is None and address in _NAT64:
        embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if embedded is not None:
        return _public_v4(embedded)
    if address in _RESERVED_V6 or address in _TEREDO:
        return False
    special = (
        address.is_multicast
        or address.is_private
        or address.is_reserved
        or address.is_loopback
        or address.is_link_local
        or address.is_site_local
        or address.is_unspecified
    )
    return address.is_global and not special


def _public_v4(address: ipaddress.IPv4Address) -> bool:
    special = (
        address.is_multicast
        or address.is_private
        or address.is_reserved
        or address.is_loopback
        or address.is_link_local
        or address.is_unspecified
        or address in _CGNAT
    )
    return address.is_global and not special


def resolve_host(host: str, port: int) -> list[IPAddress]:
    """Every address `getaddrinfo` gives for a TCP connection to `host` (blocking)."""
    found: list[IPAddress] = []
    for family, _, _, _, sockaddr in socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    ):
        if family in (socket.AF_INET, socket.AF_INET6):
            try:
                found.append(ipaddress.ip_address(sockaddr[0]))
            except ValueError as error:  # never connect to what could not be checked
                raise OSError(f"unreadable address for {host}") from error
    return found


_LABEL = r"[a-z0-9_-]{1,63}"
HOST_NAME = re.compile(rf"(?:{_LABEL}\.)*{_LABEL}")
_PATTERN = re.compile(rf"(?:\*\.)?(?:{_LABEL}\.)*{_LABEL}")


def normal_host(host: str) -> str:
    """A host as compared and resolved: lower case, no trailing dot, IPv6 in its short form."""
    host = host.lower().removesuffix(".")
    if ":" in host:
        with contextlib.suppress(ValueError):
            return ipaddress.IPv6Address(host).compressed
    return host


def _is_literal(host: str) -> bool:
    """Whether the resolver would read `host` as an address (inet_aton's forms, or IPv6)."""
    if ":" in host:
        return True
    try:
        socket.inet_aton(host)
    except OSError:
        return False
    return True


def check_patterns(hosts: Sequence[str]) -> tuple[str, ...]:
    """The allow-list in normal form; a ValueError names the first pattern that is none."""
    patterns = []
    for pattern in hosts:
        normal = normal_host(pattern)
        if not (_PATTERN.fullmatch(normal) or ":" in normal and is_v6(normal)):
            raise ValueError(f"not a host name or pattern: {pattern!r}")
        patterns.append(normal)
    return tuple(patterns)


def is_v6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def host_allowed(host: str, patterns: Sequence[str]) -> bool:
    """Whether the name a client asked for is on the allow-list (patterns from `check_patterns`)."""
    host = normal_host(host)
    literal = _is_literal(host)
    for pattern in patterns:
        if pattern.startswith("*."):
            if not literal and host.endswith(pattern[1:]):
                return True
        elif host == pattern:
            return True
    return False
