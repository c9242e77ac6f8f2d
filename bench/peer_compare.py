"""TTFT P95 of our load generator vs a peer tool (NVIDIA AIPerf), same load, same emulator.

    .venv/bin/python -m bench.peer_compare [--rate 3] [--seconds 20] [--input 128] [--output 64]
        [--fleet inf2] [--aiperf PATH/TO/aiperf]

One fixed request set (constant rate, fixed input/output lengths, the exact prompt texts our
PromptBuilder makes) is sent twice, each time to a fresh emulator of the same fleet: once by
our Locust replayer (loadgen.launch.run_fleet), once by `aiperf profile --fixed-schedule`
fed the same timestamps and the same prompt texts (mooncake_trace `text_input`). Printed side
by side, with each tool's P95 TTFT divided by the ground truth:

- our client TTFT (scheduled send -> first token) and AIPerf's (its own send -> first token),
  both as a P95 over per-request values computed here the same way, plus AIPerf's own P95;
- ground truth 1, the timing model: the emulator's step loop replayed in discrete time over
  the ideal schedule (exact for the model; the live run differs only by where arrivals land
  inside a step);
- ground truth 2, each run's own server-side `vllm:time_to_first_token_seconds` histogram:
  its exact mean (sum / count) and its bucket-interpolated P95 (coarse: bucket edges 40, 60,
  80, 100, 250 ms).

AIPerf is not in requirements.txt: it pulls ~1.2 GB of dependencies and pins
prometheus-client~=0.23 (we pin 0.26), so it goes into its own virtual environment:

    python3.11 -m venv /tmp/aiperf-venv
    /tmp/aiperf-venv/bin/pip install -r bench/requirements-peer.txt
    .venv/bin/python -m bench.peer_compare --aiperf /tmp/aiperf-venv/bin/aiperf

It runs offline: aiperf gets a local tokenizer directory written here (a WordLevel tokenizer.json
that counts like the emulator's word tokenizer) plus `--use-server-token-count`, so nothing is
fetched from a hub (aiperf's `--tokenizer builtin` would download tiktoken's o200k_base file).
AIPerf's TTFT runs from its actual send (request.start_perf_ns), so its own scheduling delay is
omitted; ours runs from the scheduled send (the 'from send' row removes our lag to compare).
Without aiperf the script says so, prints our figures and the ground truth, and exits 3. Prints figures only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from analysis.measure.histogram import histogram_quantile
from campaign.backends.local.fleets import start_emulator
from campaign.backends.local.processes import Supervisor
from core.manifest import load_manifest
from core.quantiles import interpolated_quantile

ROOT = Path(__file__).resolve().parent.parent

TTFT_METRIC = "vllm:time_to_first_token_seconds"


def p95(xs: list[float]) -> float:
    """Linear-interpolated P95 (numpy's default), used for every tool alike."""
    return interpolated_quantile(xs, 0.95, empty=math.nan)


# ---------------------------------------------------------------- ground truth: timing model


def simulate_ttft(offsets: list[float], prompt_tokens: int, max_tokens: int, timing: object) -> list[float]:
    """The emulator's own engine (runtime/emulator/simulate.py) in simulated time, arrivals
    exactly on schedule: what the server would do with no wake-up jitter and no loopback."""
    from runtime.emulator.simulate import replay
    from runtime.emulator.timing import TimingModel

    assert isinstance(timing, TimingModel)
    seqs = replay(timing, [(t, prompt_tokens, max_tokens) for t in sorted(offsets)])
    return [s.first_token_at - s.arrival for s in seqs if s.first_token_at is not None]


# ---------------------------------------------------------------- ground truth: /metrics


def scrape_ttft(url: str) -> tuple[list[tuple[float, float]], float, float]:
    """(cumulative buckets [(le, count)], sum, count) of the emulator's TTFT histogram."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    buckets: list[tuple[float, float]] = []
    total = count = 0.0
    for line in text.splitlines():
        if not line.startswith(TTFT_METRIC):
            continue
        name, value = line.rsplit(" ", 1)
        if name.startswith(TTFT_METRIC + "_bucket"):
            le = name.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((math.inf if le == "+Inf" else float(le), float(value)))
        elif name.startswith(TTFT_METRIC + "_sum"):
            total = float(value)
        elif name.startswith(TTFT_METRIC + "_count"):
            count = float(value)
    return sorted(buckets), total, count


def server_p95(buckets: list[tuple[float, float]]) -> float:
    """The server histogram's P95 as Prometheus computes it (analysis.measure.histogram); NaN when empty."""
    q = histogram_quantile(0.95, dict(buckets))
    return math.nan if q is None else q


# ---------------------------------------------------------------- the two tools


def run_ours(mpath: Path, fleet: str, url: str, out: Path) -> tuple[list[float], dict[str, float]]:
    from loadgen.launch import run_fleet
    from loadgen.recording import read_records

    s = run_fleet(mpath, fleet, url, out)
    recs = [r for r in read_records(sorted(out.glob("records-*.jsonl"))) if r.outcome == "ok" and r.ttft_s is not None]
    # TTFT from the actual send too, to compare like with like against AIPerf.
    from_send = [r.ttft_s - ((r.sent_s or r.scheduled_s) - r.scheduled_s) for r in recs]  # type: ignore[operator]
    extra = {
        "scheduled": float(s.scheduled),
        "ok": float(len(recs)),
        "lag_p99_ms": s.schedule_lag_p99_s * 1000,
        "p95_from_send": p95(from_send),
        "mean_from_send": sum(from_send) / max(1, len(from_send)),
    }
    return [r.ttft_s for r in recs], extra  # type: ignore[misc]


def write_word_tokenizer(d: Path, special_tokens: list[str]) -> Path:
    """A local Hugging Face tokenizer (WordLevel over whitespace-split words) matching the
    emulator's word tokenizer, so aiperf loads no tokenizer from a hub or the network (its
    `builtin` tokenizer fetches tiktoken's o200k_base file on first use)."""
    from core.tokenizer import VOCAB

    specials = ["[UNK]", *special_tokens]
    words = [*specials, *sorted(set(VOCAB) - set(specials))]
    d.mkdir(parents=True, exist_ok=True)
    added = [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, t in enumerate(specials)
    ]
    (d / "tokenizer.json").write_text(
        json.dumps(
            {
                "version": "1.0",
                "truncation": None,
                "padding": None,
                "added_tokens": added,
                "normalizer": None,
                "pre_tokenizer": {"type": "WhitespaceSplit"},
                "post_processor": None,
                "decoder": None,
                "model": {"type": "WordLevel", "vocab": {w: i for i, w in enumerate(words)}, "unk_token": "[UNK]"},
            }
        )
    )
    (d / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "model_max_length": 8192})
    )
    return d


def find_aiperf(explicit: str | None) -> str | None:
    for cand in (explicit, os.environ.get("AIPERF_BIN"), shutil.which("aiperf")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def aiperf_version(exe: str) -> str:
    py = Path(exe).with_name("python")
    try:
        return (
            subprocess.run(
                [str(py), "-c", "import importlib.metadata as m; print(m.version('aiperf'))"],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout.strip()
            or "?"
        )
    except OSError:
        return "?"


def run_aiperf(
    exe: str, model: str, url: str, trace: Path, tokenizer: Path, out: Path, timeout_s: float
) -> tuple[list[float], float | None, str]:
    cmd = [
        exe,
        "profile",
        "--model",
        model,
        "--url",
        url,
        "--endpoint-type",
        "chat",
        "--streaming",
        "--input-file",
        str(trace),
        "--custom-dataset-type",
        "mooncake_trace",
        "--fixed-schedule",
        "--tokenizer",
        str(tokenizer),
        "--use-server-token-count",
        "--extra-inputs",
        "ignore_eos:true",
        "temperature:0.0",
        "top_p:1.0",
        "--random-seed",
        "0",
        "--no-server-metrics",
        "--ui-type",
        "none",
        "--artifact-dir",
        str(out),
    ]
    out.mkdir(parents=True, exist_ok=True)
    # Not HF_HUB_OFFLINE: aiperf 0.13.0's offline branch looks a local tokenizer *directory* up
    # in the hub cache and fails; a local path loads without any network access anyway.
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    with (out / "aiperf.log").open("wb") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout_s, cwd=str(out))
    if rc != 0:
        tail = (out / "aiperf.log").read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"aiperf exited {rc}; log {out / 'aiperf.log'}:\n" + "\n".join(tail))
    ttfts: list[float] = []
    for p in out.rglob("profile_export.jsonl"):
        for line in p.read_text().splitlines():
            rec = json.loads(line)
            m = (rec.get("metrics") or {}).get("time_to_first_token")
            if m is None or (rec.get("error") or (rec.get("metadata") or {}).get("error")):
                continue
            v, unit = (m["value"], m.get("unit", "ms")) if isinstance(m, dict) else (m, "ms")
            ttfts.append(float(v) / (1000.0 if unit == "ms" else 1e9 if unit == "ns" else 1.0))
    own: float | None = None
    for p in out.rglob("profile_export_aiperf.json"):
        d = json.loads(p.read_text())
        t = d.get("time_to_first_token") or (d.get("records") or {}).get("time_to_first_token") or {}
        if "p95" in t:
            own = float(t["p95"]) / (1000.0 if t.get("unit", "ms") == "ms" else 1.0)
    return ttfts, own, " ".join(cmd)


# ---------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=3.0, help="requests per second, constant")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--input", type=int, default=128, help="prompt tokens (chat template included)")
    ap.add_argument("--output", type=int, default=64, help="output tokens (ignore_eos)")
    ap.add_argument("--fleet", default="inf2")
    ap.add_argument("--aiperf", help="path of the aiperf executable (else $AIPERF_BIN, else PATH)")
    a = ap.parse_args()

    from core.schedule import build_schedule
    from loadgen.prompts import PromptBuilder
    from runtime.emulator.timing import TimingModel

    tmp = Path(tempfile.mkdtemp(prefix="peer-compare-"))
    n = int(a.rate * a.seconds)
    trace = tmp / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"offset_s": i / a.rate, "input_tokens": a.input, "output_tokens": a.output}) + "\n"
            for i in range(n)
        )
    )
    d = yaml.safe_load((ROOT / "manifests" / "llama3-8b-inf2-vs-g6.yaml").read_text())
    d["workload"].update(
        trace={"path": str(trace), "format": "plain-jsonl"},
        window={"start_s": 0, "duration_s": a.seconds + 1},
        time_scale=1.0,
        rate_scale=1.0,
        warmup_s=0,
        request_class={"max_input_tokens": a.input, "max_output_tokens": a.output, "mode": "clip"},
    )
    d["loadgen"]["request_timeout_s"] = 60
    mpath = tmp / "bench.yaml"
    mpath.write_text(yaml.safe_dump(d))
    m = load_manifest(mpath)
    schedule = build_schedule(m)
    builder = PromptBuilder(m, "chat")
    peer_trace = tmp / "aiperf-trace.jsonl"
    with peer_trace.open("w") as fh:
        for r in schedule:
            pr = builder.build(r)
            assert pr.exact and pr.tokens == a.input, (r.request_id, pr.tokens)
            fh.write(
                json.dumps(
                    {"timestamp": round(r.offset_s * 1000), "text_input": pr.text, "output_length": r.output_tokens}
                )
                + "\n"
            )

    timing = TimingModel.for_fleet(m, m.fleet(a.fleet))
    model_ttft = simulate_ttft([r.offset_s for r in schedule], a.input, a.output, timing)
    padded = timing.padded(a.input)  # a Neuron fleet encodes the whole bucket
    idle = timing.step_s(padded, padded, 0) + timing.admission_delay_s
    exe = find_aiperf(a.aiperf)
    tok_dir = write_word_tokenizer(tmp / "word-tokenizer", list(m.tokenizer.special_tokens.values()))

    print(
        f"load: {len(schedule)} requests at {a.rate:g} req/s constant for {a.seconds:g} s, {a.input} in / {a.output} out, "
        f"fleet {a.fleet} ({m.fleet(a.fleet).instance_type}); TTFT on an idle engine {idle * 1000:.1f} ms",
        flush=True,
    )
    results: dict[str, dict[str, float]] = {}
    peer_cmd = ""
    peer_note = ""
    with Supervisor(tmp / "logs") as sup:
        url = start_emulator(sup, mpath, a.fleet, tmp, ["--no-check-files"])
        t0 = time.time()
        ours, extra = run_ours(mpath, a.fleet, url, tmp / "ours")
        b, s_, c = scrape_ttft(url)
        results["ours"] = {
            "p95": p95(ours),
            "mean": sum(ours) / max(1, len(ours)),
            "n": len(ours),
            "srv_p95": server_p95(b),
            "srv_mean": s_ / c if c else math.nan,
            "srv_n": c,
            **extra,
        }
        print(f"ours done in {time.time() - t0:.0f} s", flush=True)
        sup.stop_all()
        if exe is None:
            peer_note = (
                "aiperf not found: install it in its own venv (see this file's docstring and "
                "bench/requirements-peer.txt), then pass --aiperf PATH or set AIPERF_BIN"
            )
        else:
            (tmp / "peer").mkdir()
            # A fresh emulator of the same fleet, under its own Supervisor: reusing the name in
            # the same log dir would append to the old log and return the old port.
            t0 = time.time()
            try:
                with Supervisor(tmp / "peer" / "logs") as sup2:
                    url2 = start_emulator(sup2, mpath, a.fleet, tmp / "peer", ["--no-check-files"])
                    peer, own, peer_cmd = run_aiperf(
                        exe, m.model.repo, url2, peer_trace, tok_dir, tmp / "aiperf", a.seconds + 240
                    )
                    b, s_, c = scrape_ttft(url2)
                    results["aiperf"] = {
                        "p95": p95(peer),
                        "mean": sum(peer) / max(1, len(peer)),
                        "n": len(peer),
                        "own_p95": own if own is not None else math.nan,
                        "srv_p95": server_p95(b),
                        "srv_mean": s_ / c if c else math.nan,
                        "srv_n": c,
                    }
                    print(f"aiperf done in {time.time() - t0:.0f} s", flush=True)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                peer_note = f"aiperf failed: {exc}"

    gt = p95(model_ttft)
    print()
    print(
        f"ground truth (timing model, ideal schedule): TTFT P95 {gt * 1000:.1f} ms, mean {sum(model_ttft) / len(model_ttft) * 1000:.1f} ms, "
        f"{len(model_ttft)} requests"
    )
    hdr = f"{'tool':<22}{'ok/sched':>9}{'P95 ms':>9}{'/model':>8}{'mean ms':>9}{'srv P95*':>10}{'srv mean':>10}{'/srv P95':>10}"
    print(hdr)
    print("-" * len(hdr))
    rows: list[tuple[str, dict[str, float], float, float]] = []
    o = results["ours"]
    rows.append(("ours (from scheduled)", o, o["p95"], o["mean"]))
    rows.append(("ours (from send)", o, o["p95_from_send"], o["mean_from_send"]))
    if "aiperf" in results:
        rows.append(("aiperf (from send)", results["aiperf"], results["aiperf"]["p95"], results["aiperf"]["mean"]))
    for name, row, v, mean in rows:
        print(
            f"{name:<22}{int(row['n']):>4}/{len(schedule):<4}{v * 1000:>9.1f}{v / gt:>8.2f}{mean * 1000:>9.1f}"
            f"{row['srv_p95'] * 1000:>10.1f}{row['srv_mean'] * 1000:>10.1f}{v / row['srv_p95']:>10.2f}"
        )
    print("* srv = that run's own emulator /metrics histogram (P95 bucket-interpolated, mean exact = sum/count)")
    print(f"ours: schedule lag p99 {o['lag_p99_ms']:.2f} ms")
    if "aiperf" in results:
        own = results["aiperf"]["own_p95"]
        print(
            f"aiperf's own reported TTFT P95: {own * 1000:.1f} ms"
            if not math.isnan(own)
            else "aiperf's own P95: not found in its export"
        )
        print(f"peer: aiperf {aiperf_version(exe or '')}; command: {peer_cmd}")
    if peer_note:
        print(f"PEER NOT RUN: {peer_note}")
    print(f"artifacts in {tmp}")
    return 0 if "aiperf" in results else 3


if __name__ == "__main__":
    sys.exit(main())
