"""`make cloud-offline-resume`: the offline cloud campaign (testing.cloud_offline's stand-ins) run
detached, its conductor killed, then picked up by `run --resume`, as a campaign whose orchestrator
died would be on AWS.

    .venv/bin/python -m testing.cloud_offline_resume [MANIFEST] [--out DIR] [--seed N] [--kill WHERE ...]

The run starts as `run --detach` starts it (campaign.backends.fargate.conductor.detach): the
conductor is its own process (testing.offline_conductor: `campaign conduct`), its tasks are
processes too, and the task launcher's state is on disk (testing.offline_tasks), so SIGKILL really
kills the orchestration mid-flight and leaves its tasks running, as a dead Fargate task would.
Each kill is one of:

    search   at a random point (the seed's) of the capacity search
    settle   at a random point of the settle phase (at once where it ends first: one that
             runs no segment ends as it starts; the example's here does, as its next segment
             needs more arrivals than the short settle budget holds; a run cut mid-settle is
             resumed in tests/campaign/test_resume_stages.py, on the simulated fleets)
    random   search or settle, as the seed picks (the default)
    report   as the report starts (after the last checkpoint before it)
    upload   during a publish of the run directory: the conductor's S3 traffic goes through a
             loopback proxy to moto, which kills it as the first `search.json` is being put

After each kill, `run --resume RUN_ID --detach` starts a new conductor (stopping what is left of
the run first); after the last, `run --attach` follows it to its report. Several kills kill the
resumed runs in turn (`--kill search --kill report`: a resume that is itself killed and resumed).
Then it checks, and exits 1 naming what failed, else with the decision's code (0, 10, 11):
- the run record says it resumed: at which stage, which steps it carried over;
- no finished step ran twice: no search step whose verdict was under the run's prefix at a kill
  has a master task (the launcher's own record) started after it;
- every search step's verdict (step.json) under the prefix at a kill that the run's resumes carried
  over is byte for byte the one under the prefix at the end, and every other one was set aside;
- the resumed run's report says it resumed (provenance "resume", as resumes.json records it), and
  `report --run-dir` over the run's directory as its prefix holds it gives the resumed run's
  report.json field by field (report_differences; VOLATILE names the few fields left out).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from testing.cloud_offline import EXAMPLE, LAG_BOUND_S, OfflineAws, offline_aws, offline_manifest
from testing.json_diff import report_differences

KILLS = ("search", "settle", "random", "report", "upload")
# Where a run is, by run.json's stage as run_stages checkpoints it (campaign.stages.run): the gate
# and replay ("quality gate", "trace replay"), then "capacity search: before <fleet>/<step>" per
# step, "capacity search" once every search ended (the settle phase runs from there), "settle
# phase: before <fleet>/<step>" per segment, "settle phase" at its end, "server series" as the
# report starts.
PHASES = {"search": 1, "settle": 2, "report": 4}


def phase(stage: str) -> int:
    if stage.startswith("capacity search: before "):
        return PHASES["search"]
    if stage == "capacity search" or stage.startswith("settle phase: before "):
        return PHASES["settle"]
    if stage == "settle phase":
        return 3
    if stage == "server series":
        return PHASES["report"]
    return 0


# How long after its stage is first seen a random kill falls, at most (seconds): the emulated
# searches take minutes, a settle phase about one.
RANDOM_WITHIN_S = {"search": 60.0, "settle": 20.0}
UPLOAD_KILL = re.compile(r"/capacity/[^/]+/search\.json$")


# report.json's fields that two builds of one report from the same files differ in by nature, not
# by a figure; report_differences compares every other field. Run-relative paths need no entry:
# `report --run-dir` writes into a copy of the run's directory, so its run-relative paths are the run's.
VOLATILE = frozenset(
    {
        "generated_at",  # when the report was built: the run's at its end, `report --run-dir`'s after it
        # The manifest's file name and digest: the conductor staged it as manifest.yaml, `report
        # --run-dir` names the operator's copy. Its digest, which identifies it, is manifest_digest.
        "provenance.manifest.detail",
    }
)


class KillMissed(RuntimeError):
    """The run ended (or never reached the stage) before the kill."""


def quick_search(data: dict[str, Any]) -> None:
    """`offline_manifest(change=)`: short steps (30 requests: about 30 s at x0.5 of the example's
    arrivals), a coarser bracket and a short settle budget, so a search takes a few steps in a few
    minutes, a kill within it usually finds some finished, and a run killed and resumed twice still
    ends in minutes; the stages are under test here, not the search's precision."""
    data["workload"]["capacity_search"] = {
        **data["workload"].get("capacity_search", {}),
        "min_requests": 30,
        "tolerance": 0.5,
        "max_steps": 4,
        "time_budget_s": 240,
        "settle_budget_s": 30,
    }


def _kill(launcher: Any, conductor: str, say: Callable[[str], None], why: str) -> None:
    """SIGKILL the conductor's process alone: its tasks, each its own session, go on as on ECS."""
    proc = launcher.procs[conductor]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    say(f"== killed the conductor {conductor} (SIGKILL, pid {proc.pid}): {why}")


@contextmanager
def killing_proxy(target: str, on_put: Callable[[str], bool]) -> Iterator[str]:
    """A loopback HTTP proxy to `target` (moto): each PUT's path is shown to `on_put` first, and
    when it answers True the request is dropped unanswered (the process that sent it was just
    killed). Yields the proxy's URL."""
    upstream = urlsplit(target)
    hop_by_hop = ("connection", "transfer-encoding", "expect", "keep-alive")

    class Hop(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.command == "PUT" and on_put(self.path.split("?", 1)[0]):
                self.close_connection = True
                return
            conn = http.client.HTTPConnection(upstream.hostname or "127.0.0.1", upstream.port, timeout=120)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in hop_by_hop}
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in (*hop_by_hop, "content-length"):
                    self.send_header(k, v)
            # a HEAD answer keeps the object's length; its body is empty
            self.send_header(
                "Content-Length", resp.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
            )
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            conn.close()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hop)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Outcome:
    run_id: str
    uri: str
    exit_code: int  # the resumed run's, as `run --attach` ended with it
    kills: list[str]  # "<where> at <stage>" per kill
    record: dict[str, Any]  # run.json at the end
    run_dir: Path  # the run's directory as its prefix holds it (fetched at the end)
    problems: list[str]  # what the checks found wrong (empty: all held)
    compared_fields: int = 0  # report.json's leaf fields compared with `report --run-dir`'s
    carried_verdicts: int = 0  # carried-over step.json files found byte-identical at the end


class KillingRun:
    """One offline cloud run, detached, killed at `kills` in turn and resumed after each."""

    def __init__(self, aws: OfflineAws, manifest_path: Path, out: Path, seed: int, say: Callable[[str], None]) -> None:
        from campaign.aws.run_config import read_run_config
        from campaign.aws.stack import stack_name
        from core.manifest import load_manifest

        self.aws, self.out, self.say = aws, out, say
        self.m = load_manifest(manifest_path)
        self.rng = random.Random(seed)
        self.s3 = aws.session.client("s3")
        self.cfg = read_run_config(aws.session.client("cloudformation"), stack_name(self.m))
        self.killed = threading.Event()
        self.current = ""  # the kill now awaited: the proxy kills only while it is "upload"
        self.conductor = ""
        self.launcher: Any = None
        # per kill: when, and the search steps whose verdict (step.json) was under the run's prefix
        # then, (fleet, label) -> that step.json's bytes
        self.finished_at_kill: list[tuple[float, dict[tuple[str, str], bytes]]] = []

    def _on_put(self, path: str) -> bool:
        """The upload kill: the first search.json put by the conductor kills it, before it lands."""
        if self.current != "upload" or self.killed.is_set() or not UPLOAD_KILL.search(path):
            return False
        _kill(self.launcher, self.conductor, self.say, f"upload: while putting {path}")
        self.killed.set()
        return True

    def run(self, kills: list[str]) -> Outcome:
        from campaign.aws.s3_trees import download_tree
        from campaign.backends.fargate.conductor import Attached, attach
        from core import cloud_contract as cc
        from testing.offline_tasks import LocalTaskLauncher

        env = {**self.aws.env, **self.aws.task_env}
        with killing_proxy(self.aws.env["AWS_ENDPOINT_URL"], self._on_put) as proxy:
            if "upload" in kills:  # every S3 call of the run's processes goes through the proxy
                env["AWS_ENDPOINT_URL_S3"] = proxy
            self.launcher = LocalTaskLauncher(
                self.aws.template,
                self.aws.refs,
                self.out / "tasks",
                env,
                cpus=self.aws.task_cpus,
                concurrent=self.aws.concurrent,
                stand_in=self.aws.stand_in,
            )
            try:
                run_id = cc.new_run_id()
                uri = cc.run_uri(self.cfg.results_uri, run_id)
                self._detach(run_id, resume=False)
                done = []
                for kill in kills:
                    where, _, after = kill.partition("@")
                    self.killed.clear()
                    self.current = where
                    stage = self._wait_and_kill(run_id, uri, where, float(after) if after else None)
                    self.current = ""
                    done.append(f"{kill} at {stage!r}")
                    self.finished_at_kill.append((time.time(), self._verdicts(uri)))
                    self._detach(run_id, resume=True)
                code = attach(self.aws.session, self.cfg, run_id, self.launcher, poll_s=1.0)
            finally:
                self.launcher.close()
        record = Attached(self.s3, self.cfg, run_id).record()
        run_dir = self.out / "fetched" / run_id
        download_tree(self.s3, uri, run_dir)
        outcome = Outcome(run_id, uri, code, done, record, run_dir, [])
        outcome.problems = self.check(outcome)
        return outcome

    def _detach(self, run_id: str, *, resume: bool) -> None:
        """`run --detach` (`--resume` with it): a conductor started on the run, this one's from now."""
        from campaign.backends.fargate.conductor import ConductorRequest, detach

        request = ConductorRequest(run_id, resume, requested_at=time.time())
        self.conductor = detach(self.aws.session, self.m, self.cfg, self.launcher, request)
        self.say(f"== run {'--resume ' if resume else ''}{run_id} --detach: conductor {self.conductor}")

    def _wait_and_kill(self, run_id: str, uri: str, where: str, after: float | None) -> str:
        """Follow the run's progress lines (as `run --attach` does) until the kill's moment, then
        kill its conductor; returns the stage run.json names at the kill. `after`: seconds after
        the run reached `where` (None: at random, up to RANDOM_WITHIN_S). Where the run moves past
        `where` first (a settle phase of no segment ends at once), the kill falls at once, and says
        so. The upload kill is the proxy's (_on_put); this only waits for it."""
        from campaign.backends.fargate.conductor import ENDED, Attached

        follow = Attached(self.s3, self.cfg, run_id)
        if where == "random":
            where = self.rng.choice(("search", "settle"))
        delay = after if after is not None else self.rng.uniform(0.0, RANDOM_WITHIN_S.get(where, 0.0))
        at: float | None = None
        said: list[str] = []  # this conductor's progress lines, for a kill that missed its moment
        while True:
            text = follow.new_lines()
            if text:
                self.say(text.rstrip("\n"))
                said += text.rstrip("\n").splitlines()
            record = follow.record()
            stage = str(record.get("stage", ""))
            if where == "upload" and self.killed.is_set():
                return stage
            if record.get("status") in ENDED:
                raise KillMissed(
                    f"the run {record['status']} before the {where} kill (its last stage: {stage!r}); "
                    "its progress since the last kill:\n" + "\n".join(said[-60:])
                )
            now = phase(stage)
            if where != "upload" and at is None and now >= PHASES[where]:
                at = time.monotonic()
                self.say(f"== {where}: reached ({stage!r}); the kill falls {delay:.1f} s later")
            if at is not None and (time.monotonic() - at >= delay or now > PHASES[where]):
                past = "" if now == PHASES[where] else f", the {where} having ended before the drawn {delay:.1f} s"
                _kill(self.launcher, self.conductor, self.say, f"{where} at {stage!r}{past}")
                return stage
            if self.launcher.describe([self.conductor])[self.conductor].stopped:
                raise KillMissed(
                    f"the conductor stopped by itself before the {where} kill:\n{self.launcher.log_tail(40)}"
                )
            time.sleep(0.2)

    def _verdicts(self, uri: str) -> dict[tuple[str, str], bytes]:
        """(fleet, label) -> the step.json of every search step whose verdict is under the run's prefix."""
        from core import cloud_contract as cc

        bucket, prefix = cc.split_s3_uri(uri)
        found = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/capacity/"):
            for obj in page.get("Contents", []):
                parts = obj["Key"][len(prefix) + 1 :].split("/")
                if len(parts) == 4 and parts[3] == "step.json":
                    found[(parts[1], parts[2])] = self.s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
        return found

    def check(self, o: Outcome) -> list[str]:
        from campaign.stages.run import report_from_run_dir

        problems = []
        resumed = o.record.get("resumed")
        if not resumed:
            problems.append("the run record does not say it resumed")
        if o.exit_code not in (0, 10, 11):
            problems.append(f"the resumed run ended with exit {o.exit_code}, not a decision")
        # No finished step ran twice: a search step whose verdict was under the run's prefix when
        # its conductor was killed has no master task started after that kill. (A settle phase
        # cut off keeps its finished rounds' segments and runs the round in flight again:
        # campaign.stages.resume.prepare.)
        masters = [
            (e["fleet"], e["step"].split("/", 1)[1], e["at"])
            for e in self.launcher.registry()
            if e["role"] == "master" and e["run_id"] == o.run_id and e["step"]
        ]
        for killed_at, finished in self.finished_at_kill:
            for fleet, label in sorted(finished):
                again = [
                    at
                    for f, step, at in masters
                    if (f, step) == (fleet, f"capacity/{fleet}/{label}") and at > killed_at
                ]
                if again:
                    problems.append(f"{fleet}/{label} had its verdict when the conductor was killed, yet ran again")
        if not any(finished for _, finished in self.finished_at_kill) and o.record.get("resumed", {}).get(
            "carried_over"
        ):
            problems.append("the run record carries steps over that no kill found finished")
        problems += self._check_carried_verdicts(o)
        # report --run-dir over the same files: the same report, field by field
        if o.exit_code in (0, 10, 11):
            problems += self._check_report(o, report_from_run_dir)
        return problems

    def _check_carried_verdicts(self, o: Outcome) -> list[str]:
        """Each step.json under the prefix at a kill that the run's resumes (resumes.json) carried
        over is byte for byte the one under it at the end; any other was set aside (interrupted/)."""
        from campaign.stages.resume import read_resumes

        resumes = read_resumes(o.run_dir)
        carried = {c for r in resumes for c in r.carried_over}
        set_aside = [a for r in resumes for a in r.set_aside]
        problems, same = [], set()
        for i, (_, verdicts) in enumerate(self.finished_at_kill, 1):
            for (fleet, label), body in sorted(verdicts.items()):
                step = f"{fleet}/{label}"
                if step not in carried:
                    if not any(
                        a.startswith((f"interrupted/capacity/{step}-", "interrupted/capacity-")) for a in set_aside
                    ):
                        problems.append(
                            f"{step} had its verdict at kill {i}, yet was neither carried over nor set aside"
                        )
                    continue
                final = o.run_dir / "capacity" / fleet / label / "step.json"
                now = final.read_bytes() if final.is_file() else None
                if now != body:
                    problems.append(
                        f"{step}/step.json: carried over from kill {i}, yet "
                        + (
                            "gone at the end"
                            if now is None
                            else f"not the same bytes at the end ({len(body)} then, {len(now)} now)"
                        )
                    )
                else:
                    same.add(step)
        o.carried_verdicts = len(same)
        return problems

    def _check_report(self, o: Outcome, report_from_run_dir: Callable[..., Any]) -> list[str]:
        """The resumed run's report.json says it resumed, and `report --run-dir` (as `report --run-id`
        runs it: the stack's Prometheus, signed for its region) over a copy of the run's directory
        gives it again, field by field."""
        from campaign.stages.resume import RESUMES_FILE

        problems = []
        ran = json.loads((o.run_dir / "report.json").read_text(encoding="utf-8"))
        kept = o.run_dir / RESUMES_FILE
        recorded = json.loads(kept.read_text(encoding="utf-8")) if kept.is_file() else None
        said = ran["provenance"].get("resume", {}).get("value")
        last = o.record.get("resumed", {}).get("at")
        if not said or said != recorded:
            problems.append(f"the resumed run's report says provenance.resume {said!r}; {RESUMES_FILE}: {recorded!r}")
        elif said[-1]["at"] != last:
            problems.append(f"the report's last resume is at {said[-1]['at']!r}, the run record's at {last!r}")
        copy = self.out / "report-run-dir" / o.run_id
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(o.run_dir, copy)
        for name in ("report.json", "report.md", "report.html"):
            (copy / name).unlink(missing_ok=True)
        url = self.cfg.prometheus_url or None
        report_from_run_dir(
            self.m, copy, copy, prometheus_url=url, prometheus_sigv4_region=self.cfg.region if url else None
        )
        again = json.loads((copy / "report.json").read_text(encoding="utf-8"))
        o.compared_fields, differences = report_differences(ran, again, VOLATILE)
        problems += [f"report --run-dir differs from the resumed run's report.json at {d}" for d in differences]
        return problems


def _kill_arg(text: str) -> str:
    where, _, after = text.partition("@")
    if where not in KILLS:
        raise argparse.ArgumentTypeError(f"{where!r}: not one of {', '.join(KILLS)}")
    if after:
        try:
            float(after)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: @ takes seconds") from None
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m testing.cloud_offline_resume", description=__doc__.split("\n\n", 1)[0] if __doc__ else None
    )
    ap.add_argument("manifest", nargs="?", default=str(EXAMPLE), help="campaign manifest (default: the example)")
    ap.add_argument(
        "--out", default="runs/cloud-offline-resume", help="where the run directory, task logs and cdk.out go"
    )
    ap.add_argument("--seed", type=int, default=None, help="the random kill's seed (default: a new one, printed)")
    ap.add_argument(
        "--kill",
        action="append",
        type=_kill_arg,
        metavar="WHERE[@S]",
        help=f"where to kill the conductor, one of {', '.join(KILLS)}, S seconds after reaching it (default: at "
        "random); repeatable: each resumed run in turn; default: random",
    )
    a = ap.parse_args(argv)
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server: a line per request otherwise
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 30)
    kills = a.kill or ["random"]
    t0 = time.monotonic()
    out = Path(a.out)
    path = offline_manifest(Path(a.manifest).resolve(), out, quick_search)
    print(
        f"manifest copied to {path} (loadgen.max_schedule_lag_p99_s {LAG_BOUND_S}, a coarser search); seed {seed}; kills {kills}"
    )
    with offline_aws(path, out) as aws:
        outcome = KillingRun(aws, path, out, seed, lambda line: print(line, flush=True)).run(kills)
    resumed = outcome.record.get("resumed", {})
    print(f"run {outcome.run_id}: {time.monotonic() - t0:.0f} s; killed: {'; '.join(outcome.kills)}")
    print(f"resumed at {resumed.get('at')!r}, carried over {resumed.get('carried_over')}; exit {outcome.exit_code}")
    print(
        f"report --run-dir: {outcome.compared_fields} field(s) of report.json compared; "
        f"{outcome.carried_verdicts} carried-over step.json file(s) byte-identical"
    )
    for problem in outcome.problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if outcome.problems else outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
