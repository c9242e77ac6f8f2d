"""What one emulated fleet endpoint is: the manifest, one fleet, how many of its instances serve
behind the endpoint, and the faults to inject."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.manifest import Fleet, Manifest
from core.serving import served_model_id


@dataclass(frozen=True)
class FaultConfig:
    """Per-request fault probabilities; each request draws its own from (fault_seed, arrival index)."""

    error_rate: float = 0.0  # HTTP 500 before any token
    stall_rate: float = 0.0  # the sequence pauses stall_s seconds mid-stream
    stall_s: float = 0.0
    truncate_rate: float = 0.0  # the stream ends cleanly at HTTP level but without finish / [DONE]
    reset_rate: float = 0.0  # the TCP connection is reset mid-stream
    slow_start_s: float = 0.0  # first token delayed by this much ...
    slow_start_rate: float = 1.0  # ... for this share of requests
    fault_seed: int = 0

    def __post_init__(self) -> None:
        for name in ("error_rate", "stall_rate", "truncate_rate", "reset_rate", "slow_start_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {value}")
        if self.stall_s < 0 or self.slow_start_s < 0:
            raise ValueError("stall_s and slow_start_s must be >= 0")
        if self.stall_rate > 0 and self.stall_s == 0:
            raise ValueError("stall_rate needs stall_s > 0")


@dataclass(frozen=True)
class EmulatorConfig:
    manifest: Manifest
    fleet: Fleet
    faults: FaultConfig = field(default_factory=FaultConfig)
    # The name requests must carry, as vLLM's --served-model-name; None: the id the fleet's stack
    # serves the model as (core.serving.served_model_id; trtllm-serve: the weights directory's name).
    served_model_name: str | None = None
    # Instances behind the one port, spread as the NLB does (the local campaign passes the fleet's
    # measure_instances); 1 by default, so a bench or test serves one instance unless it asks.
    instances: int = 1

    def __post_init__(self) -> None:
        if self.instances < 1:
            raise ValueError(f"instances must be >= 1, got {self.instances}")

    @classmethod
    def from_manifest(cls, manifest: Manifest, fleet_name: str, **faults: float) -> EmulatorConfig:
        """`faults` are FaultConfig fields, e.g. error_rate=0.1, fault_seed=3."""
        fault_seed = int(faults.pop("fault_seed", 0))
        return cls(manifest, manifest.fleet(fleet_name), FaultConfig(fault_seed=fault_seed, **faults))

    @property
    def model_id(self) -> str:
        return self.served_model_name or served_model_id(self.manifest, self.fleet)
