"""The roofline timing model of one instance, from campaign.catalog and campaign.plan figures.

One scheduler step runs every admitted sequence once. It costs the larger of
- memory time: (weight bytes + KV bytes of every running context) / (bandwidth x efficiency),
  the same formula as campaign.plan.decode_step_s, and
- compute time: 2 x params x (new prompt tokens + one token per decoding sequence)
  / (BF16 TFLOPS x efficiency), the same formula as campaign.plan.prefill_s.
A lone request therefore sees TTFT = max(decode_step_s(1, prompt), prefill_s(prompt)) and
ITL = decode_step_s(1, context) at low load.
"""

from __future__ import annotations

from dataclasses import dataclass

from campaign import catalog
from campaign.manifest import Fleet, Manifest, default_reserve_gib, kv_bytes_per_token, weight_bytes


@dataclass(frozen=True)
class TimingModel:
    weight_bytes: float
    kv_bytes_per_token: float
    bandwidth_bytes_s: float  # effective, after the manifest's efficiency
    flops: float  # effective BF16 FLOP/s
    params: float
    kv_capacity_tokens: int  # (visible - weights - reserve) / KV bytes per token
    max_concurrency: int
    max_model_len: int

    @classmethod
    def for_fleet(cls, m: Manifest, f: Fleet) -> TimingModel:
        it = catalog.instance(f.instance_type)
        tp = f.tensor_parallel
        reserve = f.runtime_reserve_gib if f.runtime_reserve_gib is not None else default_reserve_gib(it, tp)
        free = it.visible_gib(tp) * catalog.GIB - weight_bytes(m) - reserve * catalog.GIB
        return cls(
            weight_bytes=weight_bytes(m),
            kv_bytes_per_token=kv_bytes_per_token(m),
            bandwidth_bytes_s=it.bandwidth_gbs(tp) * 1e9 * f.efficiency.bandwidth,
            flops=it.bf16_tflops(tp) * 1e12 * f.efficiency.compute,
            params=m.model.params_b * 1e9,
            kv_capacity_tokens=max(0, int(free // kv_bytes_per_token(m))),
            max_concurrency=f.max_concurrency,
            max_model_len=f.max_model_len,
        )

    def step_s(self, context_tokens: int, prefill_tokens: int, decoding_seqs: int) -> float:
        """One step over a batch whose KV holds `context_tokens` tokens in total."""
        memory = (self.weight_bytes + self.kv_bytes_per_token * context_tokens) / self.bandwidth_bytes_s
        compute = 2.0 * self.params * (prefill_tokens + decoding_seqs) / self.flops
        return max(memory, compute)

    def batch1_decode_tok_s(self, context: int = 0) -> float:
        return 1.0 / self.step_s(context, 0, 1)
