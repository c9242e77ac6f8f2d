"""`plan --rehearsal`'s text (campaign.plan.rehearsal); its figures: tests/invariants/test_rehearsal_sum_of_parts.py,
its --json: tests/campaign/test_plan_and_prices.py test_cli_plan_json."""

from __future__ import annotations

from pathlib import Path

from campaign.plan.rehearsal import predict_rehearsal, render
from core.manifest import load_manifest


def test_the_rehearsal_text_names_its_type_and_figures(example_manifest_path: Path) -> None:
    r = predict_rehearsal(load_manifest(example_manifest_path))
    text = render(r, None)
    assert f"rehearsal: about {r.rehearsal_minutes:.0f} min, {r.rehearsal_usd:,.2f} USD" in text
    assert "instance type: c6a.large: the cheapest non-burstable current-generation x86_64 type" in text
    assert "no compile phase, no weights" in text
