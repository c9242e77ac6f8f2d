"""A saved plan (`campaign plan --save FILE`) read back for `campaign local/run --from-plan FILE`,
and its predicted campaign cost for `campaign report --plan FILE` (or RUN_DIR/plan.json).

The plan runs the whole campaign in simulated time; its searches end on a bracket per fleet. The
live search then looks at the predicted boundary first (analysis.capacity.search:
SearchSettings.predicted) instead of at the replay miss's estimate, which an overloaded replay
drags low (its queue grows for the whole window). A right prediction saves steps, which on the
cloud fleets are paid instance-minutes; a wrong one costs one step. Every verdict is measured
either way, and each step's `why` in the report says where it came from.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

from analysis.report.inputs import PlannedCost
from core.errors import BadArgument
from core.manifest import Manifest

# Where a run directory keeps the plan it was run with (`plan --save RUN_DIR/plan.json`), for
# `report --run-dir` to set the plan's cost beside the computed and billed ones.
RUN_DIR_PLAN = "plan.json"


def _utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def plan_document(
    m: Manifest,
    fleets: list[dict[str, object]],
    prediction: dict[str, Any] | None,
    *,
    generated_at: str | None = None,
    rehearsal: dict[str, Any] | None = None,
) -> dict[str, object]:
    """What `plan --json` prints and `plan --save` writes; `generated_at`: UTC, now by default;
    `rehearsal`: `plan --rehearsal`'s (campaign.plan.rehearsal.RehearsalPrediction)."""
    out: dict[str, object] = {
        "campaign": m.campaign,
        "manifest_digest": m.digest,
        "generated_at": generated_at or _utc_now(),
        "fleets": fleets,
    }
    if prediction is not None:
        out.update(
            campaign_minutes=prediction["campaign_minutes"],
            campaign_usd=prediction["campaign_usd"],
            predicted_decision=prediction["predicted_decision"],
            prediction=prediction,
        )
    if rehearsal is not None:
        out.update(
            rehearsal_minutes=rehearsal["rehearsal_minutes"],
            rehearsal_usd=rehearsal["rehearsal_usd"],
            rehearsal_instance_type=rehearsal["instance_type"],
            rehearsal=rehearsal,
        )
    return out


def _saved_plan(path: Path, m: Manifest, flag: str = "--from-plan") -> dict[str, Any]:
    """A saved plan of this manifest; errors name the flag, the file and the field."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadArgument(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from exc
    except json.JSONDecodeError as exc:
        raise BadArgument(f"{flag} {path}: line {exc.lineno}: not JSON ({exc.msg})") from exc
    if not isinstance(doc, dict):
        raise BadArgument(f"{flag} {path}: expected the JSON object `campaign plan --save` writes")
    digest = doc.get("manifest_digest")
    if digest != m.digest:
        raise BadArgument(
            f"{flag} {path}: manifest_digest {digest!r} is not this manifest's {m.digest!r}: "
            f"run `campaign plan MANIFEST --save {path}` again"
        )
    return doc


def _saved_prediction(path: Path, m: Manifest) -> dict[str, Any]:
    """The `prediction` object of a saved plan of this manifest ({} when it has none)."""
    prediction = _saved_plan(path, m).get("prediction")
    return prediction if isinstance(prediction, dict) else {}  # --no-simulate: each caller names its missing field


def planned_stage_minutes(path: Path, m: Manifest) -> dict[str, float]:
    """The saved plan's minutes per stage (`prediction.minutes`, campaign.plan.predict), which `run`
    holds each stage to against the stack's deadline."""
    minutes = _saved_prediction(path, m).get("minutes")
    if not isinstance(minutes, dict):
        raise BadArgument(
            f"--from-plan {path}: prediction.minutes: missing (a plan saved with --no-simulate predicts none)"
        )
    out: dict[str, float] = {}
    for stage, value in minutes.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise BadArgument(f"--from-plan {path}: prediction.minutes.{stage}: expected minutes >= 0, got {value!r}")
        out[str(stage)] = float(value)
    return out


def predicted_boundaries(path: Path, m: Manifest) -> dict[str, float]:
    """Per fleet, the multiplier the plan's search last held at; a fleet whose simulated search
    held nowhere is left out (its live search starts as without a plan). Errors name the file and
    the field."""
    prediction = _saved_prediction(path, m)
    fleets = prediction.get("fleets")
    if not isinstance(fleets, dict):
        raise BadArgument(
            f"--from-plan {path}: prediction.fleets: missing (a plan saved with --no-simulate predicts none)"
        )
    out: dict[str, float] = {}
    for f in m.fleets:
        entry = fleets.get(f.name)
        if not isinstance(entry, dict):
            raise BadArgument(f"--from-plan {path}: prediction.fleets.{f.name}: missing")
        bracket = entry.get("search_bracket")
        if not isinstance(bracket, list) or len(bracket) != 2:
            raise BadArgument(f"--from-plan {path}: prediction.fleets.{f.name}.search_bracket: expected [held, missed]")
        held = bracket[0]
        if held is None:
            continue
        if isinstance(held, bool) or not isinstance(held, int | float) or not math.isfinite(held) or held <= 0:
            raise BadArgument(
                f"--from-plan {path}: prediction.fleets.{f.name}.search_bracket[0]: expected a positive multiplier, got {held!r}"
            )
        out[f.name] = float(held)
    return out


def planned_cost(path: Path, m: Manifest, flag: str = "--plan") -> PlannedCost:
    """The saved plan's predicted campaign cost (campaign_usd, campaign_minutes) and its date: the
    plan's `generated_at`, or, for a plan saved before that field existed, the file's modification
    time (the source says which)."""
    doc = _saved_plan(path, m, flag)
    usd, minutes = doc.get("campaign_usd", "missing"), doc.get("campaign_minutes")
    if usd == "missing" or isinstance(minutes, bool) or not isinstance(minutes, int | float):
        raise BadArgument(
            f"{flag} {path}: campaign_usd / campaign_minutes: missing (a plan saved with --no-simulate predicts none)"
        )
    if usd is not None and (isinstance(usd, bool) or not isinstance(usd, int | float) or not math.isfinite(usd)):
        raise BadArgument(f"{flag} {path}: campaign_usd: expected USD or null, got {usd!r}")
    generated = doc.get("generated_at")
    if isinstance(generated, str) and generated:
        date, how = generated, "generated_at"
    else:
        mtime = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC)
        date, how = mtime.strftime("%Y-%m-%dT%H:%M:%SZ"), "the file's modification time"
    return PlannedCost(
        None if usd is None else float(usd),
        float(minutes),
        f"predicted (campaign plan, {date}; {path.name}, dated by {how})",
        date,
    )
