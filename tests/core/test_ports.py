"""core.ports: ports handed out to other processes stay clear of the ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from core import ports


@pytest.fixture
def ephemeral(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    f = tmp_path / "ip_local_port_range"
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", f)
    return f


def test_ports_come_from_outside_the_ephemeral_range(ephemeral: Path) -> None:
    # The CI failure this prevents: a task's metrics port, picked by bind(0), was taken as the
    # local port of one of the replay's outgoing connections before the task bound it.
    ephemeral.write_text("20000\t60999\n")
    got = [ports.free_port() for _ in range(50)]
    assert all(ports.LOWEST <= p < 20000 or p > 60999 for p in got), got
    assert len(set(got)) > 1


def test_a_span_is_free_as_a_whole(ephemeral: Path) -> None:
    ephemeral.write_text("32768 60999")
    taken = []
    try:
        for _ in range(20):  # occupy ports, then ask for spans: none may overlap a bound port
            s = socket.socket()
            s.bind(("127.0.0.1", ports.free_port()))
            taken.append(s)
        bound = {s.getsockname()[1] for s in taken}
        for _ in range(20):
            p = ports.free_port(width=4)
            assert not bound & set(range(p, p + 4))
            assert p + 3 <= 65535 and not 32768 <= p + 3 <= 60999
    finally:
        for s in taken:
            s.close()


def test_an_unknown_range_keeps_clear_of_linux_and_macos_defaults(ephemeral: Path) -> None:
    # No /proc file (macOS): Linux's 32768-60999 and macOS's 49152-65535 are both avoided; the
    # Linux default alone handed out ports in 61000-65535, macOS's own outgoing range.
    got = [ports.free_port() for _ in range(50)]  # the file does not exist
    assert all(ports.LOWEST <= p < 32768 for p in got), got
    ephemeral.write_text("garbage")
    assert ports.ephemeral_range() == (32768, 65535)


def test_no_room_outside_the_range_still_gives_a_port(ephemeral: Path) -> None:
    ephemeral.write_text("1024 65535")
    p = ports.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", p))


def test_spans_handed_out_together_never_overlap(ephemeral: Path) -> None:
    # Each fleet's Locust workers bind port..port+width-1 later; two fleets' spans picked one after
    # another, both free and unbound at the time, could share a port. Room for 2 spans of 2 here.
    ephemeral.write_text(f"{ports.LOWEST + 4} 65535")
    for _ in range(20):
        first = ports.free_port(width=2)
        second = ports.free_port(width=2, avoid=range(first, first + 2))
        assert second not in (first - 1, first, first + 1), (first, second)
