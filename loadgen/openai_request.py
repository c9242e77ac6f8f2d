"""The OpenAI-style request body and X-Request-Id the load generator sends.

Plain Python (no gevent): the replayer, the probe, the bench and the tests build requests the
same way.
"""

from __future__ import annotations

from typing import Any

from core.manifest import Generation
from loadgen.prompts import Api, Prompt

PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}

# Stacks that take vLLM's sampling extensions (ignore_eos, top_k, stop_token_ids) in an
# OpenAI request. TGI's and TensorRT-LLM's servers get only standard fields: there the trace's
# output length is a cap, not forced, and token_count_mismatch_rate shows how often it differs.
_VLLM_EXTENSIONS = frozenset({"vllm", "vllm-neuron"})


def request_body(
    api: Api, model: str, gen: Generation, prompt: Prompt, max_tokens: int, stack: str = "vllm"
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        **prompt.payload_fields(),
        "max_tokens": max_tokens,
        "temperature": gen.temperature,
        "top_p": gen.top_p,
        "seed": gen.seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if gen.stop:
        body["stop"] = list(gen.stop)
    if stack in _VLLM_EXTENSIONS:
        body["ignore_eos"] = True  # replay the trace's output length: keep generating past EOS
        if gen.top_k != -1:
            body["top_k"] = gen.top_k
        if gen.stop_token_ids:
            body["stop_token_ids"] = list(gen.stop_token_ids)
    return body


def request_id_header(campaign: str, fleet: str, request_id: int) -> str:
    """The X-Request-Id of one scheduled request: unique within a campaign, and it names the
    record (campaign, fleet, request_id) it belongs to."""
    return f"{campaign}-{fleet}-{request_id}"
