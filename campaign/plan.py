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
from core.compile_host import HOST_MEMORY_RISK_FRACTION
from core.manifest import Fleet, Manifest, fit, weight_bytes
from core.roofline import Roofline
from core.serving import definition_for
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
    """A sentence when the weights come close to a Neuron instance's host memory, else None.

    Neuron only: the reports above are of the Neuron load/compile path. GPU stacks map the
    safetensors and copy them to the device, and the seed's G6 baseline serves this 8B model
    on g6.xlarge (16 GiB host) today."""
    it = catalog.instance(f.instance_type)
    weights_gib = weight_bytes(m) / catalog.GIB
    if it.accelerator.vendor != "aws-neuron" or weights_gib <= HOST_MEMORY_RISK_FRACTION * it.memory_gib:
        return None
    return (
        f"weights {weights_gib:.1f} GiB are {weights_gib / it.memory_gib:.0%} of {it.name}'s {it.memory_gib} GiB host memory "
        f"(risk above {HOST_MEMORY_RISK_FRACTION:.0%}: loading and compiling hold them in host memory at least once more); "
        "load precompiled artifacts (NEURON_COMPILED_ARTIFACTS) instead of compiling here: compile once on a larger "
        f"{it.accelerator.name} instance with this fleet's server flags and publish the set under the results bucket's "
        f"{compiled_prefix(m, f) or COMPILED_PREFIX + '/<key>/'}<any name>/, {COMPLETE_MARKER} written last (its key names {f.instance_type}: a set "
        "published under the larger instance's own key is never fetched here); each instance then fetches it at boot"
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
    try:
        price = prices.instance_hourly(f.instance_type, m.costs.region)
        hourly: float | None = price.usd
        prov = price.provenance
    except prices.PriceNotFound as exc:
        hourly, prov = None, f"missing: {exc}"
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
