"""The offline stand-in for the fleets' Network Load Balancer in front of real engines
(`make cloud-offline-engine`): what the load-generator tasks reach, and how.

- The NLB's DNS name (one for every fleet, a listener port per fleet, as stacks/load_balancer.py
  builds it) answers through testing/nlb_dns.py: one loopback address per Availability Zone, the
  order rotating, an AZ left out where the stacks' cross-zone setting says the NLB would leave it.
  The tasks reach it only through the resolver seam (LOADGEN_RESOLVER), never /etc/hosts.
- Each node address relays its listener port to the fleet's one engine process (a CPU engine per
  fleet on 2 cores), as an NLB node forwards a TCP connection to a target.
- The targets are the fleet's Auto Scaling group instances in the stand-in stack
  (testing.cloud_offline.StandInTargets): their health is moto's DescribeTargetHealth, which
  `campaign run` reads for readiness and per step; the DNS answer follows the same health.
Loopback only: every listener binds a 127.0.0.0/8 address.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from testing.nlb_dns import NlbDns, NlbDnsServer, Target, loopback_nodes

SYNC_EVERY_S = 0.5  # how often the DNS answer follows the targets' health


class Relay:
    """Accepts on (address, port) and pipes each connection to `upstream`, both ways."""

    def __init__(self, address: str, port: int, upstream: tuple[str, int]) -> None:
        self.address = address
        self.upstream = upstream
        self.accepted = 0  # connections this node took: how the load spread over the AZs
        self.server = socket.create_server((address, port), reuse_port=False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def start(self) -> Relay:
        self._thread.start()
        return self

    def _accept(self) -> None:
        self.server.settimeout(0.5)
        while not self._stop.is_set():
            try:
                client, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            client.close()  # the target refused: the client sees a reset, as through an NLB
            return
        upstream.settimeout(None)
        back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
        back.start()
        _pipe(client, upstream)
        back.join()
        client.close()
        upstream.close()

    def stop(self) -> None:
        self._stop.set()
        self.server.close()
        self._thread.join(timeout=5)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    """One direction until its sender is done; then the other side learns it (a half close), as a
    TCP connection through an NLB node does."""
    with contextlib.suppress(OSError):
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def free_port_on(addresses: Sequence[str]) -> int:
    """A port free on every one of `addresses` (each node listens on the fleet's listener port)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind((addresses[0], 0))
            port = int(probe.getsockname()[1])
        try:
            for a in addresses[1:]:
                with socket.socket() as s:
                    s.bind((a, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no port free on all of {list(addresses)}")


class StandInNlb:
    """One NLB name with a listener per fleet; its DNS follows `health(fleet) -> [(az, healthy)]`."""

    def __init__(
        self,
        name: str,
        zones: Sequence[str],
        engines: Mapping[str, str],
        health: Any,
        *,
        cross_zone: bool,
    ) -> None:
        self.name = name
        self.nodes = loopback_nodes(list(zones))  # az -> 127.0.0.x
        self.health = health
        self.dns = NlbDns(name, self.nodes, cross_zone=cross_zone)
        self.ports = {fleet: free_port_on(list(self.nodes.values())) for fleet in engines}
        self.relays = {
            (fleet, address): Relay(address, self.ports[fleet], _host_port(url))
            for fleet, url in engines.items()
            for address in self.nodes.values()
        }
        self.endpoints = {fleet: f"http://{name}:{port}" for fleet, port in self.ports.items()}
        self._server = NlbDnsServer({name: self.dns})
        self._stop = threading.Event()
        self._sync = threading.Thread(target=self._follow_health, daemon=True)

    def connections(self, fleet: str) -> dict[str, int]:
        """Per node address, the connections it took for `fleet`'s listener."""
        return {address: r.accepted for (f, address), r in self.relays.items() if f == fleet}

    @property
    def resolver_url(self) -> str:
        return self._server.url

    def _targets(self) -> list[Target]:
        return [Target(fleet, az, healthy) for fleet in self.ports for az, healthy in self.health(fleet)]

    def _follow_health(self) -> None:
        while not self._stop.wait(SYNC_EVERY_S):
            try:
                self.dns.set_targets(self._targets())
            except Exception:  # a moto call failed once: the answer keeps its last state
                continue

    def __enter__(self) -> StandInNlb:
        self.dns.set_targets(self._targets())
        for r in self.relays.values():
            r.start()
        self._server.start()
        self._sync.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._sync.join(timeout=5)
        self._server.stop()
        for r in self.relays.values():
            r.stop()


def _host_port(url: str) -> tuple[str, int]:
    u = urlsplit(url)
    assert u.hostname is not None and u.port is not None, url
    return u.hostname, u.port


class HealthScript:
    """What the stand-in's targets do over the run, in a thread: each fleet's targets pass their
    health checks one by one once its engine serves (`bring_up_every_s` apart), and during the
    first capacity step of `drop_fleet`, one of its targets drops out for `drop_s` and comes back.
    `log` keeps (unix time, fleet, healthy targets) at every change, for the test to compare with
    what the run counted per step."""

    def __init__(
        self,
        targets: Any,
        fleets: Sequence[str],
        runs_dir: Any,
        *,
        bring_up_every_s: float = 2.0,
        drop_fleet: str | None = None,
        drop_after_s: float = 3.0,
        drop_s: float = 8.0,
    ) -> None:
        self.targets, self.fleets, self.runs_dir = targets, list(fleets), runs_dir
        self.bring_up_every_s, self.drop_fleet = bring_up_every_s, drop_fleet
        self.drop_after_s, self.drop_s = drop_after_s, drop_s
        self.log: list[tuple[float, str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _note(self, fleet: str) -> None:
        self.log.append((time.time(), fleet, self.targets.healthy(fleet)))

    def _run(self) -> None:
        for fleet in self.fleets:
            self._note(fleet)
        for n in range(1, max(len(self.targets.instances[f]) for f in self.fleets) + 1):
            for fleet in self.fleets:
                if n <= len(self.targets.instances[fleet]):
                    self.targets.register(fleet, n)
                    self._note(fleet)
            if self._stop.wait(self.bring_up_every_s):
                return
        if self.drop_fleet is None:
            return
        while not self._stop.wait(0.5):  # the fleet's first capacity step has started
            if any(self.runs_dir.glob(f"*/capacity/{self.drop_fleet}/x*")):
                break
        if self._stop.wait(self.drop_after_s):
            return
        last = len(self.targets.instances[self.drop_fleet]) - 1
        self.targets.drop(self.drop_fleet, last)
        self._note(self.drop_fleet)
        self._stop.wait(self.drop_s)
        self.targets.restore(self.drop_fleet, last)
        self._note(self.drop_fleet)

    def fewest(self, fleet: str, start: float, end: float) -> int:
        """The fewest healthy targets of `fleet` at any moment of [start, end], from the log."""
        at_start = [n for t, f, n in self.log if f == fleet and t <= start]
        inside = [n for t, f, n in self.log if f == fleet and start < t <= end]
        return min(([at_start[-1]] if at_start else []) + inside)

    def __enter__(self) -> HealthScript:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
