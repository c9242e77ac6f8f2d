"""Send one request through the real streaming client and print its record as JSON.

    python -m loadgen.probe --manifest M --fleet F --host http://127.0.0.1:PORT \
        --input-tokens 100 --output-tokens 20 [--api chat] [--delay-s 0.2] [--served-model NAME] \
        [--resolver http://127.0.0.1:PORT/]

--delay-s sends that long after the scheduled time, to show client-side queueing in TTFT.
A smoke check for an endpoint, and how tests drive the client without importing gevent.
"""

from __future__ import annotations

import argparse
import sys
import time

import gevent

from core.manifest import load_manifest
from core.schedule import ScheduledRequest
from core.serving import served_model_id
from loadgen.client import StreamingClient, resolver_for
from loadgen.openai_request import request_body
from loadgen.prompts import PromptBuilder
from loadgen.recording import RecordContext, build_record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadgen.probe")
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--fleet", required=True)
    ap.add_argument("--host", required=True)
    ap.add_argument("--api", choices=["chat", "completions"], default="chat")
    ap.add_argument("--input-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--delay-s", type=float, default=0.0)
    ap.add_argument("--timeout-s", type=float, default=None)
    ap.add_argument("--connect-timeout-s", type=float, default=10.0)
    ap.add_argument(
        "--served-model",
        default=None,
        help="model name sent in requests; default: the id the fleet's serving stack lists (vLLM: model.repo)",
    )
    ap.add_argument(
        "--resolver",
        default=None,
        help="look the host name up at this loopback answer source (loadgen/resolver.py); default: the system resolver",
    )
    a = ap.parse_args(argv)
    m = load_manifest(a.manifest)
    req = ScheduledRequest(0, 0.0, a.input_tokens, a.output_tokens, None, 0, False)
    prompt = PromptBuilder(m, a.api).build(req)
    client = StreamingClient(
        a.host,
        api=a.api,
        timeout_s=a.timeout_s or m.loadgen.request_timeout_s,
        connect_timeout_s=a.connect_timeout_s,
        resolver=resolver_for(a.resolver),
    )
    model = a.served_model or served_model_id(m, m.fleet(a.fleet))
    wire = client.encode(
        request_body(a.api, model, m.generation, prompt, req.output_tokens, m.fleet(a.fleet).serving.stack)
    )
    t0 = time.monotonic()
    ctx = RecordContext(m.campaign, m.digest, a.fleet, "probe", time.time(), t0, m.slo.ttft_p95_s, m.slo.itl_p95_s)
    if a.delay_s:
        gevent.sleep(a.delay_s)
    ex = client.stream(wire)
    rec = build_record(ctx, req, ex.sent_t, ex.end_t, ex.state, ex.transport, prompt.tokens)
    print(rec.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
