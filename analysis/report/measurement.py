"""The report's measurements from the records: the replay's and the capacity steps' measures, the
capacity per SLO scale, saturation, the 95% intervals, and the gaps that say why a capacity or a
saturation falls short (with what to change in the manifest).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from analysis.capacity import steps as capacity
from analysis.economics import sensitivity
from analysis.errors import AnalysisError
from analysis.measure import goodput, intervals
from analysis.model import CapacityModel, CapacityStep, Measure, ScenarioEvaluation
from analysis.provenance import Findings, Gap, manifest_provenance, run_relative
from analysis.report.inputs import ReportInputs
from analysis.sources.records import RecordSet, load_records
from core.manifest import Manifest
from core.records import RunSummary


@dataclass(frozen=True)
class RecordEvidence:
    """Stage 1: the replay's records (and the capacity steps'), with per-SLO-scale measures."""

    records: RecordSet
    sweep: list[capacity.SweepStep] | None
    measures: Callable[[float], dict[str, Measure]]  # slo_scale -> per-fleet measures (cached)
    found: Findings

    @property
    def base(self) -> dict[str, Measure]:
        return self.measures(1.0)

    def summaries(self) -> list[RunSummary]:
        """The run summaries of the replay and of every capacity step and settle segment."""
        steps = [s for step in self.sweep or [] for s in step.records.summaries.values()]
        return [*self.records.summaries.values(), *steps]


@dataclass(frozen=True)
class Measurements:
    """Stage 3: capacity per SLO scale, saturation and the 95% intervals, from the records and instance counts."""

    capacities: Callable[[float], dict[str, CapacityModel]] | None
    saturation: dict[str, goodput.Saturation]
    intervals: intervals.IntervalsFn
    capacity_found: Findings
    saturation_found: Findings


def _saturation(
    m: Manifest,
    rs: RecordSet,
    measures: Mapping[str, Measure],
    inst: Mapping[str, int],
    measured_capacity: frozenset[str] = frozenset(),
) -> tuple[dict[str, goodput.Saturation], Findings]:
    """Per fleet: was one instance driven to max_concurrency? If not, its goodput is a lower bound (blocking gap).

    Fleets in `measured_capacity` are sized from a capacity-sweep step that held the SLO, so
    the replay's saturation and overload do not bear on their size: no gap for them."""
    found = Findings()
    peaks = goodput.peak_in_flight(rs)
    out: dict[str, goodput.Saturation] = {}
    for f in m.fleets:
        fm = measures.get(f.name)
        if fm is None or fm.requests == 0:
            continue  # the missing records are already a gap
        sat = goodput.Saturation(f.name, peaks.get(f.name, 0), inst.get(f.name, 0), f.sequences_per_instance)
        out[f.name] = sat
        per = sat.peak_in_flight_per_instance
        found.provenance[f"saturation.{f.name}"] = {
            "value": sat.as_dict(),
            "source": "measured",
            "detail": "peak non-warmup requests in flight (send -> last token, sweep over the records) / instances_measured, "
            "against fleets[].max_concurrency x replicas_per_instance",
        }
        if f.name in measured_capacity:
            continue
        if not sat.saturated:
            peak = "n/a" if per is None else f"{per:g}"
            found.gaps.append(
                Gap(
                    f"saturation.{f.name}",
                    f"{f.name}: per-instance goodput measured below saturation (peak {peak} of {f.sequences_per_instance} concurrent "
                    "sequences): throughput is a lower bound, fleet size an upper bound; raise workload.rate_scale until one "
                    "instance saturates",
                )
            )
        over = [
            f"P95 {what} {got:.3g} s > {slo:g} s"
            for what, got, slo in (("TTFT", fm.p95_ttft_s, m.slo.ttft_p95_s), ("ITL", fm.p95_itl_s, m.slo.itl_p95_s))
            if got is not None and got > slo
        ]
        if over:
            # Beyond its SLO capacity an instance's compliant goodput collapses (queueing); scaling
            # that figure linearly would oversize the fleet, so the size is pessimistic evidence.
            found.gaps.append(
                Gap(
                    f"overload.{f.name}",
                    f"{f.name}: fleet SLO missed at the replayed load ({', '.join(over)}): per-instance SLO-compliant goodput "
                    "was measured in overload and understates what one instance sustains inside the SLO, so its fleet size is "
                    "pessimistic; lower workload.rate_scale (or measure more instances) to size it inside the SLO",
                )
            )
    return out, found


def read_records(inp: ReportInputs) -> RecordEvidence:
    """Load and check the records (and capacity steps); gaps for fleets without records and for invalid runs."""
    m = inp.manifest
    found = Findings()
    for label in inp.capacity_dirs or {}:  # labels are checked before anything is loaded
        capacity.parse_label(label)
    found.provenance["manifest"] = manifest_provenance(m)
    rs: RecordSet = load_records(inp.records_dir, m.digest)
    found.provenance["records"] = {
        "source": "measured",
        "detail": f"{len(rs.files)} file(s), {rs.count()} records under {run_relative(inp.records_dir, inp.out_dir)}",
    }
    for torn in rs.torn_tails:  # a writer died mid-record: the complete records are all used
        found.gaps.append(Gap("records.torn_tail", f"{torn} left out (cut mid-write)", blocks_go=False))
    unknown = sorted(set(rs.fleets()) - {f.name for f in m.fleets})
    if unknown:
        raise AnalysisError(f"records name fleet(s) {unknown} that the manifest does not define")

    # Goodput is judged by the base SLO and, in the sensitivity grid, by each SLO it scales that to:
    # one scan of the records tallies them all (goodput.tally), named before the first is asked for.
    scales = sensitivity.slo_scales(m) if inp.with_sensitivity else [1.0]
    slos = [(m.slo.ttft_p95_s * s, m.slo.itl_p95_s * s) for s in scales]
    goodput.tally(rs, slos)
    cache: dict[float, dict[str, Measure]] = {}

    def measures(scale: float) -> dict[str, Measure]:
        if scale not in cache:
            if scale == 1.0:
                cache[scale] = goodput.measure_fleets(rs, m.slo.ttft_p95_s, m.slo.itl_p95_s)
            else:  # goodput changes with the SLO, the measured percentiles do not
                base = measures(1.0)
                cache[scale] = {
                    k: v.model_copy(update={"p95_ttft_s": base[k].p95_ttft_s, "p95_itl_s": base[k].p95_itl_s})
                    for k, v in goodput.measure_fleets(
                        rs, m.slo.ttft_p95_s * scale, m.slo.itl_p95_s * scale, percentiles=False
                    ).items()
                }
        return cache[scale]

    base_measures = measures(1.0)
    sweep: list[capacity.SweepStep] | None = None
    if inp.capacity_dirs is not None:
        sweep = capacity.load_sweep(inp.capacity_dirs, m.digest, {f.name for f in m.fleets})
        for step in sweep:  # each step is judged by the same SLOs (_capacity_fn)
            goodput.tally(step.records, slos)
        found.provenance["capacity_sweep"] = {
            "source": "measured",
            "detail": "; ".join(
                f"{s.label}: {len(s.records.files)} file(s), {s.records.count()} records under "
                f"{run_relative(s.directory, inp.out_dir)}"
                for s in sweep
            ),
        }
    for f in m.fleets:
        fm = base_measures.get(f.name)
        if fm is None or fm.requests == 0:
            found.gaps.append(Gap(f"records.{f.name}", "no non-warmup records in the window for this fleet"))
        elif fm.slo_verdict_disagreements:
            found.gaps.append(
                Gap(
                    f"records.{f.name}.slo_ok",
                    f"{fm.slo_verdict_disagreements} ok request(s) where loadgen's slo_ok "
                    "differs from the SLO recomputed from ttft_s/itl_s; the recomputed verdict is used",
                    blocks_go=False,
                )
            )
    for key, s in rs.summaries.items():
        if not s.valid:
            found.gaps.append(Gap(f"run_summary.{key}", "run marked invalid: " + "; ".join(s.invalid_reasons)))
        if not s.invariant_holds():
            found.gaps.append(Gap(f"run_summary.{key}", "scheduled != completed + failed + not_sent"))
    return RecordEvidence(rs, sweep, measures, found)


def measure(inp: ReportInputs, rec: RecordEvidence, instances: Mapping[str, int]) -> Measurements:
    """Capacity from the sweep (if any), then saturation (which a capacity measured inside the SLO exempts), and the intervals."""
    m = inp.manifest
    capacities = (
        _capacity_fn(m, rec.sweep, rec.measures, rec.records, instances, inp.capacity_root)
        if rec.sweep is not None
        else None
    )
    measured_capacity: frozenset[str] = frozenset()
    capacity_found = Findings()
    if capacities is not None:
        measured_capacity, capacity_found = _capacity_gaps(m, capacities(1.0))
    saturation, saturation_found = _saturation(m, rec.records, rec.base, instances, measured_capacity)
    spread = _intervals_fn(m, rec.records, rec.measures, instances, rec.sweep, capacities)
    return Measurements(capacities, saturation, spread, capacity_found, saturation_found)


def _capacity_fn(
    m: Manifest,
    sweep: list[capacity.SweepStep],
    measures: Callable[[float], dict[str, Measure]],
    rs: RecordSet,
    inst: Mapping[str, int],
    capacity_root: Path | None,
) -> Callable[[float], dict[str, CapacityModel]]:
    """slo_scale -> per-fleet capacity, recomputed from the step records under the scaled SLO (cached)."""
    step_cache: dict[float, dict[str, dict[str, Measure]]] = {}
    cap_cache: dict[float, dict[str, CapacityModel]] = {}
    replay_peaks = goodput.peak_in_flight(rs)
    replay_median_e2e = goodput.median_e2e(rs)
    searches = capacity.search_paths(sweep, capacity_root, [f.name for f in m.fleets])

    def step_measures(scale: float) -> dict[str, dict[str, Measure]]:
        if scale not in step_cache:
            ttft, itl = m.slo.ttft_p95_s * scale, m.slo.itl_p95_s * scale
            if scale == 1.0:
                step_cache[scale] = {s.label: goodput.measure_fleets(s.records, ttft, itl) for s in sweep}
            else:  # as for the replay: goodput changes with the SLO, the measured percentiles do not
                base = step_measures(1.0)
                step_cache[scale] = {
                    s.label: {
                        k: v.model_copy(
                            update={"p95_ttft_s": base[s.label][k].p95_ttft_s, "p95_itl_s": base[s.label][k].p95_itl_s}
                        )
                        for k, v in goodput.measure_fleets(s.records, ttft, itl, percentiles=False).items()
                    }
                    for s in sweep
                }
        return step_cache[scale]

    def capacities(scale: float) -> dict[str, CapacityModel]:
        if scale not in cap_cache:
            cap_cache[scale] = capacity.measure_capacity(
                sweep,
                [f.name for f in m.fleets],
                inst,
                m.slo.ttft_p95_s * scale,
                m.slo.itl_p95_s * scale,
                m.slo.max_error_rate,
                replay=measures(scale),
                replay_peaks=replay_peaks,
                replay_median_e2e=replay_median_e2e,
                step_measures=step_measures(scale),
                searches=searches,
            )
        return cap_cache[scale]

    return capacities


def step_percentile_intervals(head: ScenarioEvaluation, rs: RecordSet, sweep: list[capacity.SweepStep] | None) -> None:
    """Every capacity step's P95s get their 95% interval and n, as the fleet rows' do."""
    by_label = {s.label: s.records for s in sweep or []}
    for name, row in head.fleets.items():
        for st in row.capacity.steps if row.capacity is not None else []:
            records = rs if st.label == capacity.REPLAY else by_label.get(st.label)
            if records is None:
                continue
            ttft, itl = intervals.latency_cis(records, name)
            st.p95_ttft_ci_s, st.p95_ttft_n = (ttft.bounds[0], ttft.bounds[1]), ttft.n
            st.p95_itl_ci_s, st.p95_itl_n = (itl.bounds[0], itl.bounds[1]), itl.n


def _intervals_fn(
    m: Manifest,
    rs: RecordSet,
    measures: Callable[[float], dict[str, Measure]],
    inst: Mapping[str, int],
    sweep: list[capacity.SweepStep] | None,
    capacities: Callable[[float], dict[str, CapacityModel]] | None,
) -> intervals.IntervalsFn:
    """slo_scale -> per-fleet 95% intervals (cached). Each step's P95 intervals are computed once,
    and its capacity interval once per SLO (intervals.StepEvidence): the sensitivity cells that
    keep the SLO only re-read them."""
    evidence: dict[tuple[str, str], intervals.StepEvidence] = {}
    cache: dict[float, dict[str, intervals.FleetIntervals]] = {}
    by_label = {s.label: s for s in sweep or []}

    def step(fleet: str, st: CapacityStep) -> intervals.StepEvidence | None:
        key = (fleet, st.label)
        if key not in evidence:
            src = by_label.get(st.label)
            if src is None:
                return None
            evidence[key] = intervals.step_evidence(
                st.label,
                src.records,
                fleet,
                requests=st.requests,
                per_instance_tok_s=st.per_instance_goodput_tok_s,
                window_s=st.window_s,
                instances=st.instances or inst.get(fleet, 0),  # as the step's point divides (counted while it ran)
            )
        return evidence[key]

    def replay(fleet: str, fm: Measure) -> intervals.StepEvidence:
        """The replay's evidence under this scale's goodput; its P95s and capacity cache are the base scale's."""
        key = (fleet, intervals.REPLAY)
        if key not in evidence:
            evidence[key] = intervals.replay_evidence(rs, fleet, fm, inst.get(fleet, 0))
        base = evidence[key]
        n = inst.get(fleet, 0)
        per = fm.goodput_tok_s / n if fm.goodput_tok_s is not None and n > 0 else None
        return replace(base, requests=fm.requests, per_instance_tok_s=per, window_s=fm.window_s or 0.0)

    def fn(scale: float) -> dict[str, intervals.FleetIntervals]:
        if scale not in cache:
            ttft, itl = m.slo.ttft_p95_s * scale, m.slo.itl_p95_s * scale
            out: dict[str, intervals.FleetIntervals] = {}
            for name, fm in measures(scale).items():
                if fm.requests == 0:
                    continue
                rep = replay(name, fm)
                cap = capacities(scale).get(name) if capacities is not None else None
                basis = cap.step if cap is not None and cap.step else intervals.REPLAY
                held: dict[str, intervals.StepEvidence] = {}
                for st in cap.steps if cap is not None else ():
                    if st.slo_pass and st.steady_state and st.per_instance_goodput_tok_s:
                        ev = rep if st.label == capacity.REPLAY else step(name, st)
                        if ev is not None:
                            held[st.label] = ev
                out[name] = intervals.fleet_intervals(name, rep, held, basis, ttft, itl)
            cache[scale] = out
        return cache[scale]

    return fn


def _capacity_gaps(m: Manifest, caps: Mapping[str, CapacityModel]) -> tuple[frozenset[str], Findings]:
    """Provenance and gaps of the sweep, and the fleets whose capacity was measured inside the SLO."""
    found = Findings()
    measured: set[str] = set()
    for f in m.fleets:
        cap = caps.get(f.name)
        if cap is None:
            continue
        tried = ", ".join(s.label for s in cap.steps)
        win = cap.winner
        if cap.search is not None:
            held_fleets, searched = _search_gaps(f.name, cap, cap.search, tried)
            measured |= held_fleets
            found = found + searched
            continue
        if cap.per_instance_tok_s is None or win is None:
            found.provenance[f"capacity.{f.name}"] = {
                "value": None,
                "source": "missing",
                "detail": f"no steady-state capacity-sweep step held the fleet SLO (tried {tried}); "
                "sized from the replay",
            }
            held = [st for st in cap.steps if st.slo_pass and st.per_instance_goodput_tok_s]
            if held:  # steps held the SLO but none ran long enough to show steady state
                found.gaps.append(Gap(f"capacity.{f.name}", _short_steps_reason(m, f.name, held)))
            else:
                found.gaps.append(Gap(f"capacity.{f.name}", _no_step_held_reason(m, f.name, cap.steps)))
            continue
        measured.add(f.name)
        found.provenance[f"capacity.{f.name}"] = {
            "value": cap.per_instance_tok_s,
            "source": "measured",
            "detail": f"capacity-sweep step {win.label} (x{win.multiplier:g} the manifest's rate): the highest per-instance "
            f"SLO-compliant goodput among the steps that held the fleet SLO (tried {tried})",
        }
        if win.multiplier == cap.top_multiplier:
            found.gaps.append(
                Gap(
                    f"capacity.{f.name}",
                    f"{f.name}: the capacity comes from the highest multiplier tried ({win.label}); "
                    "capacity may be higher: raise the sweep's top multiplier",
                    blocks_go=False,
                )
            )
    return frozenset(measured), found


def _short_steps_reason(m: Manifest, fleet: str, held: list[CapacityStep]) -> str:
    """Steps held the SLO but their arrivals spanned too few request lifetimes: say which quantity
    was short (the arrival span, against 3 lifetimes) and what to change, given the manifest's own step_s."""
    k = capacity.STEADY_STATE_LIFETIMES
    parts, advice = [], []
    sweep = m.workload.capacity_sweep
    for st in held:
        span, life = st.window_s or 0.0, st.median_e2e_s or 0.0
        need = k * life
        parts.append(
            f"{st.label}: arrivals spanned {span:.1f} s, {k:g} median request lifetimes need {k:g} x {life:.1f} s = {need:.1f} s"
        )
        if st.label == capacity.REPLAY:
            advice.append(
                f"widen workload.window.duration_s (now {m.workload.window.duration_s:g} s) so the replay's arrivals "
                f"span at least {need:.0f} s"
            )
        elif sweep is None:
            advice.append(f"lengthen step {st.label} so its arrivals span at least {need:.0f} s")
        elif sweep.step_s < need:
            advice.append(
                f"lengthen workload.capacity_sweep.step_s (now {sweep.step_s:g} s) to at least {math.ceil(need)} s"
            )
        elif span > 0:
            advice.append(
                f"workload.capacity_sweep.step_s is {sweep.step_s:g} s but {st.label}'s arrivals filled only {span:.1f} s "
                f"of it: lengthen step_s to at least {math.ceil(sweep.step_s * need / span)} s, or widen "
                "workload.window.duration_s if the trace window runs out of arrivals"
            )
    return (
        f"{fleet}: the steps that met the SLO were too short to show steady state ({'; '.join(parts)}); "
        + "; ".join(dict.fromkeys(advice))
    )


def _no_step_held_reason(m: Manifest, fleet: str, steps: Sequence[CapacityStep]) -> str:
    """No step held the SLO: each step's figure that missed, and the smallest multiplier tried."""
    slo = m.slo
    misses = []
    for st in steps:
        why = [
            f"P95 {what} {got:.3g} s > {target:g} s"
            for what, got, target in (("TTFT", st.p95_ttft_s, slo.ttft_p95_s), ("ITL", st.p95_itl_s, slo.itl_p95_s))
            if got is not None and got > target
        ]
        if st.error_rate is not None and st.error_rate > slo.max_error_rate:
            why.append(f"error rate {st.error_rate:.3f} > {slo.max_error_rate:g}")
        misses.append(
            f"{st.label}: {', '.join(why) or ('no requests' if not st.requests else 'no SLO-compliant goodput')}"
        )
    lowest = min((st for st in steps if st.label != capacity.REPLAY), key=lambda st: st.multiplier, default=None)
    advice = f"add a step below the smallest multiplier tried ({lowest.label})" if lowest else "add capacity steps"
    return f"{fleet}: no sweep step met the SLO ({'; '.join(misses)}); {advice}"


def _search_gaps(
    fleet: str,
    cap: CapacityModel,
    path: capacity.SearchPath,
    tried: str,
) -> tuple[set[str], Findings]:
    """Provenance and gaps of a fleet measured by the automatic search: the stop rule is named."""
    found = Findings()
    stop = f"the capacity search stopped ({path.stop_rule}: {path.stop_detail})"
    win = cap.winner
    if cap.per_instance_tok_s is None or win is None:
        found.provenance[f"capacity.{fleet}"] = {
            "value": None,
            "source": "missing",
            "detail": f"no steady-state step held the fleet SLO (tried {tried}); sized from the replay",
        }
        found.gaps.append(Gap(f"capacity.{fleet}", f"{fleet}: no steady-state step held the SLO; {stop}"))
        return set(), found
    found.provenance[f"capacity.{fleet}"] = {
        "value": cap.per_instance_tok_s,
        "source": "measured",
        "detail": f"capacity search step {win.label} (x{win.multiplier:.4g} the manifest's rate): the highest per-instance "
        f"SLO-compliant goodput among the steps that held the fleet SLO (tried {tried}); {stop}",
    }
    if not path.converged:
        found.gaps.append(
            Gap(
                f"capacity.{fleet}",
                f"{fleet}: the SLO boundary is not bracketed within {path.tolerance:.0%}: {stop}; "
                "capacity may be higher than the figure used",
                blocks_go=False,
            )
        )
    return {fleet}, found
