"""Where the streaming client learns the addresses of its host name (plain Python: no gevent).

On AWS the host is the fleet NLB's DNS name, which the system resolver answers with the IP
address of the load balancer node in every enabled Availability Zone that is healthy, and the
client picks which address to use (Elastic Load Balancing User Guide, "How Elastic Load
Balancing works", Request routing; awsdocs/elb-user-guide doc_source/how-elastic-load-balancing-works.md).
Offline there is no such name, so a run may name an answer source instead (`LOADGEN_RESOLVER`,
`--resolver`): an HTTP endpoint on this machine's loopback that answers

    GET <path>?name=<host name>   ->   {"name": "<host name>", "addresses": ["127.0.0.2", ...]}

as the NLB's DNS would (testing/nlb_dns.py is one). Only IP addresses come back, as in a DNS
A/AAAA answer: the port stays the one of the host's URL (the listener's). This module holds that contract; the lookup itself
runs in the client (loadgen/client.py), on gevent's sockets.
"""

from __future__ import annotations

import ipaddress
import json
from urllib.parse import quote, urlsplit

RESOLVER_ENV = "LOADGEN_RESOLVER"


def check_resolver_url(url: str) -> str:
    """`url` as given when it is http://<loopback IP>:<port>[/path]; ValueError naming the
    setting otherwise. Loopback only: the source stands in for DNS on this machine, and a
    replay sends nothing anywhere an operator did not name as its host."""
    u = urlsplit(url)
    why = ""
    if u.scheme != "http" or not u.hostname or u.query or u.fragment:
        why = "need http://<loopback IP>:<port>[/path]"
    else:
        try:
            ip = ipaddress.ip_address(u.hostname)
        except ValueError:
            why = "the host must be an IP literal (a name would need resolving itself)"
        else:
            if not ip.is_loopback:
                why = "the answer source must listen on loopback (127.0.0.0/8 or ::1)"
        try:
            port = u.port
        except ValueError:
            port = None
        if not why and port is None:
            why = "the port is missing or not a number"
    if why:
        raise ValueError(f"resolver: {url!r}: {why}")
    return url


def query_target(url: str, name: str) -> str:
    """The request target (path and query) asking `url` for `name`."""
    path = urlsplit(url).path or "/"
    return f"{path}?name={quote(name, safe='')}"


def encode_answer(name: str, addresses: list[str]) -> bytes:
    return json.dumps({"name": name, "addresses": addresses}).encode()


def decode_answer(body: bytes, name: str, source: str) -> list[str]:
    """The addresses in an answer for `name`; ValueError naming the source and what is wrong.
    An empty list is an error, as a DNS answer without records is a failed lookup: the client
    keeps its last addresses."""
    try:
        data = json.loads(body)
    except ValueError:
        raise ValueError(f"resolver {source}: the answer is not JSON: {body[:80]!r}") from None
    if not isinstance(data, dict) or data.get("name") != name:
        raise ValueError(f"resolver {source}: expected an answer for name {name!r}, got {str(data)[:120]}")
    addresses = data.get("addresses")
    if not isinstance(addresses, list) or not addresses:
        raise ValueError(f"resolver {source}: addresses: expected a non-empty list of IP addresses for {name!r}")
    for i, a in enumerate(addresses):
        try:
            ipaddress.ip_address(a)
        except (TypeError, ValueError):
            raise ValueError(f"resolver {source}: addresses[{i}]: {a!r} is not an IP address") from None
    return [str(a) for a in addresses]


def lookup(resolver_url: str, name: str, timeout_s: float = 5.0) -> list[str]:
    """`name`'s addresses from the answer source, in plain Python (the gate task and the
    tokenizer check make single requests with urllib; the replay's client asks on gevent)."""
    import urllib.request

    check_resolver_url(resolver_url)
    u = urlsplit(resolver_url)
    url = f"{u.scheme}://{u.netloc}{query_target(resolver_url, name)}"
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # loopback only: check_resolver_url
        return decode_answer(resp.read(), name, resolver_url)


def resolved_url(url: str, resolver_url: str | None) -> str:
    """`url` with its host name replaced by the first address the answer source gives (the source
    rotates its answers, as an NLB's DNS does); unchanged without a source or for an IP literal."""
    u = urlsplit(url)
    host = u.hostname
    if not resolver_url or host is None:
        return url
    try:
        ipaddress.ip_address(host)
        return url
    except ValueError:
        pass
    address = lookup(resolver_url, host)[0]
    literal = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    netloc = literal if u.port is None else f"{literal}:{u.port}"
    return u._replace(netloc=netloc).geturl()
