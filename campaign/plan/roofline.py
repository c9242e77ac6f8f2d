"""Back-of-envelope plan per fleet: memory fit, roofline decode ceiling, prefill time, price.

Decode is memory-bound: every step streams all weights (plus the batch's KV cache) from
accelerator memory, so tokens/s per sequence <= bandwidth / bytes read per step. Prefill is
compute-bound: about 2 x params FLOPs per prompt token. These are ceilings (core/roofline.py),
then scaled by the fleet's efficiency: fitted on published measurements when the manifest names
a calibration group, else the manifest's assumed numbers. The plan says which.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from campaign.aws.compile_estimate import (
    CompilePhase,
    compile_phase,
    compiled_prefix,
    hourly_price,
)
from core import catalog
from core.compile_host import HOST_MEMORY_RISK_FRACTION, CompileHost, compile_host
from core.manifest import Fleet, Manifest, fit
from core.roofline import Roofline
from runtime.emulator.timing import TimingModel
from stacks.fleet_boot import COMPLETE_MARKER
from stacks.fleet_paths import COMPILED_PREFIX


@dataclass(frozen=True)
class FleetPlan:
    fleet: str
    instance_type: str
    accelerator: str
    tensor_parallel: int
    replicas_per_instance: int
    fits: bool
    weights_gib: float
    kv_cache_gib: float
    reserve_gib: float
    visible_gib: float
    bandwidth_gbs: float
    decode_ceiling_tok_s: float  # batch 1, weights only (seed formula), 100% bandwidth
    decode_expected_tok_s: (
        float  # batch 1 as the stack's decode runs it, at the fleet's bandwidth efficiency and step overhead
    )
    batch_decode_tok_s: (
        float  # per instance: every replica at max_concurrency, half-full contexts, as the stack's decode reads them
    )
    prefill_s: float  # max_input_tokens prompt, at the fleet's compute efficiency, plus overheads
    efficiency: str  # e.g. "bandwidth 0.58, compute 0.19, step 18.8 ms, request 121 ms"
    efficiency_source: str  # the calibration group and its rows, or "manifest (assumed)"
    hourly_usd: float | None
    price_provenance: str
    host_memory_gib: float = 0.0
    host_memory_warning: str | None = None
    compile_phase: CompilePhase | None = None  # `deploy` compiles first, on a larger host

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def decode_step_s(m: Manifest, f: Fleet, batch: int, mean_context: float, efficiency: float) -> float:
    return Roofline.for_fleet(m, f).memory_s(batch * mean_context, efficiency)


def decode_read_s(m: Manifest, f: Fleet, batch: int, mean_context: float) -> float:
    """Memory time of one decode step of `batch` sequences on one replica, reading what the
    stack's decode reads (a Neuron graph: every compiled slot over the bucket of that context,
    whatever the batch; paged attention: the live KV)."""
    kv = TimingModel.for_fleet(m, f).decode_kv_tokens([round(mean_context)] * batch)
    return Roofline.for_fleet(m, f).memory_s(kv, f.efficiency.resolved().bandwidth)


def prefill_s(m: Manifest, f: Fleet, prompt_tokens: int, efficiency: float) -> float:
    return Roofline.for_fleet(m, f).compute_s(prompt_tokens, efficiency)


def host_memory_warning(m: Manifest, f: Fleet) -> str | None:
    """A sentence when the weights come close to a Neuron instance's host memory
    (core.compile_host), saying where `deploy` compiles instead; else None."""
    host = compile_host(m, f)
    if host is None:
        return None
    return f"{_host_memory_risk(host)}; {_compiled_instead(m, f, host)}"


def _host_memory_risk(host: CompileHost) -> str:
    return (
        f"weights {host.weights_gib:.1f} GiB are {host.weights_gib / host.fleet_host_gib:.0%} of {host.fleet_instance_type}'s "
        f"{host.fleet_host_gib} GiB host memory (risk above {HOST_MEMORY_RISK_FRACTION:.0%}: loading and compiling hold "
        "them in host memory at least once more)"
    )


def _compiled_instead(m: Manifest, f: Fleet, host: CompileHost) -> str:
    where = compiled_prefix(m, f) or COMPILED_PREFIX + "/<key>/"
    if host.instance_type is None:
        acc = catalog.instance(f.instance_type).accelerator.name
        return (
            f"no {acc} instance in core/catalog.py clears it at TP {f.tensor_parallel}, so `deploy` refuses unless a set "
            f"compiled elsewhere with this fleet's server flags is published under the results bucket's {where}<any name>/, "
            f"{COMPLETE_MARKER} written last (its key names {f.instance_type})"
        )
    return (
        f"`deploy` compiles it once first, on one {host.instance_type} ({host.host_gib} GiB host) with this fleet's server "
        f"flags, and publishes the set under the results bucket's {where} (this fleet's key: it names {f.instance_type}); "
        "the fleet's instances fetch it at boot instead of compiling"
    )


def plan_fleet(m: Manifest, f: Fleet) -> FleetPlan:
    it = catalog.instance(f.instance_type)
    ft = fit(m, f)
    bw = it.bandwidth_gbs(f.tensor_parallel)
    eff = f.efficiency.resolved()
    step = eff.step_overhead_ms / 1000
    rc = m.workload.request_class
    half_ctx = rc.max_input_tokens + rc.max_output_tokens / 2
    hourly, prov = hourly_price(f.instance_type, m.costs.region)
    return FleetPlan(
        fleet=f.name,
        instance_type=f.instance_type,
        accelerator=f"{it.accelerator.name} x{it.devices}",
        tensor_parallel=f.tensor_parallel,
        replicas_per_instance=f.replicas_per_instance,
        fits=ft.fits,
        weights_gib=round(ft.weights_gib, 2),
        kv_cache_gib=round(ft.kv_cache_gib, 2),
        reserve_gib=round(ft.reserve_gib, 2),
        visible_gib=round(ft.visible_gib, 2),
        bandwidth_gbs=bw,
        decode_ceiling_tok_s=Roofline.for_fleet(m, f).decode_ceiling_tok_s(),
        decode_expected_tok_s=1.0 / (decode_read_s(m, f, 1, 0) + step),
        batch_decode_tok_s=f.sequences_per_instance / (decode_read_s(m, f, f.max_concurrency, half_ctx) + step),
        prefill_s=prefill_s(m, f, rc.max_input_tokens, eff.compute) + step + eff.request_overhead_ms / 1000,
        efficiency=f"bandwidth {eff.bandwidth:.2f}, compute {eff.compute:.2f}, step overhead {eff.step_overhead_ms:.1f} ms, "
        f"request overhead {eff.request_overhead_ms:.0f} ms",
        efficiency_source=eff.provenance,
        hourly_usd=hourly,
        price_provenance=prov,
        host_memory_gib=float(it.memory_gib),
        host_memory_warning=host_memory_warning(m, f),
        compile_phase=compile_phase(m, f),
    )


def plan(m: Manifest) -> list[FleetPlan]:
    return [plan_fleet(m, f) for f in m.fleets]


def render_text(m: Manifest, plans: list[FleetPlan]) -> str:
    lines = [f"campaign {m.campaign}  manifest {m.short_digest}  model {m.model.repo}@{m.model.commit[:10]}", ""]
    for p in plans:
        lines += [
            f"{p.fleet}: {p.instance_type} ({p.accelerator}), TP={p.tensor_parallel}"
            + (f" x {p.replicas_per_instance} replicas" if p.replicas_per_instance > 1 else ""),
            f"  memory   {'fits' if p.fits else 'DOES NOT FIT'}: weights {p.weights_gib:.2f} + KV {p.kv_cache_gib:.2f} "
            f"+ reserve {p.reserve_gib:.2f} GiB of {p.visible_gib:.2f} GiB visible",
            f"  host     {'AT RISK: ' + p.host_memory_warning if p.host_memory_warning else f'{p.host_memory_gib:.0f} GiB host memory'}",
            *_compile_phase_lines(p.compile_phase),
            f"  decode   ceiling {p.decode_ceiling_tok_s:.1f} tok/s at batch 1 ({p.bandwidth_gbs:.0f} GB/s), "
            f"expected {p.decode_expected_tok_s:.1f}; batch {m.fleet(p.fleet).max_concurrency}"
            + (f" on each of {p.replicas_per_instance} replicas" if p.replicas_per_instance > 1 else "")
            + f": {p.batch_decode_tok_s:.0f} tok/s",
            f"  prefill  {p.prefill_s * 1000:.0f} ms for {m.workload.request_class.max_input_tokens} prompt tokens",
            f"  efficiency {p.efficiency}",
            f"           from {p.efficiency_source}",
            "  price    "
            + (f"${p.hourly_usd:.4f}/h ({p.price_provenance})" if p.hourly_usd is not None else p.price_provenance),
            "",
        ]
    return "\n".join(lines)


def _compile_phase_lines(c: CompilePhase | None) -> list[str]:
    if c is None:
        return []
    usd = (
        f"{c.usd:,.2f} USD at ${c.hourly_usd:.4f}/h ({c.price_provenance})" if c.usd is not None else c.price_provenance
    )
    check_usd = (
        f"{c.check_usd:,.2f} USD ({c.check_price_provenance})" if c.check_usd is not None else c.check_price_provenance
    )
    return [
        f"  compile  once, before the fleet boots: 1 x {c.instance_type} ({c.host_memory_gib} GiB host), "
        f"at most {c.minutes:g} min, {usd}",
        f"           minutes: {c.minutes_source}",
        f"  check    then 1 x {c.check_instance_type}, the fleet's own type, on the published set, healthy in its "
        f"target group before the group is sized: at most {c.check_minutes:g} min (its health grace), {check_usd}",
    ]
