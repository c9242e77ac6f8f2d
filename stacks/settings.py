"""Synth-time inputs: the manifest named by `-c manifest=PATH`, checked against pinned facts.

Every error names the manifest field (or the context key) it comes from, so a bad manifest
fails `cdk synth` with a sentence an operator can act on instead of a jsii stack trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.compile_host import compile_host
from core.manifest import Manifest, ManifestError, load_manifest
from core.naming import REHEARSAL_CONTEXT
from stacks.compile_boot import COMPILE_FLEETS_CONTEXT

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MANIFEST = REPO_ROOT / "manifests" / "llama3-8b-inf2-vs-g6.yaml"
# cdk.context.json key holding the AZ names of each region, pinned so synth works offline
# and a manifest AZ outside its region fails before anything is deployed.
REGION_AZS_CONTEXT_KEY = "harness:region-availability-zones"


class SynthInputError(ValueError):
    """A manifest or context value the stacks cannot build from; the message names the field."""


@dataclass(frozen=True)
class SynthSettings:
    manifest: Manifest
    manifest_path: Path
    vpc_azs: tuple[str, ...]
    weights_s3_uri: str | None
    # deploy's compile phase (stacks/compile_instance.py): these fleets get a compile instance and
    # every fleet's group is at 0; empty: the fleets at their size.
    compile_fleets: tuple[str, ...] = ()
    # `-c rehearsal=1` (issue 51): every fleet is its emulator on the rehearsal host type
    # (stacks/rehearsal_fleet.py); everything else as in the campaign's stack.
    rehearsal: bool = False


def load_checked_manifest(path: str | Path) -> tuple[Manifest, Path]:
    p = Path(path)
    if not p.is_absolute():
        p = (REPO_ROOT / p) if not p.exists() else p.resolve()
    try:
        return load_manifest(p), p
    except ManifestError as exc:
        # Re-raised as one clear line per issue (e.g. "operator.cidr: 0.0.0.0/0 opens ...").
        lines = "\n".join(f"  {issue}" for issue in exc.issues)
        raise SynthInputError(f"manifest {p} is invalid:\n{lines}") from None


def vpc_availability_zones(manifest: Manifest, region_azs: Mapping[str, Any]) -> tuple[str, ...]:
    """Union of the fleets' AZs, each checked against the pinned AZ list of the manifest region."""
    region = manifest.costs.region
    known = region_azs.get(region)
    if not isinstance(known, list) or not known:
        raise SynthInputError(
            f"costs.region: no availability zones pinned for {region!r} in cdk.context.json "
            f"({REGION_AZS_CONTEXT_KEY}); add the region's AZ names there"
        )
    for i, fleet in enumerate(manifest.fleets):
        for j, az in enumerate(fleet.availability_zones):
            if az not in known:
                raise SynthInputError(
                    f"fleets[{i}].availability_zones[{j}]: {az!r} is not an availability zone of {region} (pinned: {', '.join(known)})"
                )
    azs = tuple(sorted({az for f in manifest.fleets for az in f.availability_zones}))
    if len(azs) < 2:
        raise SynthInputError(
            f"fleets[*].availability_zones: the VPC needs at least two AZs, the fleets name only {list(azs)}"
        )
    return azs


def settings_from_context(context: Mapping[str, Any]) -> SynthSettings:
    raw_path = context.get("manifest") or DEFAULT_MANIFEST
    manifest, path = load_checked_manifest(str(raw_path))
    region_azs = context.get(REGION_AZS_CONTEXT_KEY)
    if not isinstance(region_azs, Mapping):
        raise SynthInputError(
            f"context {REGION_AZS_CONTEXT_KEY!r} is missing: run synth from the repository root (cdk.context.json)"
        )
    weights = context.get("weights_s3_uri")
    if weights is not None and not (isinstance(weights, str) and weights.startswith("s3://") and len(weights) > 5):
        raise SynthInputError(f"context weights_s3_uri: expected s3://bucket/prefix, got {weights!r}")
    compile_fleets = compile_fleets_from_context(manifest, context.get(COMPILE_FLEETS_CONTEXT))
    rehearsal = rehearsal_from_context(context.get(REHEARSAL_CONTEXT))
    if rehearsal and compile_fleets:
        raise SynthInputError(
            f"context {COMPILE_FLEETS_CONTEXT}: a rehearsal (-c {REHEARSAL_CONTEXT}=1) has no compile phase; "
            "its fleets serve emulators"
        )
    return SynthSettings(
        manifest, path, vpc_availability_zones(manifest, region_azs), weights, compile_fleets, rehearsal
    )


def rehearsal_from_context(raw: Any) -> bool:
    """`-c rehearsal=1` on; absent or 0 off (the CLI passes context values as strings)."""
    if raw in (None, "", "0", 0, False):
        return False
    if raw in ("1", 1, True):
        return True
    raise SynthInputError(f"context {REHEARSAL_CONTEXT}: expected 1 or 0, got {raw!r}")


def compile_fleets_from_context(manifest: Manifest, raw: Any) -> tuple[str, ...]:
    """`-c compile_fleets=inf2[,other]`: each a fleet of the manifest whose host memory is at risk
    and which a larger instance of its accelerator can compile (core.compile_host)."""
    if raw in (None, ""):
        return ()
    names = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) and n.strip() for n in names):
        raise SynthInputError(
            f"context {COMPILE_FLEETS_CONTEXT}: expected fleet names separated by commas, got {raw!r}"
        )
    fleets = {f.name: f for f in manifest.fleets}
    out: list[str] = []
    for name in (n.strip() for n in names):
        if name not in fleets:
            raise SynthInputError(
                f"context {COMPILE_FLEETS_CONTEXT}: {name!r} is not a fleet of the manifest ({', '.join(fleets)})"
            )
        host = compile_host(manifest, fleets[name])
        if host is None:
            raise SynthInputError(
                f"context {COMPILE_FLEETS_CONTEXT}: {name}'s host memory is not at risk; it compiles on its own instances"
            )
        if host.instance_type is None:
            raise SynthInputError(f"context {COMPILE_FLEETS_CONTEXT}: {host.cannot_compile()}")
        if name not in out:
            out.append(name)
    return tuple(out)
