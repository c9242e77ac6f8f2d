"""The rehearsal (issue 51): the whole AWS path once on cheap instances, before a campaign pays for it.

Every accelerator fleet is replaced by its emulator on one host type: the cheapest non-burstable,
current-generation x86 type in the price snapshot with at least `MIN_VCPUS` and `MIN_MEMORY_GIB`.
A burstable type could run out of CPU credits mid-run and time out a health check or a step, which
would make the rehearsal fail for a reason the campaign does not have. The candidates' facts
(vCPU, memory, architecture, burstable, generation) are in core/data/host-types.csv, each row with
its source; their prices are the snapshot's, so the choice moves when the snapshot does.

The rehearsal's shape is fixed, so that its price cannot be met by skipping stages: the gate, a
`REPLAY_S` replay, `CAPACITY_STEPS` capacity steps and `SETTLE_SEGMENTS` settle segment per fleet,
one `run --detach` / `--attach`.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from core import prices
from core.errors import CampaignError

HOST_TYPES_CSV = Path(__file__).parent / "data" / "host-types.csv"

MIN_VCPUS = 2  # the emulator's server and its scheduler's timing loop beside the boot's agents
MIN_MEMORY_GIB = 4  # the emulator, the pinned tokenizer's files loaded, and the OS
ARCH = "x86_64"  # the stacks build the harness's images for linux/amd64 (stacks/load_generator.py)

# The fixed rehearsal, side by side on every fleet (seconds of arrivals and drain).
REPLAY_S = 120.0  # the trace's replay, cut to 2 minutes
CAPACITY_STEPS = 2  # two steps show a second step's tasks start once the first's stopped
STEP_S = 30.0  # each capacity step's and settle segment's arrivals and drain
SETTLE_SEGMENTS = 1
# How long an emulator fleet may take to be healthy behind the NLB (its health-check grace): an
# instance launched and booted, the emulator's image pulled through the VPC's ECR endpoints, the
# emulator started (seconds: no weights, no compile), then 2 passing checks 15 s apart
# (stacks/load_balancer.py). An assumption until a real rehearsal measures it.
READY_MIN = 3.0


class HostTypesError(CampaignError, ValueError):
    pass


class NoRehearsalType(CampaignError, LookupError):
    pass


@dataclass(frozen=True)
class HostType:
    """A host (non-accelerator) instance type's facts, with their source."""

    name: str
    vcpus: int
    memory_gib: float
    arch: str
    burstable: bool
    current_generation: bool
    source: str

    def unfit_because(self) -> str | None:
        """Why this type cannot host a rehearsal fleet, or None."""
        if self.arch != ARCH:
            return f"{self.arch}, not {ARCH}"
        if self.burstable:
            return "burstable"
        if not self.current_generation:
            return "previous generation"
        if self.vcpus < MIN_VCPUS or self.memory_gib < MIN_MEMORY_GIB:
            return f"{self.vcpus} vCPU / {self.memory_gib:g} GiB, under {MIN_VCPUS} vCPU / {MIN_MEMORY_GIB} GiB"
        return None


@dataclass(frozen=True)
class RehearsalType:
    """The host type every rehearsal fleet runs on, its snapshot price and where both come from."""

    host: HostType
    price: prices.Price

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def hourly_usd(self) -> float:
        return self.price.usd

    @property
    def provenance(self) -> str:
        return (
            f"{self.name}: the cheapest non-burstable current-generation {ARCH} type with at least {MIN_VCPUS} vCPU and "
            f"{MIN_MEMORY_GIB} GiB in the price snapshot, {self.hourly_usd:g} USD/hour ({self.price.provenance}); "
            f"{self.host.vcpus} vCPU, {self.host.memory_gib:g} GiB ({self.host.source})"
        )


def _flag(path: Path, lineno: int, col: str, raw: str | None) -> bool:
    if raw in ("true", "false"):
        return raw == "true"
    raise HostTypesError(f"{path}:{lineno}: {col}: expected true or false, got {raw!r}")


def _parse(path: Path) -> dict[str, HostType]:
    out: dict[str, HostType] = {}
    with path.open(newline="", encoding="utf-8") as fh:
        for lineno, row in enumerate(csv.DictReader(fh), start=2):
            for col in ("name", "vcpus", "memory_gib", "arch", "burstable", "current_generation", "source"):
                if not row.get(col):
                    raise HostTypesError(f"{path}:{lineno}: {col}: missing")
            try:
                vcpus, memory = int(row["vcpus"]), float(row["memory_gib"])
            except ValueError:
                raise HostTypesError(
                    f"{path}:{lineno}: vcpus / memory_gib: not numbers: {row['vcpus']!r}, {row['memory_gib']!r}"
                ) from None
            host = HostType(
                row["name"],
                vcpus,
                memory,
                row["arch"],
                _flag(path, lineno, "burstable", row["burstable"]),
                _flag(path, lineno, "current_generation", row["current_generation"]),
                row["source"],
            )
            if host.name in out:
                raise HostTypesError(f"{path}:{lineno}: name: {host.name} listed twice")
            out[host.name] = host
    return out


@cache
def host_types(path: Path = HOST_TYPES_CSV) -> dict[str, HostType]:
    return _parse(path)


def rehearsal_type(region: str, candidates: dict[str, HostType] | None = None) -> RehearsalType:
    """The cheapest fit host type priced in `region`'s snapshot (ties: by name), or an error that
    says why each candidate was left out."""
    hosts = host_types() if candidates is None else candidates
    fit: list[RehearsalType] = []
    left_out: list[str] = []
    for host in hosts.values():
        why = host.unfit_because()
        if why is None:
            try:
                fit.append(RehearsalType(host, prices.instance_hourly(host.name, region)))
                continue
            except prices.PriceNotFound:
                why = f"no snapshot price in {region}"
        left_out.append(f"{host.name} ({why})")
    if not fit:
        raise NoRehearsalType(
            f"no host type for a rehearsal in {region}: it needs a non-burstable current-generation {ARCH} type with "
            f"at least {MIN_VCPUS} vCPU and {MIN_MEMORY_GIB} GiB, listed in core/data/{HOST_TYPES_CSV.name} and priced "
            f"in core/data/prices-{region}.csv; left out: {', '.join(left_out) or 'none listed'}"
        )
    return min(fit, key=lambda t: (t.hourly_usd, t.name))
