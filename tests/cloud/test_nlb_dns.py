"""The offline NLB DNS stand-in (testing/nlb_dns.py): which node addresses an NLB's name answers
with, by target health and cross-zone setting, and that it serves them as the client's resolver
contract says (loadgen/resolver.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import Counter

import pytest

from loadgen.resolver import decode_answer, query_target
from testing.nlb_dns import NlbDns, NlbDnsServer, Target, loopback_nodes, zones_in_dns

AZS = ["us-east-1a", "us-east-1b", "us-east-1c"]


def healthy_everywhere(*groups: str) -> list[Target]:
    return [Target(g, az, True) for g in groups for az in AZS]


def test_an_az_whose_only_target_is_unhealthy_leaves_dns_when_cross_zone_is_off() -> None:
    table = [Target("g6", "us-east-1a", True), Target("g6", "us-east-1b", False), Target("g6", "us-east-1c", True)]
    assert zones_in_dns(AZS, table, cross_zone=False) == ["us-east-1a", "us-east-1c"]
    # one healthy target is enough for an AZ (the default target-group health threshold)
    table.append(Target("g6", "us-east-1b", True))
    assert zones_in_dns(AZS, table, cross_zone=False) == AZS


def test_every_target_group_behind_the_nlb_counts() -> None:
    # One NLB serves both fleets' listeners: inf2 has nothing healthy in 1b, so 1b leaves the
    # name's answer for g6's listener too, although g6 is healthy there.
    table = [*healthy_everywhere("g6"), Target("inf2", "us-east-1a", True), Target("inf2", "us-east-1b", False)]
    table.append(Target("inf2", "us-east-1c", True))
    assert zones_in_dns(AZS, table, cross_zone=False) == ["us-east-1a", "us-east-1c"]
    # a target group with no target at all in an AZ leaves it just the same
    table = [*healthy_everywhere("g6"), Target("inf2", "us-east-1a", True)]
    assert zones_in_dns(AZS, table, cross_zone=False) == ["us-east-1a"]


def test_cross_zone_on_keeps_every_az_while_each_group_has_a_healthy_target_somewhere() -> None:
    table = [Target("g6", "us-east-1a", True), Target("g6", "us-east-1b", False), Target("g6", "us-east-1c", False)]
    assert zones_in_dns(AZS, table, cross_zone=True) == AZS
    assert zones_in_dns(AZS, table, cross_zone=False) == ["us-east-1a"]


@pytest.mark.parametrize("cross_zone", [False, True])
def test_no_qualifying_az_fails_open(cross_zone: bool) -> None:
    unhealthy = [Target("g6", az, False) for az in AZS]
    assert zones_in_dns(AZS, unhealthy, cross_zone=cross_zone) == AZS
    assert zones_in_dns(AZS, [], cross_zone=cross_zone) == AZS  # no target registered yet


def test_answers_rotate_over_the_zones_in_dns_and_follow_health_changes() -> None:
    dns = NlbDns("nlb.internal", loopback_nodes(AZS), cross_zone=False, targets=healthy_everywhere("g6"))
    answers = [dns.answer() for _ in range(6)]
    assert answers[:3] == [
        ["127.0.0.2", "127.0.0.3", "127.0.0.4"],
        ["127.0.0.3", "127.0.0.4", "127.0.0.2"],
        ["127.0.0.4", "127.0.0.2", "127.0.0.3"],
    ]
    assert Counter(a[0] for a in answers) == {"127.0.0.2": 2, "127.0.0.3": 2, "127.0.0.4": 2}
    dns.set_targets(
        [Target("g6", "us-east-1a", True), Target("g6", "us-east-1b", False), Target("g6", "us-east-1c", True)]
    )
    later = [dns.answer() for _ in range(4)]
    assert all(sorted(a) == ["127.0.0.2", "127.0.0.4"] for a in later)
    assert {a[0] for a in later} == {"127.0.0.2", "127.0.0.4"}


def test_bad_tables_are_refused_by_field() -> None:
    with pytest.raises(ValueError, match=r"targets: AZ us-east-1d is not enabled on NLB nlb.internal"):
        NlbDns("nlb.internal", loopback_nodes(AZS), cross_zone=False, targets=[Target("g6", "us-east-1d", True)])
    with pytest.raises(ValueError, match=r"nodes\[us-east-1a\]: 'node-a' is not an IP address"):
        NlbDns("nlb.internal", {"us-east-1a": "node-a"}, cross_zone=False)
    with pytest.raises(ValueError, match=r"nodes: NLB nlb\.internal needs at least one enabled AZ"):
        NlbDns("nlb.internal", {}, cross_zone=False)
    with pytest.raises(ValueError, match=r"zones: .* names an AZ twice"):
        loopback_nodes(["us-east-1a", "us-east-1a"])
    with pytest.raises(ValueError, match=r"host: 0\.0\.0\.0 is not a loopback address"):
        NlbDnsServer({}, host="0.0.0.0")


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_it_serves_the_resolver_contract_on_loopback() -> None:
    dns = NlbDns("nlb.internal", loopback_nodes(AZS[:2]), cross_zone=False, targets=healthy_everywhere("g6")[:2])
    with NlbDnsServer({"nlb.internal": dns}) as server:
        assert server.url.startswith("http://127.0.0.1:")
        base = server.url.rsplit("/", 1)[0]
        first = _get(base + query_target(server.url, "nlb.internal"))
        second = _get(base + query_target(server.url, "nlb.internal"))
        unknown = _get(base + query_target(server.url, "other.internal"))
    assert first[0] == second[0] == 200
    assert decode_answer(first[1], "nlb.internal", server.url) == ["127.0.0.2", "127.0.0.3"]
    assert decode_answer(second[1], "nlb.internal", server.url) == ["127.0.0.3", "127.0.0.2"]
    assert unknown[0] == 404 and b"other.internal" in unknown[1]
    assert server.asked == ["nlb.internal", "nlb.internal", "other.internal"]
    assert json.loads(first[1])["name"] == "nlb.internal"
