"""What `deploy`'s compile phase will take for a fleet whose Neuron host memory is at risk
(core.compile_host): the compile instance, its minutes and its price, and where every fleet
shares its compiled artifacts in the results bucket. `campaign plan` prints it; `deploy` runs it
(campaign.aws.compile_phase)."""

from __future__ import annotations

from dataclasses import dataclass

from core import catalog, prices
from core.cloud_contract import HEALTH_GRACE_MIN
from core.compile_host import compile_host
from core.manifest import Fleet, Manifest, weight_bytes
from core.serving import definition_for
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
    # Then `deploy` brings one instance of the fleet's own type up on the published set and waits
    # until it is healthy in the fleet's target group, at most the fleet's health grace, before the
    # group is sized (campaign.aws.compile_phase.prove_on_fleet_type): the only proof the set loads
    # there. Every other fleet instance is still at 0 meanwhile.
    check_instance_type: str = ""
    check_minutes: float = 0.0  # at most
    check_usd: float | None = None
    check_price_provenance: str = ""


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
    check_min = float(HEALTH_GRACE_MIN[catalog.instance(f.instance_type).accelerator.vendor])
    check_hourly, check_prov = hourly_price(f.instance_type, m.costs.region)
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
        check_instance_type=f.instance_type,
        check_minutes=check_min,
        check_usd=None if check_hourly is None else round(check_hourly * check_min / 60, 2),
        check_price_provenance=check_prov,
    )


def compiled_prefix(m: Manifest, f: Fleet) -> str | None:
    """Where the fleet's instances share their compiled artifacts in the results bucket
    (stacks.fleet_boot); None: its stack compiles nothing."""
    compiled = definition_for(m, f).compiled
    return None if compiled is None else f"{COMPILED_PREFIX}/{compiled.key}/"
