"""The quality gate's three layers, as the seed study sets them, and their verdict per fleet.

(a) fixtures: each fleet's greedy fixture checks (`loadgen.fixtures.run_gate`), plus
    cross-fleet equivalence against the baseline: same completion token counts, the same stop
    behaviour (finish reason) and the same schema validity on every fixture;
(b) task acceptance: the buyer's own scorer (`quality.task_acceptance.command`) reads a fleet's
    fixture outputs as JSONL on stdin and prints a pass rate; below the threshold fails;
(c) distribution checks over the replayed requests: each fleet's output-length distribution
    against the baseline's (two-sample KS, with its p-value), its invalid-response rate, and
    its retry rate against slo.max_retry_rate.

A layer that fails stops the comparison: `passed` False (the decision is Reject for the
candidate, Defer when it is the baseline's), or None when the layer could not be evaluated
(a scorer that crashed, too few requests for the test): evidence missing, so Defer. Every
fleet's result names the layer that failed.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.model import QualityLayer, QualityResult
from core.manifest import Manifest
from core.records import INVALID_RESPONSE_OUTCOMES
from loadgen.fixtures import GateResult

FIXTURES, EQUIVALENCE, TASK_ACCEPTANCE, DISTRIBUTION = "fixtures", "equivalence", "task_acceptance", "distribution"


def fixtures_layer(gate: GateResult) -> QualityLayer:
    return QualityLayer(
        layer=FIXTURES,
        passed=gate.passed,
        reasons=[f"{FIXTURES}: {f}" for f in gate.failures],
        figures={"pass_rate": gate.pass_rate, "min_pass_rate": gate.min_pass_rate},
    )


def equivalence_layer(gate: GateResult, baseline: GateResult) -> QualityLayer:
    """The fleet's fixture answers against the baseline's: same tokens, stop behaviour, schema validity."""
    base = {f.id: f for f in baseline.fixtures}
    reasons = []
    for f in gate.fixtures:
        b = base.get(f.id)
        if b is None:
            reasons.append(f"{f.id}: the baseline {baseline.fleet} has no answer to compare with")
            continue
        if f.completion_tokens != b.completion_tokens:
            reasons.append(
                f"{f.id}: {f.completion_tokens} completion tokens on {gate.fleet}, {b.completion_tokens} on {baseline.fleet}"
            )
        if f.finish_reason != b.finish_reason:
            reasons.append(
                f"{f.id}: finish_reason {f.finish_reason!r} on {gate.fleet}, {b.finish_reason!r} on {baseline.fleet}"
            )
        if f.schema_ok != b.schema_ok:
            reasons.append(
                f"{f.id}: schema {'valid' if f.schema_ok else 'invalid'} on {gate.fleet}, "
                f"{'valid' if b.schema_ok else 'invalid'} on {baseline.fleet}"
            )
    return QualityLayer(
        layer=EQUIVALENCE,
        passed=not reasons,
        reasons=[f"{EQUIVALENCE}: {r}" for r in reasons],
        figures={"against": baseline.fleet},
    )


def scorer_input(gate: GateResult, m: Manifest) -> str:
    prompts = {fx.id: fx.prompt for fx in m.quality.fixtures}
    return "".join(
        json.dumps(
            {
                "fleet": gate.fleet,
                "id": f.id,
                "prompt": prompts.get(f.id, ""),
                "output": f.output,
                "finish_reason": f.finish_reason,
                "completion_tokens": f.completion_tokens,
            }
        )
        + "\n"
        for f in gate.fixtures
    )


def task_acceptance_layer(m: Manifest, gate: GateResult) -> QualityLayer:
    ta = m.quality.task_acceptance
    if ta is None:
        return QualityLayer(
            layer=TASK_ACCEPTANCE,
            passed=True,
            reasons=[],
            figures={"scorer": None, "note": "no quality.task_acceptance in the manifest"},
        )
    cwd = m.source.parent if m.source is not None else Path.cwd()
    cmd = " ".join(ta.command)
    figures: dict[str, Any] = {"scorer": cmd, "threshold": ta.threshold}

    def missing(why: str) -> QualityLayer:
        return QualityLayer(
            layer=TASK_ACCEPTANCE, passed=None, reasons=[f"{TASK_ACCEPTANCE}: scorer `{cmd}` {why}"], figures=figures
        )

    try:
        r = subprocess.run(
            list(ta.command), input=scorer_input(gate, m), capture_output=True, text=True, cwd=cwd, timeout=ta.timeout_s
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return missing(f"could not run: {exc}")
    if r.returncode != 0:
        return missing(f"exited {r.returncode}: {(r.stderr.strip().splitlines() or ['no stderr'])[-1]}")
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    try:
        rate = float(lines[-1]) if lines else float("nan")
    except ValueError:
        rate = float("nan")
    if not 0.0 <= rate <= 1.0:
        return missing(f"printed {lines[-1] if lines else 'nothing'!r} as its last line, not a pass rate in [0, 1]")
    figures["pass_rate"] = rate
    ok = rate >= ta.threshold
    return QualityLayer(
        layer=TASK_ACCEPTANCE,
        passed=ok,
        reasons=[]
        if ok
        else [f"{TASK_ACCEPTANCE}: pass rate {rate:.3f} < threshold {ta.threshold:g} (scorer `{cmd}`)"],
        figures=figures,
    )


@dataclass(frozen=True)
class ReplayFigures:
    """One fleet's replayed requests, as the distribution layer reads them."""

    output_tokens: list[int]  # completed ok requests (server usage where reported)
    sent: int
    invalid: int  # a response came back unusable (core.records.INVALID_RESPONSE_OUTCOMES)
    retried: int  # requests re-sent at least once


def replay_figures(records_dir: Path, m: Manifest) -> dict[str, ReplayFigures]:
    from analysis.sources.records import load_records

    rs = load_records(records_dir, m.digest)
    out: dict[str, ReplayFigures] = {}
    for fleet in rs.fleets():
        toks = [
            int(t)
            for (t,) in rs.con.execute(
                "SELECT coalesce(server_output_tokens, client_output_tokens) FROM records "
                "WHERE fleet = ? AND NOT warmup AND outcome = 'ok' ORDER BY request_id",
                [fleet],
            ).fetchall()
        ]
        invalid = ", ".join(f"'{o}'" for o in sorted(INVALID_RESPONSE_OUTCOMES))
        row = rs.con.execute(
            f"SELECT count(*) FILTER (WHERE outcome <> 'not_sent'), count(*) FILTER (WHERE outcome IN ({invalid})), "
            "count(*) FILTER (WHERE outcome <> 'not_sent' AND coalesce(retries, 0) > 0) FROM records WHERE fleet = ? AND NOT warmup",
            [fleet],
        ).fetchone()
        assert row is not None
        out[fleet] = ReplayFigures(toks, int(row[0]), int(row[1]), int(row[2]))
    return out


def distribution_layer(m: Manifest, fleet: str, figs: Mapping[str, ReplayFigures]) -> QualityLayer:
    from analysis.measure.two_sample import ks_2samp

    dc = m.quality.distribution
    base = m.comparison.baseline
    mine = figs.get(fleet)
    if mine is None or mine.sent == 0:
        return QualityLayer(
            layer=DISTRIBUTION, passed=None, reasons=[f"{DISTRIBUTION}: no replayed requests for {fleet}"]
        )
    reasons: list[str] = []
    missing: list[str] = []
    invalid_rate, retry_rate = mine.invalid / mine.sent, mine.retried / mine.sent
    figures: dict[str, Any] = {
        "sent": mine.sent,
        "invalid_rate": invalid_rate,
        "max_invalid_rate": dc.max_invalid_rate,
        "retry_rate": retry_rate,
        "max_retry_rate": m.slo.max_retry_rate,
    }
    if invalid_rate > dc.max_invalid_rate:
        reasons.append(
            f"invalid-response rate {invalid_rate:.4f} ({mine.invalid} of {mine.sent}) > {dc.max_invalid_rate:g}"
        )
    if retry_rate > m.slo.max_retry_rate:
        reasons.append(
            f"retry rate {retry_rate:.4f} ({mine.retried} of {mine.sent}) > slo.max_retry_rate {m.slo.max_retry_rate:g}"
        )
    other = figs.get(base)
    if fleet != base:
        n, k = len(mine.output_tokens), len(other.output_tokens) if other else 0
        if min(n, k) < dc.min_samples:
            missing.append(
                f"output-length test needs {dc.min_samples} completed requests per fleet; {fleet} has {n}, {base} {k}"
            )
        elif other is not None:
            ks = ks_2samp(mine.output_tokens, other.output_tokens)
            figures["output_length_ks"] = {
                "against": base,
                "statistic": ks.statistic,
                "p_value": ks.p_value,
                "n": ks.n,
                "m": ks.m,
                "min_p_value": dc.min_p_value,
            }
            if ks.p_value < dc.min_p_value:
                reasons.append(
                    f"output lengths differ from {base}'s: KS D = {ks.statistic:.3f}, p = {ks.p_value:.2g} "
                    f"< {dc.min_p_value:g} (n = {ks.n}, {ks.m})"
                )
    passed: bool | None = False if reasons else (None if missing else True)
    return QualityLayer(
        layer=DISTRIBUTION, passed=passed, reasons=[f"{DISTRIBUTION}: {r}" for r in reasons + missing], figures=figures
    )


def verdict(layers: list[QualityLayer]) -> bool | None:
    """False when a layer failed, None when none failed but one could not be evaluated, else True."""
    if any(x.passed is False for x in layers):
        return False
    return None if any(x.passed is None for x in layers) else True


def fleet_quality(gate: GateResult, layers: list[QualityLayer]) -> QualityResult:
    """What the report reads for one fleet: the gate's fixtures plus every layer; `passed` is
    the layers' verdict and `failed_layer` names the first one that did not pass. The gate's own
    details (fleet, min_pass_rate, fixtures) ride along as the model's extra fields."""
    failed = next((x for x in layers if x.passed is not True), None)
    return QualityResult.model_validate(
        {
            **gate.as_dict(),
            "passed": verdict(layers),
            "failed_layer": failed.layer if failed else None,
            "failures": [r for x in layers for r in x.reasons],
            "layers": {x.layer: x for x in layers},
        }
    )


def gate_layers(m: Manifest, gates: Mapping[str, GateResult]) -> dict[str, list[QualityLayer]]:
    """Layers (a) and (b), which run before any load: they decide whether the replay runs at all."""
    base = gates.get(m.comparison.baseline)
    out: dict[str, list[QualityLayer]] = {}
    for name, g in gates.items():
        layers = [fixtures_layer(g)]
        if base is not None and name != base.fleet:
            layers.append(equivalence_layer(g, base))
        layers.append(task_acceptance_layer(m, g))
        out[name] = layers
    return out
