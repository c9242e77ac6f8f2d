"""python -m runtime.emulator --manifest PATH --fleet NAME [--instances N] [...]: one emulated
instance of the fleet, or N behind one port as the cloud's NLB spreads requests over them."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from aiohttp import web

from core.manifest import ManifestError, load_manifest
from runtime.emulator.app import create_app
from runtime.emulator.config import EmulatorConfig, FaultConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m runtime.emulator", description=__doc__)
    p.add_argument("--manifest", required=True, type=Path)
    p.add_argument("--fleet", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 binds a free port")
    p.add_argument("--port-file", type=Path, help="write the bound port here once ready")
    p.add_argument(
        "--instances",
        type=int,
        default=1,
        help="instances served behind the port, each with its own replicas (default 1)",
    )
    p.add_argument("--error-rate", type=float, default=0.0)
    p.add_argument("--stall-rate", type=float, default=0.0)
    p.add_argument("--stall-s", type=float, default=0.0)
    p.add_argument("--truncate-rate", type=float, default=0.0)
    p.add_argument("--reset-rate", type=float, default=0.0)
    p.add_argument("--slow-start-s", type=float, default=0.0, help="delay every request's first token by S")
    p.add_argument("--slow-start-rate", type=float, default=1.0, help="share of requests --slow-start-s applies to")
    p.add_argument("--fault-seed", type=int, default=0)
    p.add_argument(
        "--served-model-name",
        help="the model name requests must use, as vLLM's flag (default: the id the fleet's stack serves; "
        "trtllm-serve: the weights directory's name)",
    )
    p.add_argument("--no-check-files", action="store_true", help="skip the trace/tokenizer file checks")
    return p.parse_args(argv)


async def serve(cfg: EmulatorConfig, host: str, port: int, port_file: Path | None) -> None:
    runner = web.AppRunner(create_app(cfg), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    await site.start()
    server = site._server
    assert server is not None and server.sockets  # type: ignore[attr-defined]
    bound = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (
        signal.SIGTERM,
        signal.SIGINT,
    ):  # before announcing readiness: a SIGTERM right after it still shuts down cleanly
        loop.add_signal_handler(sig, stop.set)
    if port_file is not None:
        tmp = port_file.with_suffix(port_file.suffix + ".tmp")
        tmp.write_text(f"{bound}\n")
        tmp.replace(port_file)  # atomic: a reader never sees a half-written port
    print(f"listening on http://{host}:{bound}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        manifest = load_manifest(a.manifest, check_files=not a.no_check_files)
        faults = FaultConfig(
            error_rate=a.error_rate,
            stall_rate=a.stall_rate,
            stall_s=a.stall_s,
            truncate_rate=a.truncate_rate,
            reset_rate=a.reset_rate,
            slow_start_s=a.slow_start_s,
            slow_start_rate=a.slow_start_rate,
            fault_seed=a.fault_seed,
        )
        cfg = EmulatorConfig(manifest, manifest.fleet(a.fleet), faults, a.served_model_name, a.instances)
    except (ManifestError, KeyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(cfg, a.host, a.port, a.port_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
