"""Locust entry point: `locust -f loadgen/locustfile.py --headless --manifest M --fleet F ...`.

One `ReplayUser` per worker process runs that worker's share of the open-loop schedule (the
launcher starts `-u <workers>` so each worker gets exactly one). Locust's own stats table
shows the streams ("POST /v1/..."), TTFT ("SSE ttft"), ITL ("SSE itl") and goodput
("SLO goodput": a failure there is an SLO miss); `/loadgen` on the web UI gives the same as
JSON. Workers tell the master when their share is done; the master quits when all have.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

# Locust imports this file by path, putting only the working directory and loadgen/ on sys.path
# (locust 2.47 locust/util/load_locustfile.py, load_locustfile). `loadgen.*` and `core.*` import
# because whatever starts Locust puts the directory holding our packages on PYTHONPATH: locally
# loadgen/launch.py (run_fleet); on Fargate the image's ENV PYTHONPATH=/app (Dockerfile: core/ and
# loadgen/ are copied there), which loadgen/task_entry.py's Locust inherits and
# testing/offline_tasks.py reproduces offline.
import gevent
import locust.runners
from locust import User, events, task
from locust.env import Environment
from locust.exception import StopUser
from locust.runners import STATE_MISSING, MasterRunner, WorkerRunner

from core.manifest import load_manifest
from core.records import Outcome, RequestRecord
from core.schedule import build_schedule
from core.tokenizer import for_manifest
from loadgen.launch import SETUP_FAILED
from loadgen.metrics import ClientMetrics
from loadgen.openai_request import PATHS
from loadgen.replay import ReplayConfig, Replayer
from loadgen.replay_options import add_arguments as add_replay_arguments
from loadgen.replay_options import from_namespace as replay_options

log = logging.getLogger("loadgen")
_T = TypeVar("_T")
DONE_MSG = "loadgen_done"
PROGRESS_EVERY_S = 10.0

# Locust's master marks a worker missing once it has gone HEARTBEAT_LIVENESS heartbeats (1 s
# apart) without one, and stops the run when every worker is missing ("The last worker went
# missing, stopping test.": locust 2.47 locust/runners.py, HEARTBEAT_LIVENESS = 3,
# MasterRunner.heartbeat_worker). Three seconds without CPU for both workers on 2 loaded cores
# ended CI's rehearsal replay with no record at all. Locust has no option for it; its master
# reads the module's constant each time it registers a worker or takes a heartbeat. A worker
# that died is still noticed (_watch_missing), this much later; on Fargate the conductor stops
# the fleet's tasks as soon as the dead one's task stops.
WORKER_LIVENESS_S = 15
locust.runners.HEARTBEAT_LIVENESS = WORKER_LIVENESS_S


@events.init_command_line_parser.add_listener  # type: ignore[untyped-decorator]
def _args(parser: Any) -> None:
    # None of these may be a web UI field: the run request fixes them, and a value changed in the
    # UI would measure something other than what the records claim. Locust 2.47 lists only options
    # added through its parser's own add_argument (args_included_in_web_ui); options of an argparse
    # group never show (tests/loadgen/test_locust_ui_args.py checks it).
    g = parser.add_argument_group("loadgen")
    g.add_argument(
        "--manifest", type=str, env_var="LOADGEN_MANIFEST", default="", help="frozen campaign manifest (YAML)"
    )
    g.add_argument("--fleet", type=str, env_var="LOADGEN_FLEET", default="", help="fleet name in the manifest")
    g.add_argument(
        "--records-dir",
        type=str,
        env_var="LOADGEN_RECORDS_DIR",
        default="runs/records",
        help="where records-<fleet>-<worker>.jsonl go",
    )
    g.add_argument(
        "--metrics-port",
        type=int,
        env_var="LOADGEN_METRICS_PORT",
        default=0,
        help="Prometheus port (worker i serves port+i; 0 = off)",
    )
    g.add_argument(
        "--metrics-addr", type=str, env_var="LOADGEN_METRICS_ADDR", default="127.0.0.1", help="Prometheus bind address"
    )
    g.add_argument(
        "--run-id", type=str, env_var="LOADGEN_RUN_ID", default="", help="label for this run (logs, S3 prefix)"
    )
    add_replay_arguments(g)  # api, served model, duration, rate, window, SLO deadline, warmup, tokenizer check
    g.add_argument(
        "--s3-uri",
        type=str,
        env_var="LOADGEN_S3_URI",
        default="",
        help="s3://bucket/prefix to upload records and summary to",
    )
    g.add_argument(
        "--records-prefix",
        type=str,
        env_var="LOADGEN_RECORDS_PREFIX",
        default="",
        help="a capacity step's sub-prefix under <s3-uri>/<run id>/ (its records, summaries and progress)",
    )


_state: dict[str, Any] = {
    "replayer": None,
    "started": False,
    "done_workers": set(),
    "done_nodes": set(),
    "progress_final": False,
}


def _n_workers(env: Environment) -> tuple[int, int]:
    runner = env.runner
    if isinstance(runner, WorkerRunner):
        n = int(getattr(env.parsed_options, "expect_workers", 1) or 1)
        return runner.worker_index, n
    return 0, 1


def _fire(env: Environment, rec: RequestRecord) -> None:
    """Mirror each record into Locust's stats so the web UI shows TTFT/ITL/goodput."""
    fire: Any = env.events.request.fire
    ok = rec.outcome == Outcome.OK.value
    opts: Any = env.parsed_options
    path = PATHS[opts.api]
    ms = (rec.e2e_s or 0.0) * 1000
    fire(
        request_type="POST",
        name=f"{path} (warmup)" if rec.warmup else path,  # seen in the UI, kept out of the rows below
        response_time=ms,
        response_length=rec.output_tokens,
        exception=None if ok else RuntimeError(f"{rec.outcome}: {rec.error}"),
        context={},
    )
    if rec.warmup:
        return
    if ok and rec.ttft_s is not None:
        fire(
            request_type="SSE",
            name="ttft",
            response_time=rec.ttft_s * 1000,
            response_length=0,
            exception=None,
            context={},
        )
    if ok and rec.itl_s is not None:
        fire(
            request_type="SSE",
            name="itl",
            response_time=rec.itl_s * 1000,
            response_length=0,
            exception=None,
            context={},
        )
    fire(
        request_type="SLO",
        name="goodput",
        response_time=ms,
        response_length=rec.output_tokens if rec.slo_ok else 0,
        exception=None if rec.slo_ok else RuntimeError("SLO miss"),
        context={},
    )


def _run_uri(o: Any) -> str | None:
    """Where this replay's files go: <s3-uri>/<run id>[/<records prefix>] (a capacity step's own prefix)."""
    if not o.s3_uri:
        return None
    parts = [o.s3_uri.rstrip("/"), *(p.strip("/") for p in (o.run_id, o.records_prefix) if p.strip("/"))]
    return "/".join(parts)


def _off_loop(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """`fn(*args, **kwargs)` in gevent's thread pool, its exception raised here, on the loop's
    thread (the pool's own error path would print a second, bare traceback to the log first)."""

    def call() -> tuple[_T | None, BaseException | None]:
        try:
            return fn(*args, **kwargs), None
        except Exception as exc:
            return None, exc

    value, exc = gevent.get_hub().threadpool.apply(call)
    if exc is not None:
        raise exc
    return cast(_T, value)


def _make_replayer(env: Environment) -> Replayer:
    o: Any = env.parsed_options  # argparse.Namespace with our custom args
    if not o.manifest or not o.fleet:
        raise SystemExit("loadgen: --manifest and --fleet are required")
    if not env.host:
        raise SystemExit("loadgen: --host (the fleet's endpoint URL) is required")
    # Reading the manifest's files, the trace and the tokenizer is seconds of CPU on a loaded
    # machine; done in gevent's pool of native threads, the worker's event loop goes on sending
    # its heartbeats meanwhile (the GIL is handed over every few milliseconds).
    m = _off_loop(load_manifest, o.manifest)
    m.fleet(o.fleet)  # KeyError names the fleets when the name is wrong
    options = replay_options(o)
    schedule = _off_loop(build_schedule, m, window_s=options.window_s, skip_s=options.skip_s)
    tokenizer = _off_loop(for_manifest, m)
    index, n = _n_workers(env)
    metrics = None
    if o.metrics_port:
        metrics = ClientMetrics(
            fleet=o.fleet,
            campaign=m.campaign,
            manifest_digest=m.digest,
            ttft_slo_s=m.slo.ttft_p95_s,
            itl_slo_s=m.slo.itl_p95_s,
        )
        port = metrics.serve(o.metrics_port + index, o.metrics_addr)
        log.info("loadgen metrics on %s:%d", o.metrics_addr, port)
    s3 = _run_uri(o)
    cfg = ReplayConfig(
        fleet=o.fleet,
        host=env.host,
        records_dir=Path(o.records_dir),
        worker_index=index,
        n_workers=n,
        options=options,
        s3_uri=s3,
        api_key=os.environ.get("LOADGEN_API_KEY") or None,
    )
    r = Replayer(m, cfg, metrics=metrics, on_record=lambda rec: _fire(env, rec), schedule=schedule, tokenizer=tokenizer)
    r.prepare()
    log.info("loadgen worker %d/%d: %d of the schedule's requests for fleet %s", index, n, len(r.mine), o.fleet)
    return r


class ReplayUser(User):
    """Not a closed-loop user: its single task replays the schedule open-loop, then stops."""

    def on_start(self) -> None:
        if _state["started"]:
            raise StopUser()  # more users than workers: only the first replays
        _state["started"] = True

    @task
    def replay(self) -> None:
        env = self.environment
        try:
            r = _state["replayer"] = _state["replayer"] or _make_replayer(env)
        except (Exception, SystemExit) as exc:
            _setup_failed(env, exc)
            raise StopUser() from None
        summary = r.run()
        log.info("loadgen %s done: %s", r.worker, summary.to_json().replace("\n", " "))
        runner = env.runner
        if isinstance(runner, WorkerRunner):
            runner.send_message(DONE_MSG, {"worker": r.worker, "valid": summary.valid})
        elif runner is not None:
            _quit(env)
        raise StopUser()


def _setup_failed(env: Environment, exc: BaseException) -> None:
    """Nothing was sent: stop the whole run now with SETUP_FAILED, once, naming the cause
    (a retried task would loop on the same error, and a port bound by the first try would
    hide the real cause behind "address in use")."""
    log.error(
        "loadgen: setup failed, stopping before any request is sent: %s", exc, exc_info=not isinstance(exc, SystemExit)
    )
    env.process_exit_code = SETUP_FAILED
    runner = env.runner
    if isinstance(runner, WorkerRunner):
        index, _n = _n_workers(env)
        runner.send_message(DONE_MSG, {"worker": f"w{index}", "valid": False, "error": str(exc)})
    elif runner is not None:
        _quit(env)


def _quit(env: Environment) -> None:
    """Stop the run. With the web UI (`--autostart` in a Fargate master) the process would
    otherwise live on behind its UI: it exits `--autoquit` seconds later, after the operator
    has seen the final figures (without --autoquit the UI stays, as Locust does)."""
    runner = env.runner
    if runner is None:
        return
    if isinstance(runner, MasterRunner):
        loop = _state.get("progress_loop")
        if loop is not None:
            loop.kill()  # a periodic write still in flight must not land after the final one
        publish_progress(env, final=True)
    gevent.spawn(runner.quit)
    web_ui = env.web_ui
    linger = getattr(env.parsed_options, "autoquit", -1)
    if web_ui is not None and linger is not None and linger >= 0:
        log.info("loadgen: run over; the web UI stays up %d s", linger)
        gevent.spawn_later(linger, web_ui.stop)


def _on_done(env: Environment, msg: Any, **_: Any) -> None:
    if msg.data.get("error"):
        log.error("loadgen: %s setup failed: %s", msg.data["worker"], msg.data["error"])  # the marker exit_reason reads
        env.process_exit_code = SETUP_FAILED
        _quit(env)  # the others would measure a partial schedule
        return
    _state["done_workers"].add(msg.data["worker"])
    _state["done_nodes"].add(msg.node_id)
    opts: Any = env.parsed_options
    expected = int(opts.expect_workers or 1)
    log.info("loadgen: %s finished (%d/%d)", msg.data["worker"], len(_state["done_workers"]), expected)
    if len(_state["done_workers"]) >= expected:
        _quit(env)


def _watch_missing(env: Environment, runner: MasterRunner) -> None:
    """A worker that died (killed, OOM) never reports done: without this the master would idle
    until the safety-net --run-time. Once Locust's heartbeat marks a worker missing and every
    worker still alive is done, quit: the launcher flags the run invalid (dead worker's exit
    code, requests without a record) and keeps every record already flushed."""
    while True:
        gevent.sleep(1.0)
        missing = runner.clients.missing
        if not missing:
            continue
        alive = [c for c in runner.clients.all if c.state != STATE_MISSING]
        if all(c.id in _state["done_nodes"] for c in alive):
            log.warning(
                "loadgen: %d worker(s) went missing (%s) and every other worker is done: stopping",
                len(missing),
                ", ".join(c.id for c in missing),
            )
            _quit(env)
            return


@events.init.add_listener  # type: ignore[untyped-decorator]
def _init(environment: Environment, **_: Any) -> None:
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        runner.register_message(DONE_MSG, lambda msg, **kw: _on_done(environment, msg))
        gevent.spawn(_watch_missing, environment, runner)
        _state["progress_loop"] = gevent.spawn(_progress_loop, environment)
    web_ui = environment.web_ui
    if web_ui is not None:

        @web_ui.app.route("/loadgen")  # type: ignore[untyped-decorator,union-attr]
        def _loadgen_stats() -> dict[str, Any]:
            return loadgen_stats(environment)


def loadgen_stats(environment: Environment) -> dict[str, Any]:
    """TTFT, ITL and goodput as Locust's stats hold them (the master's: merged from the workers'
    reports every few seconds): what the UI's /loadgen and the progress object show."""
    stats = environment.stats
    out: dict[str, Any] = {}
    for name, method in (("ttft", "SSE"), ("itl", "SSE"), ("goodput", "SLO")):
        e = stats.get(name, method)
        out[name] = {
            "count": e.num_requests,
            "failures": e.num_failures,
            "p50_ms": e.get_response_time_percentile(0.5),
            "p95_ms": e.get_response_time_percentile(0.95),
        }
    g = out["goodput"]
    out["goodput"]["slo_compliant_share"] = (g["count"] - g["failures"]) / g["count"] if g["count"] else None
    return out


def publish_progress(env: Environment, *, final: bool = False) -> None:
    """A cloud master writes <s3-uri>/<run id>/progress-<fleet>.json for `campaign run` to print:
    a view of the run while it lasts, not evidence (the records are)."""
    o: Any = env.parsed_options
    if not (o.s3_uri and o.run_id and o.fleet) or _state["progress_final"]:
        return  # nothing may overwrite the final view with an older periodic one
    _state["progress_final"] = final
    from core.cloud_contract import PROGRESS_PREFIX, split_s3_uri

    try:
        import boto3

        bucket, prefix = split_s3_uri(f"{_run_uri(o)}/{PROGRESS_PREFIX}{o.fleet}.json")
        runner = env.runner
        body = {
            "fleet": o.fleet,
            "final": final,
            "at": time.time(),
            "state": getattr(runner, "state", None),
            **loadgen_stats(env),
        }
        boto3.client("s3").put_object(Bucket=bucket, Key=prefix, Body=json.dumps(body).encode())
    except Exception as exc:  # progress is a convenience: the run goes on
        log.warning("loadgen: progress not written: %s", exc)


def _progress_loop(env: Environment) -> None:
    while True:
        gevent.sleep(PROGRESS_EVERY_S)
        publish_progress(env)


def _finalize(environment: Environment, **_: Any) -> None:
    r: Replayer | None = _state["replayer"]
    if r is not None:
        r.finalize("run stopped before the schedule ended")


# test_stopping fires before Locust kills users (run-time reached, Ctrl-C, master quit):
# record what is left as not_sent / aborted while the replayer still knows it.
events.test_stopping.add_listener(_finalize)  # type: ignore[no-untyped-call]
events.quitting.add_listener(_finalize)  # type: ignore[no-untyped-call]
