"""The aiohttp application: OpenAI-compatible routes over one Scheduler.

/metrics describes the whole endpoint: with several instances behind it (EmulatorConfig.instances)
the counters and histograms are their sums, as `sum` over a cloud fleet's scrape targets gives,
the running and waiting gauges their totals, the KV-cache gauge the fullest replica's, and
`emulator_instances` says how many instances they cover."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import statistics
import struct
import time
import uuid
import zlib
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from core import tokenizer as tok
from core.quantiles import interpolated_quantile
from runtime.emulator import faults as fault_draw
from runtime.emulator.config import EmulatorConfig
from runtime.emulator.engine import block_hashes
from runtime.emulator.metrics import EmulatorMetrics
from runtime.emulator.protocol import ApiError, ParsedRequest, parse
from runtime.emulator.scheduler import LiveSequence, Scheduler
from runtime.emulator.textgen import TokenStream
from runtime.emulator.timing import TimingModel

CONFIG: web.AppKey[EmulatorConfig] = web.AppKey("config", EmulatorConfig)
SCHEDULER: web.AppKey[Scheduler] = web.AppKey("scheduler", Scheduler)
METRICS: web.AppKey[EmulatorMetrics] = web.AppKey("metrics", EmulatorMetrics)
TIMING: web.AppKey[TimingModel] = web.AppKey("timing", TimingModel)
_COUNTER: web.AppKey[list[int]] = web.AppKey("counter", list)
# Per-request ground truth for requests that carry X-Request-Id (the loadgen's do), so a bench
# can join the client's records to what the server did. Bounded: a long campaign never grows it.
GROUND_TRUTH: web.AppKey[deque[dict[str, Any]]] = web.AppKey("ground_truth", deque)
GROUND_TRUTH_MAX = 200_000


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(body), status=status, content_type="application/json")


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except ApiError as exc:
        return _json(exc.body(), exc.status)
    except ConnectionResetError:
        # The client left mid-stream (its timeout, a killed load generator): an ordinary event
        # for a server, not a crash. Its slot is already freed; drop the handler without the
        # per-request traceback aiohttp would log.
        raise asyncio.CancelledError from None


async def _body(request: web.Request) -> Any:
    try:
        return json.loads(await request.read())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(f"malformed JSON body: {exc}", code="invalid_json") from None


def _reset(request: web.Request) -> None:
    """Abort with SO_LINGER 0 so the peer sees a TCP RST, not a clean close."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class _Chunks:
    """Pre-serialised SSE frames for one response (chunk JSON differs only in text and finish)."""

    def __init__(self, req: ParsedRequest, model: str):
        self.chat = req.chat
        self.id = ("chatcmpl-" if req.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = model
        self.object = "chat.completion.chunk" if req.chat else "text_completion"

    def _frame(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"

    def role(self) -> bytes:
        return self._frame(
            [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]
        )

    def token(self, text: str, finish: str | None) -> bytes:
        if self.chat:
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return self._frame([choice])

    def usage(self, prompt: int, completion: int) -> bytes:
        return self._frame(
            [], usage={"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        )


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    app = request.app
    cfg = app[CONFIG]
    arrival = asyncio.get_running_loop().time()  # before reading the body: closest to the client's send
    req = parse(await _body(request), cfg, tok.for_manifest(cfg.manifest), chat=chat)
    app[_COUNTER][0] += 1
    faults = fault_draw.draw(cfg.faults, app[_COUNTER][0], req.max_tokens)
    if faults.error:
        raise ApiError(
            "injected fault: internal server error", type_="internal_server_error", status=500, code="injected_fault"
        )
    scheduler = app[SCHEDULER]
    hashes = block_hashes(req.prompt_pieces) if scheduler.timing.policy.prefix_caching else None
    seq = LiveSequence(
        req.prompt_tokens, req.max_tokens, TokenStream(req.seed, req.prompt, req.stop), faults, arrival, hashes
    )
    scheduler.submit(seq)
    rid = request.headers.get("X-Request-Id")
    written: list[float] = []  # loop time once the first token's frame was handed to the socket
    try:
        if req.stream:
            return await _stream(request, req, seq, cfg, scheduler, written, rid)
        return await _whole(request, req, seq, cfg)
    finally:
        scheduler.cancel(seq)  # no-op when it finished; frees the slot when the client left
        if rid is not None:
            app[GROUND_TRUTH].append(
                {
                    "id": rid,
                    "arrival": arrival,
                    "first_token_emitted": seq.first_token_at,
                    "first_token_written": written[0] if written else None,
                    "last_token_emitted": seq.last_token_at or None,
                    "tokens": seq.generated,
                    "prefix_cached_tokens": seq.cached_tokens,
                    "finish_reason": seq.finish_reason,
                }
            )


async def _stream(
    request: web.Request,
    req: ParsedRequest,
    seq: LiveSequence,
    cfg: EmulatorConfig,
    scheduler: Scheduler,
    written: list[float],
    rid: str | None,
) -> web.StreamResponse:
    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    if rid is not None:
        headers["X-Request-Id"] = rid  # as vLLM does with --enable-request-id-headers
    resp = web.StreamResponse(headers=headers)
    await resp.prepare(request)
    frames = _Chunks(req, cfg.model_id)
    sent = 0
    cut_at = seq.faults.truncate_at if seq.faults.truncate_at is not None else seq.faults.reset_at
    while True:
        out: list[bytes] = []
        if sent == 0 and req.chat:
            out.append(frames.role())
        finish = None
        for text, finish in await seq.next_tokens():
            sent += 1
            if finish is None and text == "" and req.stop:
                continue  # text held back while a stop string may be forming
            out.append(frames.token(text, finish))
            if cut_at is not None and sent >= cut_at and finish is None:
                break
        if cut_at is not None and sent >= cut_at and finish is None:
            await _write(resp, out, sent, written)
            if seq.faults.reset_at is not None:
                _reset(request)
                raise asyncio.CancelledError  # the connection is gone; aiohttp drops the handler
            await resp.write_eof()  # no finish_reason, no [DONE]
            return resp
        if finish is not None:
            if req.include_usage:
                out.append(frames.usage(req.prompt_tokens, seq.generated))
            out.append(b"data: [DONE]\n\n")
            await _write(resp, out, sent, written)
            await resp.write_eof()
            return resp
        await _write(resp, out, sent, written)


async def _write(resp: web.StreamResponse, out: list[bytes], sent: int, written: list[float]) -> None:
    # Stamped before the await: write() hands the bytes to the transport before it first yields,
    # and the coroutine may resume only after other handlers ran (a busy loop stamped it up to
    # 14 ms after the client had the token, so a later stamp would overstate the server's TTFT).
    if sent and not written:
        written.append(asyncio.get_running_loop().time())
    await resp.write(b"".join(out))


async def _whole(
    request: web.Request, req: ParsedRequest, seq: LiveSequence, cfg: EmulatorConfig
) -> web.StreamResponse:
    parts: list[str] = []
    finish: str | None = None
    while finish is None:
        for text, reason in await seq.next_tokens():
            parts.append(text)
            finish = reason
            if seq.faults.reset_at is not None and seq.generated >= seq.faults.reset_at:
                _reset(request)
                raise asyncio.CancelledError
    text = "".join(parts)
    usage = {
        "prompt_tokens": req.prompt_tokens,
        "completion_tokens": seq.generated,
        "total_tokens": req.prompt_tokens + seq.generated,
    }
    frames = _Chunks(req, cfg.model_id)
    if req.chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    payload = json.dumps(
        {
            "id": frames.id,
            "object": obj,
            "created": frames.created,
            "model": cfg.model_id,
            "choices": [choice],
            "usage": usage,
        }
    ).encode()
    if seq.faults.truncate_at is not None:
        # Promise the whole body, send half of it, close: the client sees a short read.
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.content_length = len(payload)
        await resp.prepare(request)
        await resp.write(payload[: len(payload) // 2])
        if request.transport is not None:
            request.transport.close()
        raise asyncio.CancelledError
    return web.Response(body=payload, content_type="application/json")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def models(request: web.Request) -> web.Response:
    cfg = request.app[CONFIG]
    card = {
        "id": cfg.model_id,
        "object": "model",
        "created": 0,
        "owned_by": "emulator",
        "root": cfg.model_id,
        "max_model_len": cfg.fleet.max_model_len,
    }
    return _json({"object": "list", "data": [card]})


async def tokenize(request: web.Request) -> web.Response:
    cfg = request.app[CONFIG]
    body = await _body(request)
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    model = body.get("model")
    if model and model != cfg.model_id:  # vLLM checks a given model name here too (404)
        raise ApiError(
            f"The model `{model}` does not exist.",
            param="model",
            code="model_not_found",
            status=404,
            type_="NotFoundError",
        )
    if "messages" in body:
        from runtime.emulator.protocol import _prompt_of  # shared rendering of chat prompts

        text = _prompt_of(body, cfg, chat=True)
    elif isinstance(body.get("prompt"), str):
        text = body["prompt"]
    else:
        raise ApiError("'prompt' or 'messages' is required", param="prompt", code="missing_required_parameter")
    pieces = tok.for_manifest(cfg.manifest).encode(text)
    vocab = cfg.manifest.model.vocab_size
    # Stable integer ids for the word tokenizer's strings (crc32: same id in every process).
    ids = [zlib.crc32(p.encode()) % vocab for p in pieces]
    out: dict[str, Any] = {"count": len(ids), "max_model_len": cfg.fleet.max_model_len, "tokens": ids}
    if body.get("return_token_strs"):
        out["token_strs"] = pieces
    return _json(out)


async def metrics(request: web.Request) -> web.Response:
    data = generate_latest(request.app[METRICS].registry)
    return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def stats(request: web.Request) -> web.Response:
    """Emulator self-check: step lag against the model's step time (used by bench/)."""
    st = request.app[SCHEDULER].stats
    lags, steps, batch = list(st.lags), list(st.step_s), list(st.batch)

    def med(xs: list[float] | list[int]) -> float | None:
        return statistics.median(xs) if xs else None

    p99 = interpolated_quantile(lags, 0.99) if lags else None  # as the loadgen's own schedule-lag P99
    return _json(
        {
            "steps": st.steps,
            "lag_median_s": med(lags),
            "lag_p99_s": p99,
            "step_median_s": med(steps),
            "batch_median": med(batch),
            "batch_max": max(batch) if batch else 0,
        }
    )


async def ground_truth(request: web.Request) -> web.Response:
    """Per-request server-side times (monotonic seconds, the same clock as the loadgen's on one
    host) for requests that carried X-Request-Id; `?clear=1` empties the buffer."""
    buf = request.app[GROUND_TRUTH]
    out = list(buf)
    if request.query.get("clear") == "1":
        buf.clear()
    return _json({"requests": out, "max": GROUND_TRUTH_MAX})


async def _scheduler_ctx(app: web.Application) -> AsyncIterator[None]:
    # Created inside the running loop so its asyncio primitives belong to it.
    app[SCHEDULER] = Scheduler(app[TIMING], app[METRICS], app[CONFIG].instances)
    task = asyncio.create_task(app[SCHEDULER].run())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def create_app(cfg: EmulatorConfig, timing: TimingModel | None = None) -> web.Application:
    """The app; the scheduler task starts and stops with it (aiohttp cleanup context).
    `timing` replaces the fleet's own (runtime/emulator/calibrate.py's rows: configurations no manifest
    fleet describes)."""
    app = web.Application(middlewares=[_errors], client_max_size=16 * 1024 * 1024)
    timing = timing or TimingModel.for_fleet(cfg.manifest, cfg.fleet)
    metrics_ = EmulatorMetrics(cfg.model_id)
    app[CONFIG] = cfg
    app[TIMING] = timing
    app[METRICS] = metrics_
    app[_COUNTER] = [0]
    app[GROUND_TRUTH] = deque(maxlen=GROUND_TRUTH_MAX)
    app.cleanup_ctx.append(_scheduler_ctx)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    # Where a TensorRT-LLM fleet's server exposes Prometheus text (core/serving.py: trtllm-serve's
    # /metrics is JSON): the stack's Prometheus scrapes the fleet's own path, also when a rehearsal
    # serves that fleet with this emulator.
    app.router.add_get("/prometheus/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/emulator/stats", stats)
    app.router.add_get("/emulator/requests", ground_truth)
    return app
