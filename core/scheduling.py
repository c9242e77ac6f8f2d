"""How each serving stack schedules a batch, as its documentation describes it.

The emulator's engine (runtime/emulator/engine.py) reads one StackPolicy per replica; the
timing of each step comes from the roofline, the policy decides which work a step contains.

Sources:
- Neuron (both stacks): the compiled graphs have static shapes. Context encoding runs batch 1
  under continuous batching ("ctx_batch_size ... 1 only when continuous_batching=True",
  huggingface/optimum-neuron@213224e6aae42e570b88b3a5e6f2716112823469
  optimum/neuron/models/inference/ARCHITECTURE_CAUSAL_LM.md; the loop over prompts:
  huggingface/optimum-neuron@v0.1.0 optimum/neuron/backends/hlo/decoder.py
  `_context_dynamic_batching`, @148350c0416820756bfbfa1953e77292dfa26e88
  optimum/neuron/models/inference/nxd/backend/modules/decoder/decoder_wrapper.py `forward`), so
  a step that encodes k prompts runs k passes one after another and every first token comes out
  when the step ends. Each pass is padded to the compiled context bucket: powers of two from 128
  in the AWS vllm-neuron plugin ("num_batched_tokens_buckets",
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/vllm/additional-config.html),
  a single bucket of the full sequence length in optimum-neuron (enable_bucketing defaults to
  False and nothing sets it, @148350c0 .../nxd/backend/config.py; @213224e6 compiles bucket 0
  only, .../backend/modules/decoder/decoder_builders.py). Token generation is compiled for
  [max_num_seqs, bucket]: every decode step runs all slots over the bucket that covers the
  longest live sequence, full or not. KV is contiguous, one max_model_len block per slot
  (optimum/neuron/vllm/platform.py sets block_size = max_model_len), so capacity is
  max_num_seqs sequences; no prefix caching; decode and prefill never share a pass ("Prefill
  and decode use different compiled graphs", optimum/neuron/vllm/ARCHITECTURE_VLLM_SERVING.md).
- vLLM on Neuron: vLLM's scheduler admits waiting prompts as soon as a slot is free, up to
  max_num_batched_tokens = max(max_model_len, 2048) unpadded prompt tokens per step (V0 without
  chunked prefill: vllm/config.py SchedulerConfig; V1 on optimum-neuron: platform.py raises the
  budget to max_model_len, ARCHITECTURE_VLLM_SERVING.md section 4).
- TGI on Neuron (optimum-neuron's server behind text-generation-router-v2,
  huggingface/text-generation-inference@1ff9d185d533b509ee43a025a36663984197478a Dockerfile.neuron):
  the router prefills a new batch only before a decode, and while a batch runs only when
  waiting >= floor(running x waiting_served_ratio) (1.2) or after max_waiting_tokens (20) decode
  passes since the last prefill (waiting_tokens starts at 1 after a prefill and counts decodes,
  backends/v2/src/backend.rs `batching_task`); a prefill always is followed by a decode. The
  new batch takes every waiting request up to the free slots: the prefill token budget is
  MAX_BATCH_SIZE x MAX_INPUT_TOKENS (backends/neuron/tgi_env.py), and the server prefills only
  the new slots (backends/neuron/server/text_generation_server/generator.py `prefill`).
- vLLM V1 on GPU (>= 0.8): chunked prefill always on, decode first then prefill chunks up to
  max_num_batched_tokens (2048 for the OpenAI server on GPUs under 70 GiB, vllm/engine/arg_utils.py),
  paged KV sized by gpu_memory_utilization (default 0.9) of the GPU after weights and the
  profiled activations, automatic prefix caching on by default (16-token blocks).
  https://docs.vllm.ai/en/latest/configuration/optimization.html,
  https://docs.vllm.ai/en/latest/design/prefix_caching.html
- vLLM V0 (0.4-0.7, the A10G rows): no chunked prefill by default; waiting prompts are
  prefilled in a step of their own (decode paused) up to max_num_batched_tokens =
  max(max_model_len, 2048); prefix caching off by default.
- TGI v3 on GPU: chunked prefill and prefix caching on by default
  (https://huggingface.co/docs/text-generation-inference/conceptual/chunking), the same router
  rule for when newcomers join.
- TensorRT-LLM (trtllm-serve, PyTorch backend): in-flight batching over a paged KV cache
  taking free_gpu_memory_fraction 0.9 of free memory, KV block reuse on; chunked context is
  modelled as on. Not checked against a measurement: no published TRT-LLM row exists here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class StackPolicy:
    name: str
    static_batch: (
        bool  # compiled shapes: decode runs max_num_seqs slots over a bucket; prompts are encoded one pass each
    )
    prefill_alone: bool  # a step that encodes prompts does no decode
    chunked_prefill: bool
    pad_to_bucket: bool  # prompts padded to the next compiled prefill bucket
    kv_layout: Literal["contiguous", "paged"]
    prefix_caching: bool
    memory_utilization: float  # share of visible memory the engine may use (weights + KV)
    # TGI's router holds newcomers back while a batch decodes: it adds them when waiting >=
    # floor(running x waiting_served_ratio), or after max_waiting_tokens decode passes.
    waiting_served_ratio: float | None = None
    max_waiting_tokens: int | None = None
    # vLLM caps the prompt tokens one step admits (max_num_batched_tokens); TGI on Neuron's
    # prefill budget is the whole static batch, so only free slots limit a prefill there.
    prefill_token_budget: bool = True

    def max_batched_tokens(self, max_model_len: int) -> int:
        if self.chunked_prefill:
            return 2048
        return max(max_model_len, 2048)


_TGI_ROUTER = dict(waiting_served_ratio=1.2, max_waiting_tokens=20)
_NEURON = dict(
    static_batch=True,
    prefill_alone=True,
    chunked_prefill=False,
    pad_to_bucket=True,
    kv_layout="contiguous",
    prefix_caching=False,
    memory_utilization=1.0,
)

POLICIES: dict[str, StackPolicy] = {
    "vllm-neuron": StackPolicy("vllm-neuron", **_NEURON),  # type: ignore[arg-type]
    "tgi-neuron": StackPolicy("tgi-neuron", **_NEURON, **_TGI_ROUTER, prefill_token_budget=False),  # type: ignore[arg-type]
    "vllm": StackPolicy("vllm", False, False, True, False, "paged", True, 0.9),
    "vllm-v0": StackPolicy("vllm-v0", False, True, False, False, "paged", False, 0.9),
    "tgi": StackPolicy("tgi", False, False, True, False, "paged", True, 0.9, **_TGI_ROUTER),  # type: ignore[arg-type]
    "tensorrt-llm": StackPolicy("tensorrt-llm", False, False, True, False, "paged", True, 0.9),
}


def policy_for(stack: str, vendor: str) -> StackPolicy:
    """The manifest names `tgi` for TGI on either vendor; on Neuron it is the NxD backend."""
    if stack == "tgi" and vendor == "aws-neuron":
        stack = "tgi-neuron"
    try:
        return POLICIES[stack]
    except KeyError:
        raise KeyError(f"unknown serving stack {stack!r}; known: {', '.join(sorted(POLICIES))}") from None


def neuron_buckets(max_model_len: int) -> tuple[int, ...]:
    """Default prefill buckets: powers of two from 128, the last one covering max_model_len."""
    out = [128]
    while out[-1] < max_model_len:
        out.append(out[-1] * 2)
    return tuple(out)
