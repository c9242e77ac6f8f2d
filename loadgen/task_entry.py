"""Entry point of the load-generator image: stage this run's inputs from S3, check them, run Locust.

`python -m loadgen.task_entry --master|--worker [locust options]`, or `--gate` (the fleet's
readiness wait and quality gate, loadgen/gate_task.py, instead of Locust). The inputs are staged
and checked by loadgen/task_inputs.py: a task refuses to start (exit 3, nothing sent) on any
mismatch. Then Locust runs in this process, with the staged manifest: its main, as `python -m
locust` calls it. An exec of a fresh interpreter, as before, imported boto3 and the harness again
and read the manifest and trace again: tests/cloud/test_cloud_path.py's tasks took 175 CPU s
that way against 150 in process (2026-12-07).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from core import cloud_contract as cc
from core.manifest import load_manifest
from loadgen.launch import LOCUSTFILE, SETUP_FAILED
from loadgen.task_inputs import InputsRejected, discover_master, stage_inputs


def locust_argv(manifest_path: Path, args: Sequence[str]) -> list[str]:
    """Locust's command line (argv[0] its program name), as its main reads it from sys.argv."""
    return ["locust", "-f", str(LOCUSTFILE), "--manifest", str(manifest_path), *args]


def run_locust(argv: list[str]) -> int:
    """Locust's own main (`python -m locust`) on this argv, in this process; its exit status."""
    from locust.main import main as locust_main

    sys.argv = argv
    try:
        locust_main()  # type: ignore[no-untyped-call]  # Locust's main has no annotations
    except SystemExit as done:  # how Locust's main ends, a run's exit code in it
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or "--help" in args or "-h" in args:  # the image's default CMD: Locust's help, no inputs needed
        return run_locust(["locust", "-f", str(LOCUSTFILE), "--help"])
    import boto3
    from botocore.config import Config

    try:
        manifest_path = stage_inputs(os.environ, boto3.client("s3"))
    except InputsRejected as exc:
        # The same marker the launcher and the master's log use for a setup failure.
        print(f"loadgen task: setup failed, nothing was sent: {exc}", file=sys.stderr, flush=True)
        return SETUP_FAILED
    print(f"loadgen task: inputs of run {os.environ[cc.ENV_RUN_ID]} staged and checked ({manifest_path})", flush=True)
    if args == ["--gate"]:
        from loadgen import gate_task

        out = gate_task.run(load_manifest(manifest_path), os.environ, boto3.client("s3"))
        print(
            f"loadgen task: gate of fleet {out['fleet']}: ready {out['ready']} after {out['ready_after_s']:.0f} s ({out['seen']}); "
            f"gate {'not run' if out['gate'] is None else 'passed' if out['gate']['passed'] else 'FAILED'}",
            flush=True,
        )
        return 0
    if "--worker" in args and not os.environ.get(cc.ENV_MASTER_HOST):
        try:
            # DiscoverInstances is served at data-servicediscovery.<region>...: botocore prefixes the
            # host with "data-", except where an endpoint is given (AWS_ENDPOINT_URL: a stand-in
            # or a VPC endpoint), which "should not have their host prefix modified" (botocore
            # Config, inject_host_prefix).
            config = Config(inject_host_prefix=not os.environ.get("AWS_ENDPOINT_URL"))
            host, port = discover_master(os.environ, boto3.client("servicediscovery", config=config))
        except InputsRejected as exc:
            print(f"loadgen task: setup failed, nothing was sent: {exc}", file=sys.stderr, flush=True)
            return SETUP_FAILED
        os.environ[cc.ENV_MASTER_HOST], os.environ[cc.ENV_MASTER_PORT] = host, port
        print(f"loadgen task: master of this step at {host}:{port}", flush=True)
    return run_locust(locust_argv(manifest_path, args))


if __name__ == "__main__":
    if sys.argv[1:] != ["--gate"]:
        # Locust runs in this process (run_locust): gevent's monkey-patching (locust/__init__.py)
        # comes first, before boto3's sockets and SSL, as when `python -m locust` imports it. The
        # gate task runs no Locust and stays unpatched; so do the tests that call main.
        import locust  # noqa: F401
    sys.exit(main())
