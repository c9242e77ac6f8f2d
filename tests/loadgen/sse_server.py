"""Test fixture: a tiny OpenAI-style SSE server (aiohttp, in a thread) with fault modes.

Not the emulator: it exists so the client and the Locust replayer can be tested against known
timing and known misbehaviour. It counts prompt tokens with the manifest's tokenizer.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from core.manifest import Manifest
from core.tokenizer import Tokenizer, apply_chat_template, for_manifest


@dataclass
class Behaviour:
    mode: str = "ok"  # ok | error | stall | truncate | reset | multi | mixed (cycles ok/error/stall/truncate/reset)
    ttft_s: float = 0.02
    itl_s: float = 0.005
    stall_s: float = 5.0
    usage_bias: int = 0  # server usage = real tokens + bias
    # Tokens per SSE chunk, cycled, as vLLM streams them: several tokens in one chunk (detokenizer
    # hold-back, stop-string buffering) and 0 = a chunk whose content is empty. () = `mode` decides.
    chunk_plan: tuple[int, ...] = ()
    usage: bool = True  # False: no usage chunk at all (a server that ignores include_usage)
    text: bool = True  # False: every chunk's content is empty (a model emitting special tokens only)


@dataclass
class SSEServer:
    tokenizer: Tokenizer
    template: str
    special: dict[str, str]
    behaviour: Behaviour = field(default_factory=Behaviour)
    seen: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0
    hosts: tuple[str, ...] = ("127.0.0.1",)  # loopback addresses it listens on, all on one port
    served_by: Counter[str] = field(default_factory=Counter)  # requests per local address

    def _prompt_tokens(self, body: dict[str, Any]) -> int:
        if "messages" in body:
            return self.tokenizer.count(apply_chat_template(self.template, body["messages"], self.special))
        return self.tokenizer.count(body["prompt"])

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append(body)
        assert request.transport is not None
        self.served_by[request.transport.get_extra_info("sockname")[0]] += 1
        b = self.behaviour
        if b.mode == "mixed":
            cycle = ("ok", "error", "stall", "truncate", "reset")
            b = Behaviour(
                cycle[len(self.seen) % len(cycle)],
                b.ttft_s,
                b.itl_s,
                b.stall_s,
                b.usage_bias,
                b.chunk_plan,
                b.usage,
                b.text,
            )
        chat = request.path.endswith("/chat/completions")
        if b.mode == "error":
            return web.json_response({"error": {"message": "injected failure"}}, status=503)
        n = int(body["max_tokens"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(b.stall_s if b.mode == "stall" else b.ttft_s)
        plan = b.chunk_plan or ((2,) if b.mode == "multi" else (1,))
        sent = 0
        for i in itertools.count():
            if sent >= n:
                break
            k = min(plan[i % len(plan)], n - sent)
            text = " tok" * k if b.text else ""
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            choice["finish_reason"] = "length" if sent + k == n else None
            await resp.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            sent += k
            if b.mode == "truncate" and sent >= n // 2:
                return resp  # ends the chunked body cleanly, but without finish_reason / [DONE]
            if b.mode == "reset" and sent >= n // 2:
                assert request.transport is not None
                request.transport.abort()
                return resp
            if sent < n:
                await asyncio.sleep(b.itl_s)
        if b.usage:
            usage = {"prompt_tokens": self._prompt_tokens(body), "completion_tokens": n + b.usage_bias}
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def start(self) -> SSEServer:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application()
            app.router.add_post("/v1/completions", self.handle)
            app.router.add_post("/v1/chat/completions", self.handle)
            self._runner = web.AppRunner(app, access_log=None)
            loop.run_until_complete(self._runner.setup())
            for host in self.hosts:
                site = web.TCPSite(self._runner, host, self.port)
                loop.run_until_complete(site.start())
                self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        loop = self._loop
        fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop)
        fut.result(10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://{self.hosts[0]}:{self.port}"


def serving(m: Manifest) -> SSEServer:
    """The server for `m`'s tokenizer and chat template, started (`stop()` it)."""
    return SSEServer(for_manifest(m), m.tokenizer.chat_template, dict(m.tokenizer.special_tokens)).start()
