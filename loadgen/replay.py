"""Open-loop replay of one worker's share of the schedule (gevent; no Locust import).

Each request gets its own greenlet, spawned at its scheduled time whatever is in flight: the
offered load is the trace's, never throttled by slow responses (no closed-loop users).
Prompts and request bytes are prepared before the clock starts so synthesis never adds lag.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import gevent
from gevent.pool import Group

from campaign.manifest import Manifest
from campaign.records import RequestRecord, RunSummary
from loadgen.client import StreamingClient, request_body, request_id_header
from loadgen.metrics import ClientMetrics
from loadgen.prompts import Api, PromptBuilder
from loadgen.recording import RecordContext, RecordSink, build_record, not_sent_record, records_name, summary_name, upload_to_s3
from loadgen.schedule import ScheduledRequest, build_schedule, partition
from loadgen.sse import StreamState, Transport
from loadgen.summary import CpuMeter, SummaryInputs, summarize

log = logging.getLogger("loadgen.replay")


@dataclass(frozen=True)
class ReplayConfig:
    fleet: str
    host: str
    records_dir: Path
    worker_index: int = 0
    n_workers: int = 1
    api: Api = "chat"
    model: str | None = None  # the model name sent; defaults to the manifest's model.repo
    duration_s: float | None = None  # stop sending after this many replay seconds
    # Capacity steps: the same requests at rate x k (offsets / k), and each request abandoned once
    # it can no longer meet the per-request SLO (TTFT + output tokens x ITL after its scheduled
    # time), so an overloaded step ends within the SLO's own bound instead of draining a queue.
    rate_multiplier: float = 1.0
    slo_deadline: bool = False
    warmup: bool = True  # False: no request is a warmup one (a capacity step on an already-warm server)
    s3_uri: str | None = None
    api_key: str | None = None


class Replayer:
    def __init__(
        self,
        manifest: Manifest,
        cfg: ReplayConfig,
        *,
        metrics: ClientMetrics | None = None,
        on_record: Callable[[RequestRecord], None] | None = None,
        schedule: Sequence[ScheduledRequest] | None = None,
    ):
        self.m = manifest
        self.cfg = cfg
        self.worker = f"w{cfg.worker_index}"
        full = list(schedule) if schedule is not None else build_schedule(manifest)
        if cfg.rate_multiplier <= 0:
            raise ValueError(f"rate_multiplier must be > 0, got {cfg.rate_multiplier}")
        if cfg.rate_multiplier != 1.0:
            full = [replace(r, offset_s=r.offset_s / cfg.rate_multiplier) for r in full]
        if not cfg.warmup:
            full = [replace(r, warmup=False) for r in full]
        self.mine = partition(full, cfg.n_workers, cfg.worker_index)
        self.client = StreamingClient(cfg.host, api=cfg.api, timeout_s=manifest.loadgen.request_timeout_s, api_key=cfg.api_key)
        self.metrics = metrics
        self.on_record = on_record
        self.records: list[RequestRecord] = []
        self.sink = RecordSink(cfg.records_dir / records_name(cfg.fleet, self.worker))
        self._wire: dict[int, bytes] = {}
        self._pending: dict[int, ScheduledRequest] = {r.request_id: r for r in self.mine}
        self._inflight = Group()
        self._spawned: dict[int, ScheduledRequest] = {}  # spawned, no record yet
        self._stopped = False
        self._finalized: RunSummary | None = None
        self.ctx: RecordContext | None = None
        self._cpu: CpuMeter | None = None

    def prepare(self) -> None:
        builder = PromptBuilder(self.m, self.cfg.api)
        model = self.cfg.model or self.m.model.repo
        for r in self.mine:
            prompt = builder.build(r)
            body = request_body(self.cfg.api, model, self.m.generation, prompt, r.output_tokens)
            self._wire[r.request_id] = self.client.encode(body, request_id_header(self.m.campaign, self.cfg.fleet, r.request_id))

    def _emit(self, rec: RequestRecord) -> None:
        self.records.append(rec)
        self.sink.append(rec)
        if self.metrics is not None:
            self.metrics.observe(rec)
        if self.on_record is not None:
            try:
                self.on_record(rec)
            except Exception:
                log.exception("on_record hook failed")

    def _one(self, req: ScheduledRequest) -> None:
        assert self.ctx is not None
        sent_t = time.monotonic()
        timeout = None
        if self.cfg.slo_deadline:
            bound = self.m.slo.ttft_p95_s + req.output_tokens * self.m.slo.itl_p95_s
            timeout = max(0.001, min(self.m.loadgen.request_timeout_s, self.ctx.t0 + req.offset_s + bound - sent_t))
        try:
            ex = self.client.stream(self._wire.pop(req.request_id), timeout)
        except gevent.GreenletExit:
            end = time.monotonic()
            del self._spawned[req.request_id]
            self._emit(build_record(self.ctx, req, sent_t, end, StreamState(), Transport(error="aborted: run stopped mid-request")))
            raise
        del self._spawned[req.request_id]
        self._emit(build_record(self.ctx, req, ex.sent_t, ex.end_t, ex.state, ex.transport))

    def _flusher(self) -> None:
        while True:
            gevent.sleep(0.25)
            self.sink.maybe_flush()

    def run(self) -> RunSummary:
        """Replay to the end (or until stopped), wait for in-flight requests, finalize."""
        if not self._wire and self.mine:
            self.prepare()
        # The prompts and wire bytes built in prepare() are long-lived: move them out of the
        # collector's reach, and collect young objects less often, so a full collection over
        # thousands of live streams cannot stall the sending loop for tens of milliseconds.
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 50, 100)
        t0 = time.monotonic()
        self._cpu = CpuMeter()
        self.ctx = RecordContext(
            self.m.campaign, self.m.digest, self.cfg.fleet, self.worker, time.time(), t0, self.m.slo.ttft_p95_s, self.m.slo.itl_p95_s
        )
        flusher = gevent.spawn(self._flusher)
        try:
            for req in self.mine:
                if self._stopped:
                    break
                if self.cfg.duration_s is not None and req.offset_s > self.cfg.duration_s:
                    break
                delay = t0 + req.offset_s - time.monotonic()
                if delay > 0:
                    gevent.sleep(delay)
                if self._stopped:
                    break
                del self._pending[req.request_id]
                self._spawned[req.request_id] = req
                self._inflight.spawn(self._one, req)
            # Each request enforces request_timeout_s itself; the margin covers connect time.
            self._inflight.join(timeout=self.m.loadgen.request_timeout_s + 15.0)
        finally:
            flusher.kill()
        return self.finalize("schedule ended" if not self._stopped else "run stopped")

    def finalize(self, why: str = "run stopped") -> RunSummary:
        """Idempotent: abort what is in flight, record what was never sent, write the summary."""
        if self._finalized is not None:
            return self._finalized
        self._stopped = True
        self._inflight.kill(block=True, timeout=5.0)
        if self.ctx is None:  # stopped before the clock started: nothing was sent
            self.ctx = RecordContext(
                self.m.campaign,
                self.m.digest,
                self.cfg.fleet,
                self.worker,
                time.time(),
                time.monotonic(),
                self.m.slo.ttft_p95_s,
                self.m.slo.itl_p95_s,
            )
        # Spawned but killed before their first instruction: they never reached the wire.
        for req in [*self._spawned.values(), *self._pending.values()]:
            self._emit(not_sent_record(self.ctx, req, f"not sent: {why}"))
        self._pending.clear()
        self._spawned.clear()
        self.sink.close()
        summary = summarize(
            SummaryInputs(self.m.campaign, self.m.digest, self.cfg.fleet, self.m.loadgen.max_schedule_lag_p99_s),
            self.records,
            [r.request_id for r in self.mine],
            client_cpu_percent=self._cpu.percent() if self._cpu else 0.0,
            started_at=self.ctx.wall_start,
            ended_at=time.time(),
        )
        out = self.cfg.records_dir / summary_name(self.cfg.fleet, self.worker)
        out.write_text(summary.to_json(), encoding="utf-8")
        self._finalized = summary
        if self.cfg.s3_uri:
            try:
                upload_to_s3([self.sink.path, out], self.cfg.s3_uri)
            except Exception:
                log.exception("S3 upload to %s failed", self.cfg.s3_uri)
        return summary
