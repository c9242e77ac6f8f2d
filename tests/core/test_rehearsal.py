"""The rehearsal's host type (core.rehearsal): the cheapest fit type in the price snapshot, or an error
naming why each listed type was left out."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from core import prices, rehearsal
from core.rehearsal import HostType, HostTypesError, NoRehearsalType, host_types, rehearsal_type


def test_the_rehearsal_type_is_the_cheapest_fit_type_in_the_snapshot() -> None:
    chosen = rehearsal_type("us-east-1")
    assert (chosen.name, chosen.hourly_usd) == ("c6a.large", 0.0765)
    assert chosen.price == prices.instance_hourly("c6a.large")
    # It names its price's date and source and its facts' source.
    assert "snapshot 2026-12-07" in chosen.provenance and "Compute optimized specifications" in chosen.provenance
    # Every listed type priced below it is left out, each for a reason of its own.
    cheaper = {
        h.name: h.unfit_because()
        for h in host_types().values()
        if prices.instance_hourly(h.name).usd < chosen.hourly_usd
    }
    assert cheaper == {"t3.medium": "burstable", "t3a.medium": "burstable", "c6g.large": "arm64, not x86_64"}


def test_each_rule_leaves_a_cheaper_type_out() -> None:
    # t3a.medium is the cheapest priced type; give it facts that break one rule at a time.
    fit = HostType("t3a.medium", 2, 4, "x86_64", False, True, "test")
    backup = host_types()["c6a.large"]
    assert rehearsal_type("us-east-1", {"a": fit, "b": backup}).name == "t3a.medium"
    for broken, why in (
        (dataclasses.replace(fit, current_generation=False), "previous generation"),
        (dataclasses.replace(fit, vcpus=1), "1 vCPU / 4 GiB, under 2 vCPU / 4 GiB"),
        (dataclasses.replace(fit, memory_gib=3.75), "2 vCPU / 3.75 GiB, under 2 vCPU / 4 GiB"),
        (dataclasses.replace(fit, burstable=True), "burstable"),
        (dataclasses.replace(fit, arch="arm64"), "arm64, not x86_64"),
    ):
        assert broken.unfit_because() == why
        assert rehearsal_type("us-east-1", {"a": broken, "b": backup}).name == "c6a.large"


def test_no_fit_type_is_an_error_naming_each_type_left_out() -> None:
    with pytest.raises(NoRehearsalType) as exc:
        rehearsal_type("us-east-1", {h: host_types()[h] for h in ("t3.medium", "c6g.large")})
    assert "no host type for a rehearsal in us-east-1" in str(exc.value)
    assert "t3.medium (burstable), c6g.large (arm64, not x86_64)" in str(exc.value)
    with pytest.raises(NoRehearsalType, match=r"c6a\.large \(no snapshot price in eu-west-9\)"):
        rehearsal_type("eu-west-9")


def test_a_bad_host_types_row_names_its_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "host-types.csv"
    header = "name,vcpus,memory_gib,arch,burstable,current_generation,source\n"
    bad.write_text(header + "c6a.large,2,4,x86_64,no,true,src\n", encoding="utf-8")
    with pytest.raises(HostTypesError, match=r"host-types.csv:2: burstable: expected true or false, got 'no'"):
        rehearsal._parse(bad)
    bad.write_text(header + "c6a.large,2,4,x86_64,false,true,\n", encoding="utf-8")
    with pytest.raises(HostTypesError, match=r"host-types.csv:2: source: missing"):
        rehearsal._parse(bad)


def test_every_host_type_has_a_snapshot_price() -> None:
    for name in host_types():
        assert prices.instance_hourly(name).usd > 0
