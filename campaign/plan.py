"""Back-of-envelope plan per fleet: memory fit, roofline decode ceiling, prefill time, price.

Decode is memory-bound: every step streams all weights (plus the batch's KV cache) from
accelerator memory, so tokens/s per sequence <= bandwidth / bytes read per step. Prefill is
compute-bound: about 2 x params FLOPs per prompt token. These are ceilings (core/roofline.py),
then scaled by the fleet's efficiency: fitted on published measurements when the manifest names
a calibration group, else the manifest's assumed numbers. The plan says which.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from core import catalog, prices
from core.cloud_contract import HEALTH_GRACE_MIN
from core.compile_host import HOST_MEMORY_RISK_FRACTION, CompileHost, compile_host
from core.manifest import Fleet, Manifest, fit, weight_bytes
from core.roofline import Roofline
from core.serving import definition_for
from runtime.emulator.timing import TimingModel
from stacks.fleet_boot import COMPLETE_MARKER
from stacks.fleet_paths import COMPILED_PREFIX

# Published, one example: "a small-ish model of 15GB might take around 15min to compile" (vLLM User
# Guide for NxD Inference, "Loading pre-compiled models", cited at core.serving.CompiledArtifacts).
NEURON_COMPILE_MIN_PER_GB = 15.0 / 15.0
# The compile phase beyond the compile instance's own boot (bounded by the Neuron health grace, as
# a fleet instance's): launching it, publishing the set and the second `cdk deploy` that sizes the
# fleets. Assumed.
COMPILE_PHASE_OVERHEAD_MIN = 10.0


@dataclass(frozen=True)
class CompilePhase:
    """`deploy`'s compile phase for one at-risk fleet (core.compile_host): one instance of a larger
    type compiles the fleet's server definition and publishes the set under the fleet's key."""

    fleet: str
    instance_type: str  # the compile instance
    host_memory_gib: int
    weights_gib: float
    compile_minutes: float  # the compile itself, at the published rate
    minutes: float  # at most: the compile instance's life and deploy's timeout for it
    minutes_source: str
    hourly_usd: float | None
    usd: float | None  # hourly_usd x minutes
    price_provenance: str
    compiled_prefix: str  # compiled/<the fleet's key>/ in the results bucket


def hourly_price(instance_type: str, region: str) -> tuple[float | None, str]:
    """The On-Demand price of one instance and where it comes from (the pinned snapshot), or None
    and why it is missing."""
    try:
        price = prices.instance_hourly(instance_type, region)
    except prices.PriceNotFound as exc:
        return None, f"missing: {exc}"
    return price.usd, price.provenance


def compile_phase(m: Manifest, f: Fleet) -> CompilePhase | None:
    """None when the fleet compiles on its own instances, or when no host can (`deploy` refuses)."""
    host = compile_host(m, f)
    if host is None or host.instance_type is None or host.host_gib is None:
        return None
    grace = HEALTH_GRACE_MIN[catalog.instance(host.instance_type).accelerator.vendor]
    compile_min = weight_bytes(m) / 1e9 * NEURON_COMPILE_MIN_PER_GB
    minutes = grace + COMPILE_PHASE_OVERHEAD_MIN
    hourly, prov = hourly_price(host.instance_type, m.costs.region)
    return CompilePhase(
        fleet=f.name,
        instance_type=host.instance_type,
        host_memory_gib=host.host_gib,
        weights_gib=round(host.weights_gib, 2),
        compile_minutes=round(compile_min, 1),
        minutes=minutes,
        minutes_source=(
            f"the Neuron health-check grace, {grace} min (core.cloud_contract.HEALTH_GRACE_MIN), bounds the "
            f"compile instance's boot as it bounds a fleet instance's, + {COMPILE_PHASE_OVERHEAD_MIN:g} min assumed to "
            "launch it, publish the set and size the fleets; the compile itself about "
            f"{compile_min:.0f} min (published: the NxD Inference vLLM guide's 15 GB in about 15 min)"
        ),
        hourly_usd=hourly,
        usd=None if hourly is None else round(hourly * minutes / 60, 2),
        price_provenance=prov,
        compiled_prefix=compiled_prefix(m, f) or f"{COMPILED_PREFIX}/<key>/",
    )


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


def compiled_prefix(m: Manifest, f: Fleet) -> str | None:
    """Where the fleet's instances share their compiled artifacts in the results bucket
    (stacks.fleet_boot); None: its stack compiles nothing."""
    compiled = definition_for(m, f).compiled
    return None if compiled is None else f"{COMPILED_PREFIX}/{compiled.key}/"


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
    return [
        f"  compile  once, before the fleet boots: 1 x {c.instance_type} ({c.host_memory_gib} GiB host), "
        f"at most {c.minutes:g} min, {usd}",
        f"           minutes: {c.minutes_source}",
    ]
