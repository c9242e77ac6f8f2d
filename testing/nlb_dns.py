"""An offline stand-in for a Network Load Balancer's DNS name, served as a loopback answer source.

What it models (the Elastic Load Balancing user guides; awsdocs/elb-user-guide
doc_source/how-elastic-load-balancing-works.md, awsdocs/elb-network-load-balancers-user-guide
doc_source/target-group-health-checks.md and doc_source/target-group-health.md):
- the name resolves to the IP addresses of the load balancer nodes, one per enabled Availability
  Zone, and the client picks one (ELB guide, Request routing); answers rotate their order, so
  clients that take the first address still spread over the nodes, as DNS round robin does;
- cross-zone load balancing off (an NLB's default): an AZ stays in DNS only while every target
  group has a healthy target in that AZ ("If one or more target groups does not have a healthy
  target in an enabled Availability Zone, we remove the IP address for the corresponding subnet
  from DNS");
- cross-zone on: a node routes to healthy targets in every enabled AZ, so an AZ stays in DNS while
  every target group has a healthy target in any enabled AZ (AWS re:Post knowledge center,
  "elb-dns-cross-zone-balance-configuration"; target group health: with cross-zone on the
  thresholds apply to the targets of all enabled zones together);
- fail open: when no AZ qualifies, every node's address is in DNS ("If there are no enabled
  Availability Zones with a healthy target in each target group, requests are routed to targets in
  all enabled Availability Zones"; "if all load balancer zones are considered unhealthy, the load
  balancer sends traffic to all zones"). An empty target group therefore fails open too.
The default target-group health threshold (one healthy target) is the one modelled; the stacks
set no other. Our stacks put every fleet's target group behind one NLB, so one fleet's unhealthy
AZ leaves the DNS of the other's listener too when cross-zone is off: `NlbDns` takes the targets
of every target group.

API (what `make cloud-offline-engine` wires in):

    dns = NlbDns("nlb.internal", loopback_nodes(["us-east-1a", "us-east-1b"]), cross_zone=False)
    dns.set_targets([Target("g6", "us-east-1a", healthy=True), ...])   # again whenever health changes
    with NlbDnsServer({"nlb.internal": dns}) as server:
        ...  # start workers with LOADGEN_RESOLVER=server.url and LOCUST_HOST=http://nlb.internal:<listener port>

Each node address (127.0.0.2, 127.0.0.3, ...) must then be served on the listener's port, e.g.
by a per-AZ emulator bound to that address. Loopback only: nothing here listens elsewhere.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

from loadgen.resolver import encode_answer


@dataclass(frozen=True)
class Target:
    target_group: str  # one per fleet listener
    az: str
    healthy: bool


def zones_in_dns(zones: Sequence[str], targets: Iterable[Target], *, cross_zone: bool) -> list[str]:
    """The enabled AZs (in `zones` order) whose node addresses the NLB's DNS answers with."""
    enabled = set(zones)
    mine = [t for t in targets if t.az in enabled]  # targets in an AZ not enabled receive nothing
    groups = {t.target_group for t in mine}
    healthy = {(t.target_group, t.az) for t in mine if t.healthy}
    healthy_groups = {g for g, _ in healthy}

    def in_dns(az: str) -> bool:
        if cross_zone:
            return groups <= healthy_groups
        return all((g, az) in healthy for g in groups)

    kept = [az for az in zones if in_dns(az)] if groups else []
    return kept or list(zones)  # fail open


def loopback_nodes(zones: Sequence[str], first: int = 2) -> dict[str, str]:
    """One loopback node address per AZ: 127.0.0.2, 127.0.0.3, ... (127.0.0.1 left to the rest)."""
    if len(set(zones)) != len(zones):
        raise ValueError(f"zones: {list(zones)} names an AZ twice")
    if first < 1 or first + len(zones) > 255:
        raise ValueError(f"first: 127.0.0.{first} + {len(zones)} zones leaves 127.0.0.0/24")
    return {az: f"127.0.0.{first + i}" for i, az in enumerate(zones)}


class NlbDns:
    """One NLB's DNS name: its node address per enabled AZ, its cross-zone setting, and the
    health of its targets, which the caller updates. Thread-safe."""

    def __init__(
        self, name: str, nodes: Mapping[str, str], *, cross_zone: bool, targets: Iterable[Target] = ()
    ) -> None:
        if not nodes:
            raise ValueError(f"nodes: NLB {name} needs at least one enabled AZ")
        for az, ip in nodes.items():
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise ValueError(f"nodes[{az}]: {ip!r} is not an IP address") from None
        self.name = name
        self.nodes = dict(nodes)
        self.cross_zone = cross_zone
        self._lock = threading.Lock()
        self._targets: list[Target] = []
        self._turn = 0
        self.set_targets(targets)

    def set_targets(self, targets: Iterable[Target]) -> None:
        """The target table as it is now (every target group, every AZ)."""
        table = list(targets)
        unknown = sorted({t.az for t in table} - set(self.nodes))
        if unknown:
            raise ValueError(
                f"targets: AZ {', '.join(unknown)} is not enabled on NLB {self.name} ({sorted(self.nodes)})"
            )
        with self._lock:
            self._targets = table

    def zones(self) -> list[str]:
        with self._lock:
            targets = list(self._targets)
        return zones_in_dns(list(self.nodes), targets, cross_zone=self.cross_zone)

    def answer(self) -> list[str]:
        """The node addresses in DNS now, the order rotated by one on every answer."""
        addresses = [self.nodes[az] for az in self.zones()]
        with self._lock:
            k = self._turn % len(addresses)
            self._turn += 1
        return addresses[k:] + addresses[:k]


class NlbDnsServer:
    """Serves `names` as a loopback answer source (loadgen/resolver.py's contract): `url` is what
    LOADGEN_RESOLVER takes. A name it does not know answers 404, as a DNS NXDOMAIN fails a lookup."""

    def __init__(self, names: Mapping[str, NlbDns], host: str = "127.0.0.1", port: int = 0) -> None:
        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"host: {host} is not a loopback address")
        self.names = dict(names)
        self.asked: list[str] = []  # every name looked up, in order
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                name = parse_qs(urlsplit(self.path).query).get("name", [""])[0]
                server.asked.append(name)
                dns = server.names.get(name)
                if dns is None:
                    self._reply(404, f"no such name: {name!r}".encode())
                else:
                    self._reply(200, encode_answer(name, dns.answer()))

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json" if status == 200 else "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # quiet: workers look up every 5 s
                pass

        self._http = ThreadingHTTPServer((host, port), Handler)
        self._http.daemon_threads = True
        netloc = f"[{host}]" if ":" in host else host
        self.url = f"http://{netloc}:{self._http.server_address[1]}/nlb-dns"
        self._thread: threading.Thread | None = None

    def start(self) -> NlbDnsServer:
        self._thread = threading.Thread(target=self._http.serve_forever, name="nlb-dns", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._http.shutdown()
            self._thread.join(10)
            self._thread = None
        self._http.server_close()

    def __enter__(self) -> NlbDnsServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
