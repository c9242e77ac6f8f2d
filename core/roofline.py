"""The roofline: the one place that turns bytes and FLOPs into seconds.

A forward pass over a batch costs the larger of
- memory time: (weight bytes + KV bytes read) / (peak bandwidth x bandwidth efficiency), and
- compute time: 2 x params x tokens processed / (peak dense BF16 FLOP/s x compute efficiency),
plus the stack's fixed per-step overhead. `campaign.plan.roofline` prints these figures for a fleet and
`runtime.emulator.timing` prices every emulated scheduler step with them; the efficiencies and
overheads come from the manifest, or from the calibration fitted on published measurements
(`data/calibration/efficiency.json`).
"""

from __future__ import annotations

from dataclasses import dataclass

from core import catalog
from core.manifest import Fleet, Manifest, kv_bytes_per_token, weight_bytes


@dataclass(frozen=True)
class Roofline:
    """One server's (one replica's) peak figures at its tensor-parallel degree."""

    weight_bytes: float
    kv_bytes_per_token: float
    params: float
    bandwidth_bytes_s: float  # peak, summed over the TP shards
    flops: float  # peak dense BF16 FLOP/s, summed over the TP shards

    @classmethod
    def of(
        cls, instance_type: str, tensor_parallel: int, weight_bytes: float, kv_bytes_per_token: float, params: float
    ) -> Roofline:
        it = catalog.instance(instance_type)
        return cls(
            weight_bytes=weight_bytes,
            kv_bytes_per_token=kv_bytes_per_token,
            params=params,
            bandwidth_bytes_s=it.bandwidth_gbs(tensor_parallel) * catalog.GB,
            flops=it.bf16_tflops(tensor_parallel) * 1e12,
        )

    @classmethod
    def for_fleet(cls, m: Manifest, f: Fleet) -> Roofline:
        return cls.of(
            f.instance_type, f.tensor_parallel, weight_bytes(m), kv_bytes_per_token(m), m.model.params_b * 1e9
        )

    def memory_s(self, kv_tokens_read: float, bandwidth_efficiency: float) -> float:
        """Time to stream every weight once plus `kv_tokens_read` tokens of KV cache."""
        return (self.weight_bytes + self.kv_bytes_per_token * kv_tokens_read) / (
            self.bandwidth_bytes_s * bandwidth_efficiency
        )

    def compute_s(self, tokens: float, compute_efficiency: float) -> float:
        """Time for the matmuls of `tokens` tokens (2 FLOPs per parameter per token)."""
        return 2.0 * self.params * tokens / (self.flops * compute_efficiency)

    def decode_ceiling_tok_s(self) -> float:
        """Batch-1 decode ceiling: peak bandwidth over the weight bytes read per token."""
        return self.bandwidth_bytes_s / self.weight_bytes
