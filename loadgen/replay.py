"""Open-loop replay of one worker's share of the schedule (gevent; no Locust import).

Each request is started at its scheduled time whatever is in flight: the offered load is the
trace's, never throttled by slow responses (no closed-loop users). Requests are started from
a high-priority timer and, under load, from the read callbacks of the streams already in
flight (`Replayer.launch_due`): a send never waits for a greenlet to be scheduled behind a
loop iteration full of other streams' tokens. Prompts and request bytes are prepared before
the clock starts so synthesis never adds lag.
"""

from __future__ import annotations

import gc
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gevent
from gevent import get_hub
from gevent.event import Event
from gevent.lock import Semaphore

from core.manifest import Manifest
from core.records import RequestRecord, RunSummary
from core.schedule import ScheduledRequest, build_schedule, partition
from core.serving import served_model_id
from core.tokenizer import Tokenizer
from loadgen.client import Exchange, Stream, StreamingClient, close_watcher, resolver_for
from loadgen.metrics import ClientMetrics
from loadgen.openai_request import request_body, request_id_header
from loadgen.prompts import Prompt, PromptBuilder
from loadgen.recording import (
    RecordContext,
    RecordParts,
    RecordSink,
    build_record,
    not_sent_record,
    records_name,
    summary_name,
    upload_to_s3,
)
from loadgen.replay_options import ReplayOptions
from loadgen.summary import CpuMeter, SummaryInputs, summarize
from loadgen.tokenizer_check import check_prompt_counts, pick_samples

log = logging.getLogger("loadgen.replay")
_SPIN_S = 0.0015  # see Replayer._wait_until


@dataclass(frozen=True)
class ReplayConfig:
    fleet: str
    host: str
    records_dir: Path
    worker_index: int = 0
    n_workers: int = 1
    options: ReplayOptions = field(default_factory=ReplayOptions)
    s3_uri: str | None = None
    api_key: str | None = None


_FINAL_UPLOAD_S = 60.0  # the longest a stopping worker waits for its final S3 upload


class Replayer:
    def __init__(
        self,
        manifest: Manifest,
        cfg: ReplayConfig,
        *,
        metrics: ClientMetrics | None = None,
        on_record: Callable[[RequestRecord], None] | None = None,
        schedule: Sequence[ScheduledRequest] | None = None,
        tokenizer: Tokenizer | None = None,
    ):
        """`schedule` and `tokenizer`: built by the caller already (a Locust worker builds them
        off its event loop); None: built here."""
        self.m = manifest
        self._tokenizer = tokenizer
        self.cfg = cfg
        self.worker = f"w{cfg.worker_index}"
        self.options = opts = cfg.options
        full = (
            list(schedule)
            if schedule is not None
            else build_schedule(manifest, window_s=opts.window_s, skip_s=opts.skip_s)
        )
        if opts.rate_multiplier != 1.0:
            full = [replace(r, offset_s=r.offset_s / opts.rate_multiplier) for r in full]
        if not opts.warmup:
            full = [replace(r, warmup=False) for r in full]
        self.mine = partition(full, cfg.n_workers, cfg.worker_index)
        self.client = StreamingClient(
            cfg.host,
            api=opts.api,
            timeout_s=manifest.loadgen.request_timeout_s,
            api_key=cfg.api_key,
            resolver=resolver_for(opts.resolver),
        )
        self.metrics = metrics
        self.on_record = on_record
        self.records: list[RequestRecord] = []
        self.sink = RecordSink(cfg.records_dir / records_name(cfg.fleet, self.worker))
        # A cloud worker's records go up as they are written, a new object per flush.
        self.parts = RecordParts(self.sink.path, cfg.s3_uri, cfg.fleet, self.worker) if cfg.s3_uri else None
        self._part_lock = Semaphore()  # one part upload at a time: the periodic one, or the final one
        self._wire: dict[int, bytes] = {}
        self._prompt_tokens: dict[int, int] = {}  # what each prompt really is, for its record
        self._pending: dict[int, ScheduledRequest] = {r.request_id: r for r in self.mine}
        self._inflight: dict[int, Stream] = {}  # started, no record yet
        self._slo_bound: set[int] = set()  # in flight with their SLO deadline as the timeout (slo_deadline)
        self._next = 0  # index in self.mine of the next request to send
        self.next_due = math.inf  # monotonic time it is due (read by every stream's read callback)
        self._launching = False
        self._timer: Any = None
        self._spinner: Any = None
        self._sending_over = Event()  # the schedule is sent (or cut by duration_s, or stopped)
        self._drained = Event()  # ... and nothing is in flight any more
        self._stopped = False
        self._finalized: RunSummary | None = None
        self._periodic: gevent.Greenlet | None = None  # the records' periodic S3 upload (a cloud worker)
        self._final_upload: gevent.Greenlet | None = None
        self.ctx: RecordContext | None = None
        self._cpu: CpuMeter | None = None

    def prepare(self) -> None:
        """Build every prompt and its wire bytes, then the tokenizer check. A failure here stops
        the run before anything is sent, and every request of this worker is still recorded
        (not_sent, naming the cause), so the replay invariant holds for a stopped run too."""
        try:
            self._prepare()
        except Exception as exc:
            self.finalize(f"setup failed: {exc}")
            raise

    def _prepare(self) -> None:
        builder = PromptBuilder(self.m, self.options.api, self._tokenizer)
        fleet = self.m.fleet(self.cfg.fleet)
        model = self.options.served_model or served_model_id(self.m, fleet)
        stack = fleet.serving.stack
        inexact = 0
        built: list[tuple[int, Prompt]] = []
        yielded = time.monotonic()
        for r in self.mine:
            # A worker builds its prompts inside Locust's event loop: a build of thousands of
            # prompts that never yielded kept the worker's heartbeat from going out, so its master
            # marked it missing after 3 s (locust.runners HEARTBEAT_LIVENESS; 15 s since
            # loadgen/locustfile.py sets it) and, with no other worker left, stopped the run before a
            # request was sent (seen on 2 loaded cores).
            if time.monotonic() - yielded > 0.2:
                gevent.sleep(0.001)  # sleep(0) runs ready greenlets only; this runs the loop's timers too
                yielded = time.monotonic()
            prompt = builder.build(r)
            built.append((r.request_id, prompt))
            inexact += not prompt.exact
            self._prompt_tokens[r.request_id] = prompt.tokens
            body = request_body(self.options.api, model, self.m.generation, prompt, r.output_tokens, stack)
            self._wire[r.request_id] = self.client.encode(
                body, request_id_header(self.m.campaign, self.cfg.fleet, r.request_id)
            )
        if inexact:
            log.warning(
                "%d prompts are shorter than the chat template itself; their records carry the real length", inexact
            )
        if self.options.tokenizer_check:
            # Raises TokenizerMismatch (the run's setup fails, nothing is sent) on a disagreement.
            res = check_prompt_counts(
                self.cfg.host, model, pick_samples(built), api_key=self.cfg.api_key, resolver=self.options.resolver
            )
            if res.skipped:
                log.warning("tokenizer check skipped after %d prompts: %s", res.checked, res.skipped)
            else:
                log.info("the server counts %d sample prompts exactly as the manifest's tokenizer does", res.checked)

    def _context(self, t0: float) -> RecordContext:
        """What every record of this run carries; offsets count from monotonic `t0` (now)."""
        m = self.m
        return RecordContext(
            m.campaign, m.digest, self.cfg.fleet, self.worker, time.time(), t0, m.slo.ttft_p95_s, m.slo.itl_p95_s
        )

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

    def _launch(self, req: ScheduledRequest) -> None:
        assert self.ctx is not None
        timeout = None
        if self.options.slo_deadline:
            bound = self.m.slo.ttft_p95_s + req.output_tokens * self.m.slo.itl_p95_s
            slo_left = self.ctx.t0 + req.offset_s + bound - time.monotonic()
            if slo_left <= self.m.loadgen.request_timeout_s:  # its SLO, not the request timeout, ends it
                self._slo_bound.add(req.request_id)
            timeout = max(0.001, min(self.m.loadgen.request_timeout_s, slo_left))
        del self._pending[req.request_id]
        rid = req.request_id
        st = self._inflight[rid] = self.client.open(self._wire.pop(rid), lambda ex: self._done(req, ex), timeout)
        st.begin()  # a stream that fails at once calls _done from in here

    def _done(self, req: ScheduledRequest, ex: Exchange) -> None:
        assert self.ctx is not None
        self._inflight.pop(req.request_id, None)
        transport = ex.transport
        if req.request_id in self._slo_bound:
            self._slo_bound.discard(req.request_id)
            transport = replace(transport, slo_abandoned=transport.timed_out)
        self._emit(
            build_record(
                self.ctx, req, ex.sent_t, ex.end_t, ex.state, transport, self._prompt_tokens.get(req.request_id)
            )
        )
        if not self._inflight and self._sending_over.is_set():
            self._drained.set()

    def launch_due(self, now: float) -> None:
        """Send every request whose time has come; then arm the timer for the next one. Runs in
        the hub (timer or a stream's read callback), never blocks."""
        if self._launching:  # re-entered from a stream that failed at once
            return
        self._launching = True
        try:
            assert self.ctx is not None
            t0, mine, limit = self.ctx.t0, self.mine, self.options.duration_s
            while self._next < len(mine) and not self._stopped:
                req = mine[self._next]
                if limit is not None and req.offset_s > limit:
                    break
                due = t0 + req.offset_s
                if due > now:
                    now = time.monotonic()
                    if due > now:
                        self.next_due = due
                        self._wait_until(due, now)
                        return
                self._next += 1
                self._launch(req)
            self.next_due = math.inf
            self._stop_waiting()
            self._sending_over.set()
            if not self._inflight:
                self._drained.set()
        finally:
            self._launching = False

    def _wait_until(self, due: float, now: float) -> None:
        """Come back at `due`. A libev timer on epoll wakes up to 1 ms late (epoll_wait counts
        whole milliseconds, and libev never sleeps less than 1 ms), so the timer is set
        _SPIN_S early, at the highest priority, and the last stretch polls: an idle watcher
        keeps the loop from blocking (epoll with a zero timeout) and checks the clock once per
        iteration, while reads go on being served."""
        if due - now > _SPIN_S:
            self._stop_spinning()
            close_watcher(self._timer)
            loop = get_hub().loop
            loop.update_now()
            self._timer = t = loop.timer(due - now - _SPIN_S, 0.0, True, 2)
            t.start(self._wake)
        elif self._spinner is None:
            self._spinner = get_hub().loop.idle(True, 2)
            self._spinner.start(self._wake)

    def _wake(self) -> None:
        self.launch_due(time.monotonic())

    def _stop_spinning(self) -> None:
        close_watcher(self._spinner)
        self._spinner = None

    def _stop_waiting(self) -> None:
        self._stop_spinning()
        close_watcher(self._timer)
        self._timer = None

    def _flusher(self) -> None:
        while True:
            gevent.sleep(0.25)
            self.sink.maybe_flush()

    def _uploader(self) -> None:
        """A cloud worker's new records as a new part, every RECORDS_UPLOAD_EVERY_S: `campaign run`
        reads a capacity step's records while it runs (to stop it on a certain miss)."""
        from core.cloud_contract import RECORDS_UPLOAD_EVERY_S

        while True:
            gevent.sleep(RECORDS_UPLOAD_EVERY_S)
            self.sink.flush()
            try:
                self._upload_part()
            except Exception as exc:  # its lines go up with the next part, at the latest the final one
                log.warning("periodic S3 upload to %s failed: %s", self.cfg.s3_uri, exc)

    def _upload_part(self) -> None:
        assert self.parts is not None
        with self._part_lock:
            self.parts.flush()

    def _stop_uploader(self) -> None:
        """Kill the periodic uploader, unless a part is going up right now: a put cut off mid-way
        could still land after the final part under the same key, with fewer lines. Then it is
        left to finish; the final part waits for it (`_part_lock`), and it is killed after."""
        if self._periodic is not None and not self._part_lock.locked():
            self._periodic.kill()

    def _resolver(self) -> None:
        """Keep a host name's addresses fresh (an NLB's change): new streams take the last
        lookup's addresses in turn, so an AZ that leaves the answer gets no new request."""
        while True:
            gevent.sleep(5.0)
            try:
                self.client.resolve()
            except Exception as exc:
                log.warning("resolving %s failed, keeping the last addresses: %s", self.client.host, exc)

    def run(self) -> RunSummary:
        """Replay to the end (or until stopped), wait for in-flight requests, finalize."""
        if not self._wire and self.mine:
            self.prepare()
        try:
            self.client.resolve()
        except Exception as exc:  # every request will fail and say so in its record
            log.error("cannot resolve %s: %s", self.client.host, exc)
        # The prompts and wire bytes built in prepare() are long-lived: move them out of the
        # collector's reach, and collect young objects less often, so a full collection over
        # thousands of live streams cannot stall the sending loop for tens of milliseconds.
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 50, 100)
        t0 = time.monotonic()
        self._cpu = CpuMeter()
        self.ctx = self._context(t0)
        helpers = [gevent.spawn(self._flusher), gevent.spawn(self._resolver)]
        if self.cfg.s3_uri:
            self._periodic = gevent.spawn(self._uploader)
            helpers.append(self._periodic)
        self.client.hook = self
        try:
            if not self._stopped:
                self.launch_due(time.monotonic())
            self._sending_over.wait()
            # Each request enforces request_timeout_s itself; the margin covers a late callback.
            self._drained.wait(timeout=self.m.loadgen.request_timeout_s + 15.0)
        finally:
            self.client.hook = None
            gevent.killall(helpers)
        return self.finalize("schedule ended" if not self._stopped else "run stopped")

    def finalize(self, why: str = "run stopped") -> RunSummary:
        """Idempotent: abort what is in flight, record what was never sent, write the summary and
        (a cloud worker) upload both. Every call returns only once that upload is over: Locust
        calls this from its stop and quit hooks and exits right after, and a SIGTERM'd worker
        that exited mid-upload left a stale records file and no summary in S3 (seen offline)."""
        if self._finalized is not None:
            if self._final_upload is not None:
                self._final_upload.join(timeout=_FINAL_UPLOAD_S)
            return self._finalized
        self._stopped = True
        self.next_due = math.inf
        self._stop_waiting()
        if self.ctx is None:  # stopped before the clock started: nothing was sent
            self.ctx = self._context(time.monotonic())
        for st in list(self._inflight.values()):
            st.abort("aborted: run stopped mid-request")  # emits its record via _done
        for req in self._pending.values():
            self._emit(not_sent_record(self.ctx, req, f"not sent: {why}", self._prompt_tokens.get(req.request_id)))
        self._pending.clear()
        self._sending_over.set()
        self._drained.set()
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
            self._stop_uploader()
            # Its own greenlet: Locust kills the user greenlets that may call this, not this one.
            self._final_upload = gevent.spawn(self._upload_final, out)
            self._final_upload.join(timeout=_FINAL_UPLOAD_S)
        return summary

    def _upload_final(self, summary: Path) -> None:
        """The last part (what the periodic parts have not carried), then the summary."""
        assert self.cfg.s3_uri
        try:
            self._upload_part()
            upload_to_s3([summary], self.cfg.s3_uri)
        except Exception:
            log.exception("S3 upload to %s failed", self.cfg.s3_uri)
        finally:
            if self._periodic is not None:
                self._periodic.kill()
