"""Request validation: OpenAI-shaped bodies in, a ParsedRequest or an ApiError (400) out.

Length policy (vLLM's): the prompt must leave room for one token (prompt < max_model_len),
and prompt + max_tokens must fit max_model_len, else 400. A missing max_tokens defaults to
min(generation.max_output_tokens, max_model_len - prompt). generation.max_output_tokens is
the manifest's default, not a hard cap, exactly as a real vLLM fleet behaves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.tokenizer import Tokenizer, apply_chat_template
from runtime.emulator.config import EmulatorConfig


class ApiError(Exception):
    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int = 400,
        type_: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.type = message, param, code, status, type_

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ParsedRequest:
    chat: bool
    prompt: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    stop: tuple[str, ...]
    seed: int
    prompt_pieces: tuple[str, ...] = ()  # the tokenized prompt (the prefix cache hashes it)


def _text_content(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text parts carry prompt text here
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(parts) == len(content):
            return "".join(str(p) for p in parts)
    raise ApiError(f"messages[{i}].content must be a string or a list of text parts", param=f"messages[{i}].content")


def _prompt_of(body: dict[str, Any], cfg: EmulatorConfig, chat: bool) -> str:
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ApiError(
                "'messages' is required and must be a non-empty list",
                param="messages",
                code="missing_required_parameter",
            )
        rendered = []
        for i, msg in enumerate(msgs):
            if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
                raise ApiError(f"messages[{i}] must be an object with a 'role'", param=f"messages[{i}]")
            rendered.append({"role": msg["role"], "content": _text_content(msg.get("content", ""), i)})
        return apply_chat_template(cfg.manifest.chat_template, rendered, cfg.manifest.tokenizer.special_tokens)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if prompt is None:
        raise ApiError("'prompt' is required", param="prompt", code="missing_required_parameter")
    if not isinstance(prompt, str):
        raise ApiError("'prompt' must be a string (batched prompts are not supported)", param="prompt")
    return prompt


def _int_field(body: dict[str, Any], *names: str) -> tuple[str, int | None]:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ApiError(f"'{name}' must be an integer", param=name)
        return name, value
    return names[0], None


def parse(body: Any, cfg: EmulatorConfig, tokenizer: Tokenizer, *, chat: bool) -> ParsedRequest:
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    model = body.get("model")
    if not model:
        raise ApiError("'model' is required", param="model", code="missing_required_parameter")
    if model != cfg.model_id:
        # vLLM answers 404 NotFoundError (OpenAIServing._check_model, vllm-project/vllm
        # vllm/entrypoints/openai/serving_engine.py).
        raise ApiError(
            f"The model `{model}` does not exist.",
            param="model",
            code="model_not_found",
            status=404,
            type_="NotFoundError",
        )
    n = body.get("n", 1)
    if n != 1:
        raise ApiError("only n=1 is supported", param="n")
    prompt = _prompt_of(body, cfg, chat)
    pieces = tuple(tokenizer.encode(prompt))  # one pass: counted here, hashed by the prefix cache
    prompt_tokens = len(pieces)
    limit = cfg.fleet.max_model_len
    if prompt_tokens >= limit:
        raise ApiError(
            f"This model's maximum context length is {limit} tokens. However, your prompt has {prompt_tokens} tokens.",
            param="messages" if chat else "prompt",
            code="context_length_exceeded",
        )
    name, max_tokens = (
        _int_field(body, "max_completion_tokens", "max_tokens") if chat else _int_field(body, "max_tokens")
    )
    if max_tokens is None:
        max_tokens = min(cfg.manifest.generation.max_output_tokens, limit - prompt_tokens)
    if max_tokens < 1:
        raise ApiError(f"'{name}' must be at least 1, got {max_tokens}", param=name)
    if prompt_tokens + max_tokens > limit:
        raise ApiError(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} for the completion).",
            param=name,
            code="context_length_exceeded",
        )
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 4:
        stops = tuple(stop)
    else:
        raise ApiError("'stop' must be a string or a list of at most 4 strings", param="stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError("'stream' must be a boolean", param="stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise ApiError("'stream_options' must be an object", param="stream_options")
    _, seed = _int_field(body, "seed")
    return ParsedRequest(
        chat=chat,
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=bool(opts.get("include_usage", False)),
        stop=stops,
        seed=cfg.manifest.generation.seed if seed is None else seed,
        prompt_pieces=pieces,
    )
