"""Synthetic loadgen records with hand-checkable numbers."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from core.manifest import Manifest, manifest_from_data
from core.records import RequestRecord


def manifest(data: dict[str, Any]) -> Manifest:
    return manifest_from_data(data)


_DIGESTS: dict[int, tuple[Manifest, str]] = {}


def _digest(m: Manifest) -> str:
    """`m.digest`, computed once per manifest object (it dumps and hashes the whole model; the
    tests write thousands of records). The object is kept, so its id is never reused."""
    hit = _DIGESTS.get(id(m))
    if hit is None or hit[0] is not m:
        hit = _DIGESTS[id(m)] = (m, m.digest)
    return hit[1]


def rec(
    m: Manifest,
    fleet: str,
    i: int,
    *,
    scheduled: float | None = None,
    ttft: float | None = 0.5,
    itl: float | None = 0.05,
    e2e: float | None = 1.0,
    tokens: int = 100,
    server_tokens: int | None = None,
    outcome: str = "ok",
    warmup: bool = False,
    slo_ok: bool | None = None,
    digest: str | None = None,
) -> RequestRecord:
    if slo_ok is None:
        slo_ok = ttft is not None and ttft <= m.slo.ttft_p95_s and (itl is None or itl <= m.slo.itl_p95_s)
    return RequestRecord(
        campaign=m.campaign,
        manifest_digest=digest or _digest(m),
        fleet=fleet,
        request_id=i,
        worker="w0",
        wall_start=1_700_000_000.0,
        scheduled_s=float(i) if scheduled is None else scheduled,
        sent_s=float(i),
        send_lag_s=0.0,
        ttft_s=ttft,
        itl_s=itl,
        itl_max_s=itl,
        e2e_s=e2e,
        input_tokens=128,
        max_tokens=512,
        client_output_tokens=tokens,
        server_prompt_tokens=128,
        server_output_tokens=server_tokens,
        finish_reason="stop" if outcome == "ok" else None,
        outcome=outcome,
        http_status=200 if outcome == "ok" else 500,
        error=None if outcome == "ok" else "boom",
        slo_ok=slo_ok,
        warmup=warmup,
    )


def write_jsonl(path: Path, recs: Iterable[RequestRecord]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for r in recs:
            fh.write(json.dumps(asdict(r)) + "\n")
    return path


def steady(m: Manifest, fleet: str, n: int, tokens: int, **kw: Any) -> list[RequestRecord]:
    """n requests, one per second from t=0, each finishing 1 s later: the window is exactly n seconds."""
    return [rec(m, fleet, i, tokens=tokens, **kw) for i in range(n)]
