"""How each serving stack schedules a batch, as its documentation describes it.

The emulator's engine (runtime/emulator/engine.py) reads one StackPolicy per replica; the
timing of each step comes from the roofline, the policy decides which work a step contains.

Sources:
- vLLM on Neuron (vllm-neuron plugin on NxD Inference, SDK 2.28 and the optimum-neuron
  integration the calibration rows ran): prompts are padded to the smallest compiled prefill
  bucket, power-of-two token counts from 128 by default ("num_batched_tokens_buckets",
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/vllm/additional-config.html);
  continuous batching encodes new prompts, then decodes all sequences together ("Evict the
  finished sequence and insert a new prompt encoding. Resume the decoding process",
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/archive/transformers-neuronx/transformers-neuronx-developer-guide-for-continuous-batching.html);
  the KV cache is contiguous, one block of max_model_len per sequence (vLLM's Neuron example
  sets block_size = max_model_len, vllm-project/vllm commit 257afc37), so capacity is
  max_num_seqs sequences; the batch size is compiled in (static); no chunked prefill.
- TGI on Neuron (optimum-neuron's TGI backend, the calibration's tgi-neuron rows): the same
  NxD static-batch model, behind TGI's router, which pauses decode for a prefill run
  (huggingface/text-generation-inference router/README.md) only once waiting >=
  waiting_served_ratio x running (default 1.2) or after max_waiting_tokens decode steps
  (default 20): launcher arguments, https://huggingface.co/docs/text-generation-inference/basic_tutorials/launcher.
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
  (https://huggingface.co/docs/text-generation-inference/conceptual/chunking), the same router.
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
    static_batch: bool  # the compiled batch: decode always runs max_num_seqs slots
    prefill_alone: bool  # a step that encodes prompts does no decode
    prefill_one_at_a_time: bool  # context encoding runs one prompt per step
    chunked_prefill: bool
    pad_to_bucket: bool  # prompts padded to the next compiled prefill bucket
    kv_layout: Literal["contiguous", "paged"]
    prefix_caching: bool
    memory_utilization: float  # share of visible memory the engine may use (weights + KV)
    # TGI's router holds newcomers back while a batch decodes: it adds them when waiting >=
    # waiting_served_ratio x running, or after max_waiting_tokens decode steps.
    waiting_served_ratio: float | None = None
    max_waiting_steps: int | None = None

    def max_batched_tokens(self, max_model_len: int) -> int:
        if self.chunked_prefill:
            return 2048
        return max(max_model_len, 2048)


_TGI_ROUTER = dict(waiting_served_ratio=1.2, max_waiting_steps=20)
_NEURON = dict(static_batch=True, prefill_alone=True, prefill_one_at_a_time=True, chunked_prefill=False,
               pad_to_bucket=True, kv_layout="contiguous", prefix_caching=False, memory_utilization=1.0)  # fmt: skip

POLICIES: dict[str, StackPolicy] = {
    "vllm-neuron": StackPolicy("vllm-neuron", **_NEURON),  # type: ignore[arg-type]
    "tgi-neuron": StackPolicy("tgi-neuron", **_NEURON, **_TGI_ROUTER),  # type: ignore[arg-type]
    "vllm": StackPolicy("vllm", False, False, False, True, False, "paged", True, 0.9),
    "vllm-v0": StackPolicy("vllm-v0", False, True, False, False, False, "paged", False, 0.9),
    "tgi": StackPolicy("tgi", False, False, False, True, False, "paged", True, 0.9, **_TGI_ROUTER),  # type: ignore[arg-type]
    "tensorrt-llm": StackPolicy("tensorrt-llm", False, False, False, True, False, "paged", True, 0.9),
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
