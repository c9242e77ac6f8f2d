"""`plan --rehearsal`'s text (campaign.plan.rehearsal); its figures: tests/invariants/test_rehearsal_sum_of_parts.py,
its --json: tests/campaign/test_plan_and_prices.py test_cli_plan_json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from campaign.plan.rehearsal import predict_rehearsal, render
from core.manifest import load_manifest


def test_the_rehearsal_text_names_its_type_and_figures(example_manifest_path: Path) -> None:
    r = predict_rehearsal(load_manifest(example_manifest_path))
    text = render(r, None)
    assert f"rehearsal: about {r.rehearsal_minutes:.0f} min, {r.rehearsal_usd:,.2f} USD" in text
    assert "instance type: c6a.large: the cheapest non-burstable current-generation x86_64 type" in text
    assert "no compile phase, no weights" in text


def test_plan_rehearsal_needs_no_simulated_campaign(
    example_manifest_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The rehearsal's stages are fixed: `--no-simulate` still prices it (the campaign's figures are then absent).
    from campaign.cli.main import main

    assert main(["plan", str(example_manifest_path), "--json", "--no-simulate", "--rehearsal"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "campaign_minutes" not in out and "prediction" not in out
    want = predict_rehearsal(load_manifest(example_manifest_path)).as_dict()
    assert out["rehearsal"] == want
    assert (out["rehearsal_minutes"], out["rehearsal_usd"], out["rehearsal_instance_type"]) == (
        want["rehearsal_minutes"],
        want["rehearsal_usd"],
        "c6a.large",
    )
