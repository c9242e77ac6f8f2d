"""What one scheduler step of one emulated server costs, from the roofline (core/roofline.py).

A step runs one forward pass over its batch and costs
    max(memory time, compute time) + step overhead
where memory time reads every weight plus the KV cache the step attends over, and compute time
is 2 x params x (prompt tokens encoded + one token per decoding sequence). The efficiencies and
overheads are the fleet's (manifest numbers, or a calibration group fitted on published
measurements); a fixed per-request host overhead delays a request's admission without occupying
the accelerator. Which work a step contains is the serving stack's business: core/scheduling.py
and engine.py.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass

from core import catalog
from core.manifest import Fleet, Manifest, ResolvedEfficiency, default_reserve_gib
from core.roofline import Roofline
from core.scheduling import StackPolicy, neuron_buckets, policy_for

PAGE_TOKENS = 16  # vLLM's default KV block size; the prefix cache hashes blocks of this many tokens


def policy_with_prefix_caching(policy: StackPolicy, prefix_caching: bool | None) -> StackPolicy:
    """The stack's policy with the fleet's prefix-caching setting (core.manifest Serving.prefix_caching).

    On Neuron the setting also picks the KV layout, as the vllm-neuron plugin does (SDK 2.28 vLLM
    user guide, Known Issues 2: block layout with prefix caching, contiguous without; sources in
    core.catalog.PREFIX_CACHING_SOURCES). The block layout is modelled as paged: blocks are taken
    as sequences grow, and cached prompt blocks are reused. None keeps the stack's own policy."""
    if prefix_caching is None or prefix_caching == policy.prefix_caching:
        return policy
    if policy.static_batch:
        return dataclasses.replace(
            policy, prefix_caching=prefix_caching, kv_layout="paged" if prefix_caching else "contiguous"
        )
    return dataclasses.replace(policy, prefix_caching=prefix_caching)


@dataclass(frozen=True)
class TimingModel:
    roofline: Roofline
    efficiency: ResolvedEfficiency
    policy: StackPolicy
    max_concurrency: int  # max_num_seqs of one replica
    max_model_len: int
    buckets: tuple[int, ...]  # compiled prefill buckets (Neuron); empty: no padding
    kv_capacity_tokens: int  # one replica's KV cache, in tokens
    replicas: int = 1  # data-parallel servers behind the instance's one endpoint
    # Granularity of a prefix-cache hit: the KV block size (vLLM on GPU: 16; Neuron's block layout:
    # pa_block_size, catalog.NEURON_PREFIX_BLOCK_TOKENS). A multiple of PAGE_TOKENS.
    prefix_block_tokens: int = PAGE_TOKENS

    @classmethod
    def build(
        cls,
        *,
        instance_type: str,
        tensor_parallel: int,
        roofline: Roofline,
        efficiency: ResolvedEfficiency,
        stack: str,
        max_num_seqs: int,
        max_model_len: int,
        buckets: tuple[int, ...] = (),
        reserve_gib: float | None = None,
        replicas: int = 1,
        prefix_caching: bool | None = None,
    ) -> TimingModel:
        """`prefix_caching`: the fleet's setting (None: the stack's policy as core.scheduling has it)."""
        it = catalog.instance(instance_type)
        policy = policy_with_prefix_caching(policy_for(stack, it.accelerator.vendor), prefix_caching)
        prefix_block = PAGE_TOKENS
        if policy.kv_layout == "contiguous":
            # One max_model_len block per compiled batch slot: capacity is max_num_seqs sequences.
            kv = max_num_seqs * max_model_len
        elif policy.static_batch:
            # Neuron's block layout: the blocks core.serving allocates (--num-gpu-blocks-override =
            # pa_num_blocks = ceil(max_model_len / block) x max_num_seqs), never a memory-sized pool.
            prefix_block = catalog.NEURON_PREFIX_BLOCK_TOKENS
            kv = math.ceil(max_model_len / prefix_block) * max_num_seqs * prefix_block
        else:
            reserve = reserve_gib if reserve_gib is not None else default_reserve_gib(it, tensor_parallel)
            usable = it.visible_gib(tensor_parallel) * policy.memory_utilization - reserve
            kv = max(0, int((usable * catalog.GIB - roofline.weight_bytes) // roofline.kv_bytes_per_token))
        if policy.pad_to_bucket and not buckets:
            buckets = neuron_buckets(max_model_len)
        return cls(
            roofline,
            efficiency,
            policy,
            max_num_seqs,
            max_model_len,
            tuple(buckets) if policy.pad_to_bucket else (),
            kv,
            replicas,
            prefix_block,
        )

    @classmethod
    def for_fleet(cls, m: Manifest, f: Fleet) -> TimingModel:
        return cls.build(
            instance_type=f.instance_type,
            tensor_parallel=f.tensor_parallel,
            roofline=Roofline.for_fleet(m, f),
            efficiency=f.efficiency.resolved(),
            stack=f.serving.stack,
            max_num_seqs=f.max_concurrency,
            max_model_len=f.max_model_len,
            buckets=f.sequence_buckets,
            reserve_gib=f.runtime_reserve_gib,
            replicas=f.replicas_per_instance,
            prefix_caching=f.serving.resolved_prefix_caching,
        )

    def step_s(self, context_tokens: int, prefill_tokens: int, decoding_seqs: int) -> float:
        """One step that reads `context_tokens` of KV and encodes `prefill_tokens` prompt tokens."""
        e = self.efficiency
        memory = self.roofline.memory_s(context_tokens, e.bandwidth)
        compute = self.roofline.compute_s(prefill_tokens + decoding_seqs, e.compute)
        return max(memory, compute) + e.step_overhead_ms / 1000.0

    @property
    def admission_delay_s(self) -> float:
        """Host-side time between a request's arrival and the scheduler seeing it."""
        return self.efficiency.request_overhead_ms / 1000.0

    def padded(self, prompt_tokens: int) -> int:
        """Tokens a prefill of `prompt_tokens` really encodes: the next compiled bucket, if any."""
        if not self.buckets:
            return prompt_tokens
        i = bisect.bisect_left(self.buckets, prompt_tokens)
        return self.buckets[i] if i < len(self.buckets) else prompt_tokens

    def decode_kv_tokens(self, contexts: list[int]) -> int:
        """KV tokens one decode step reads. A static-shape graph (Neuron) reads every compiled
        slot over the bucket covering the longest live sequence; paged attention reads what lives."""
        if not self.policy.static_batch:
            return sum(contexts)
        return self.max_concurrency * self.padded(max(contexts, default=1))

    def batch1_decode_tok_s(self, context: int = 0) -> float:
        """The roofline's batch-1 decode rate (weights + `context` KV); a static-shape engine's
        real step reads more (decode_kv_tokens)."""
        return 1.0 / self.step_s(context, 0, 1)
