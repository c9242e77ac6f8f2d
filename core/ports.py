"""Loopback ports for the processes a run starts (servers, Locust masters, Prometheus).

A port is handed out now and bound later, by another process. Asking the kernel for port 0
gives one from the ephemeral range, the same range every outgoing connection on the machine
takes its local port from: under load (a replay opens hundreds of connections) one of them
can take the port before its server binds it ("address in use" in a task's setup). So the
ports come from outside that range, picked at random and checked free.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Collection
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Without that file (macOS, or no /proc) the range is not known: the widest of the usual
# defaults, Linux's 32768-60999 (ip(7): net.ipv4.ip_local_port_range) and macOS's and IANA's
# 49152-65535 (RFC 6335, section 6), so a laptop's outgoing connections cannot take the port.
UNKNOWN_EPHEMERAL_DEFAULT = (32768, 65535)
LOWEST = 10000  # above the registered ports services commonly listen on (8080, 9090, ...)
_rng = random.SystemRandom()  # forked processes must not draw the same sequence


def ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = (int(v) for v in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return UNKNOWN_EPHEMERAL_DEFAULT
    return lo, hi


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", width: int = 1, avoid: Collection[int] = ()) -> int:
    """A port p free right now, with p+1 .. p+width-1 free too, outside the ephemeral range and
    `avoid` (ports handed out already but not bound yet); a second campaign on the same machine
    gets a different one."""
    lo, hi = ephemeral_range()
    spans = [(a, b - width + 1) for a, b in ((LOWEST, lo - 1), (hi + 1, 65535)) if b - width + 1 >= a]
    taken = set(avoid)
    for _ in range(200):
        if not spans:
            break
        a, b = _rng.choice(spans)
        p = _rng.randint(a, b)
        block = range(p, p + width)
        if taken.isdisjoint(block) and all(_bindable(host, q) for q in block):
            return p
    # No room outside the ephemeral range (a machine configured to use it all): the kernel's pick.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
