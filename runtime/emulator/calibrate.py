"""How far the emulator is from published measurements: every row replayed in simulated time.

    python -m runtime.emulator.calibrate [--rows CSV] [--json]     # in sample: the committed fit vs every row
    python -m runtime.emulator.calibrate --loso [--json]           # out of sample: each configuration left out in turn
    python -m runtime.emulator.calibrate --loso source             # ... or each source (one published file) left out
    python -m runtime.emulator.calibrate --fit                     # refit data/calibration/efficiency.json

Each row of the CSV (data/calibration/published.csv by default; columns in its SOURCES.md) is a
measured configuration: instance, serving stack, TP, replicas, batch, prompt/output tokens and a
load (synchronous, N concurrent users, or R requests/s). The row's configuration is built as an
emulated server with its calibration group's fitted efficiencies and replayed through the
emulator's own engine (runtime/emulator/simulate.py); output tok/s, mean TTFT and mean ITL are
compared with the published figures.

`--fit` is physics with few free parameters, fitted on single-user rows only (rows under load
are never fitted: they are the test). Per vendor family (every stack on Inferentia2 shares them,
every stack on NVIDIA GPUs shares theirs): one bandwidth fraction and one per-step overhead
(ITL = bytes a decode step reads / (peak bandwidth x fraction) + overhead) and one compute
fraction (TTFT = prefill FLOPs / (peak FLOP/s x fraction) + overhead + request overhead); per
serving stack only the per-request host overhead. Each fraction is bounded by the published
range in PHYSICS (sources there) and, where the rows cannot tell two parameters apart (one TP
degree only), held near the middle of that range by a weak prior. `--loso` refits with this same
fit() on all rows but one configuration (or source) and predicts the rows left out: the
out-of-sample error, which the README quotes first and `--fit` stores with each group for
`campaign plan` to print. Rows marked `use=test` are never fitted: published measurements kept
unseen, reported apart. Each row is replayed as its load generator sent and averaged it (column
`client`, CLIENTS below): guidellm 0.1's 120 s benchmarks, llmperf's waves.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core import catalog
from core.errors import EXIT_BAD_INPUT, CampaignError
from core.manifest import ResolvedEfficiency
from core.roofline import Roofline
from core.scheduling import POLICIES, policy_for
from core.shipped import PACKAGES_DIR, shipped_path
from runtime.emulator.engine import Engine, EngineSeq
from runtime.emulator.simulate import Load, Sizes, replay, simulate
from runtime.emulator.timing import TimingModel

DEFAULT_ROWS = shipped_path("calibration/published.csv")
EFFICIENCY_FILE = catalog.CALIBRATION_FILE
METRICS = ("output_tok_s", "ttft_ms", "itl_ms")
REQUIRED = (
    "id",
    "source",
    "date",
    "instance_type",
    "serving_stack",
    "tensor_parallel",
    "replicas_per_instance",
    "max_num_seqs",
    "params_b",
    "weights_precision",
    "input_tokens",
    "output_tokens",
    "load_kind",
    "load_value",
    "output_tok_s",
    "ttft_ms",
    "itl_ms",
    "statistic",
)
# Optional columns: requests_per_s and request_latency_s (as published, or derived as SOURCES.md
# says) give the load a row really held; use = fit (default) or test (never fitted).
# Llama-3-8B's attention shape: every published row is a Llama-3/3.1-8B measurement. A row for
# another model needs these columns (optional: layers, kv_heads, head_dim).
LLAMA3_8B_SHAPE = {"layers": 32, "kv_heads": 8, "head_dim": 128}

LOAD_SHORTFALL = 0.8  # below this share of the stated load a row did not hold its load (Little's law)

# Which fitted group a stack's rows belong to. TGI on Neuron ran optimum-neuron v0.1.0's HLO backend,
# vLLM on Neuron its NxD backend (data/calibration/SOURCES.md), so they are fitted apart.
GROUP_OF_STACK = {
    "vllm-neuron": "neuron-nxd",
    "tgi-neuron": "neuron-hlo-tgi",
    "vllm": "nvidia-vllm",
    "vllm-v0": "nvidia-vllm",
    "tgi": "nvidia-tgi",
    "tensorrt-llm": "nvidia-tensorrt-llm",
}
USES = ("fit", "test")

# How a row's load generator sent its requests and averaged its figures (column `client`). Each
# protocol is replayed as the tool's code runs it, so a row is compared with what its tool
# measured, start-up and cut-off included, not with a server's steady state:
# - guidellm-0.1: guidellm v0.1.0 (neuralmagic/guidellm@v0.1.0, the `guidellm --data-type
#   emulated` CLI that optimum-neuron's performance.sh / benchmark.sh call). Every benchmark of its
#   sweep runs --max-seconds 120 (main.py default); nothing is sent at or after the end and a
#   request still running then is timed out and not counted (scheduler/base.py
#   _submit_task_coroutine: wait_for(timeout=end_time - now)). "throughput" sends requests at
#   once while fewer than GUIDELLM__MAX_CONCURRENCY - 1 are outstanding, polling every 0.1 s
#   (_run_async: `while (index + 1 - completed) >= max_concurrency: sleep(0.1)`); "constant"
#   sends at start + i / rate. Means over the completed requests; the request rate and token
#   throughput divide by the span from the first completed request's start to the last one's
#   end; ITL pools every token gap (core/result.py TextGenerationBenchmark).
# - llmperf-waves: ray-project/llmperf before #59 (f1d6bed, 2024-12-09), as the 2024 reports ran
#   it (token_benchmark_ray.py and src/llmperf/requests_launcher.py @e22c8303): N requests are
#   launched, then get_next_ready() waits on ActorPool.get_next_unordered() until every one of
#   them is back (#59's title: "subsequent requests cannot be sent until 'num_concurrent_requests'
#   requests have all finished"); waves of N until >= 100 (max_num_completed_requests) are
#   done; throughput and requests/min over the whole run; figures per request. Within a wave the
#   launches are LLMPERF_LAUNCH_S apart: that loop drew each prompt (tokenizing sonnet lines)
#   before launching it, until #54 (03872a4, 2024-06-18) moved it out of the loop.
# - steady (default): a server's steady state, the first tenth (at least one per user) dropped.
CLIENTS = ("steady", "guidellm-0.1", "llmperf-waves")
GUIDELLM_SECONDS = 120.0  # guidellm 0.1.0 --max-seconds default (main.py)
GUIDELLM_POLL_S = 0.1  # _run_async's sleep while the concurrency cap is reached
LLMPERF_REQUESTS = 100  # scripts/benchmark.py num_requests (ray-project/llmperf@85db0905)
# The client's time per launched request, from each llmperf file's own one-user row: 60 /
# requests per minute - mean request latency = 121 ms (A10G vLLM), 117 ms (NIM), 136 ms
# (inf2.xlarge TGI). The same figure from the 4-16-user rows, (run time / waves - latency) /
# (users - 1), is 126-185 ms, and 216-421 ms at 32-64 users, where the client shared the
# instance's 8 vCPUs with the server: not modelled, so those rows' loads are overstated.
LLMPERF_LAUNCH_S = 0.12


class RowError(CampaignError, ValueError):
    """A bad row of a measurements file: named by file, line and column; exit 2."""

    exit_code = EXIT_BAD_INPUT


@dataclass(frozen=True)
class Row:
    line: int
    id: str
    instance_type: str
    serving_stack: str
    tensor_parallel: int
    replicas: int
    max_num_seqs: int
    max_model_len: int
    buckets: tuple[int, ...]  # compiled context buckets (Neuron); empty: the stack's default
    params_b: float
    bytes_per_param: float
    kv_bytes_per_token: float
    input_tokens: int
    output_tokens: int
    input_spread: int
    output_spread: int
    distribution: str  # how lengths vary around the means: uniform +- spread, or normal (spread = stddev)
    load: Load
    published: dict[str, float]
    source: str = ""
    requests_per_s: float | None = None  # completed requests/s over the measurement
    request_latency_s: float | None = None  # mean end-to-end latency of a request
    use: str = "fit"
    statistic: str = "mean"  # of TTFT and ITL: mean or p50
    client: str = "steady"  # the load generator's protocol (CLIENTS)

    @property
    def vendor(self) -> str:
        return catalog.instance(self.instance_type).accelerator.vendor

    @property
    def group(self) -> str:
        return GROUP_OF_STACK[self.serving_stack]

    def in_flight(self) -> float:
        """Little's law on the published figures: requests in flight on average = completion
        rate x mean latency. From the published requests/s and request latency when the row has
        them; else completion rate = output tok/s / output tokens and latency = TTFT + (output
        tokens - 1) x ITL."""
        p = self.published
        rate = self.requests_per_s if self.requests_per_s is not None else p["output_tok_s"] / self.output_tokens
        latency = (
            self.request_latency_s
            if self.request_latency_s is not None
            else (p["ttft_ms"] + (self.output_tokens - 1) * p["itl_ms"]) / 1000
        )
        return rate * latency

    @property
    def held_load(self) -> Load:
        """The load to replay: the stated one, or, for a closed loop whose users held fewer
        requests in flight than their number, the same users each waiting the think time that
        explains the published rate: users / rate - latency (so the replay holds what the
        measurement held). Needs the published requests/s and latency."""
        base = self.load
        if (
            self.client != "steady"
            or base.kind == "rate"
            or self.requests_per_s is None
            or self.request_latency_s is None
        ):
            return base
        think = base.users / self.requests_per_s - self.request_latency_s
        return Load(base.kind, base.value, round(think, 3)) if think > 0.001 else base

    def load_shortfall(self) -> str | None:
        """Did the load generator hold the stated load? None when it did (or when the row is
        replayed at the load it held, or as its load generator sent it); else why no server model
        can match the row."""
        if self.client != "steady":
            return None
        if self.load.kind == "rate":
            rate = (
                self.requests_per_s
                if self.requests_per_s is not None
                else self.published["output_tok_s"] / self.output_tokens
            )
            share = rate / self.load.value
            return (
                f"Little's law: completed {rate:.2f} req/s of the {self.load.value:g} offered"
                if share < LOAD_SHORTFALL
                else None
            )
        held = self.in_flight()
        if held >= LOAD_SHORTFALL * self.load.users or self.held_load.think_s > 0:
            return None
        return f"Little's law: {held:.1f} requests in flight on average, not {self.load.users}"

    def held_note(self) -> str | None:
        """Said of a row replayed at the load it held rather than the one it stated."""
        think = self.held_load.think_s
        if think <= 0 or (self.load.users == 1 and think < 1):
            return None
        return (
            f"held {self.in_flight():.1f} of {self.load.users} users in flight: replayed with {think:.2f} s think time"
        )

    @property
    def source_key(self) -> str:
        """The published file a row comes from: its source up to the row or column it names."""
        return " ".join(self.source.split()[:2])

    @property
    def configuration(self) -> tuple[object, ...]:
        """What makes two rows the same server under the same request sizes, at different loads."""
        return (
            self.instance_type,
            self.serving_stack,
            self.tensor_parallel,
            self.replicas,
            self.max_num_seqs,
            self.max_model_len,
            self.buckets,
            self.input_tokens,
        )

    @property
    def single_user(self) -> bool:
        return self.load.users == 1 and self.load.kind != "rate"

    @property
    def fitted(self) -> bool:
        """Whether fit() may use the row (a single-user row not kept unseen)."""
        return self.single_user and self.use == "fit"

    def sizes(self, seed: int = 0) -> Sizes:
        """Request lengths as the row's load generator drew them (fixed seed: reproducible)."""
        rng = random.Random(f"{self.id}:{seed}")

        def draw(mean: int, spread: int) -> int:
            if not spread:
                return mean
            x = rng.randint(-spread, spread) if self.distribution == "uniform" else round(rng.gauss(0, spread))
            return max(1, mean + x)

        cache: dict[int, tuple[int, int]] = {}

        def size(i: int) -> tuple[int, int]:
            if i not in cache:
                cache[i] = (
                    min(draw(self.input_tokens, self.input_spread), self.max_model_len - 1),
                    draw(self.output_tokens, self.output_spread),
                )
                cache[i] = (cache[i][0], max(1, min(cache[i][1], self.max_model_len - cache[i][0])))
            return cache[i]

        return size

    def roofline(self) -> Roofline:
        params = self.params_b * 1e9
        return Roofline.of(
            self.instance_type, self.tensor_parallel, params * self.bytes_per_param, self.kv_bytes_per_token, params
        )

    def timing(self, eff: ResolvedEfficiency) -> TimingModel:
        return TimingModel.build(
            instance_type=self.instance_type,
            tensor_parallel=self.tensor_parallel,
            roofline=self.roofline(),
            efficiency=eff,
            stack=self.serving_stack,
            max_num_seqs=self.max_num_seqs,
            max_model_len=self.max_model_len,
            replicas=self.replicas,
            buckets=self.buckets,
        )


def _num(raw: dict[str, str], col: str, line: int, kind: type, positive: bool = True) -> Any:
    value = (raw.get(col) or "").strip()
    try:
        out = kind(value)
    except ValueError:
        raise RowError(
            f"line {line}: column {col!r}: {value!r} is not a {'number' if kind is float else 'whole number'}"
        ) from None
    if positive and out <= 0:
        raise RowError(f"line {line}: column {col!r}: must be > 0, got {value!r}")
    return out


def read_rows(path: Path) -> list[Row]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise RowError(f"{path}: {exc.strerror}") from None
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
    if missing:
        raise RowError(f"{path}: line 1: missing column(s) {', '.join(missing)}")
    rows: list[Row] = []
    seen: set[str] = set()
    for line, raw in enumerate(reader, start=2):
        if None in raw:
            raise RowError(f"{path}: line {line}: more fields than the header's {len(REQUIRED)}+ columns")
        try:
            rows.append(_row(raw, line))
        except RowError as exc:
            raise RowError(f"{path}: {exc}") from None
        if rows[-1].id in seen:
            raise RowError(f"{path}: line {line}: column 'id': {rows[-1].id!r} is used twice")
        seen.add(rows[-1].id)
    if not rows:
        raise RowError(f"{path}: no rows")
    return rows


def _row(raw: dict[str, str], line: int) -> Row:
    rid = (raw["id"] or "").strip()
    if not rid:
        raise RowError(f"line {line}: column 'id' is empty")
    it = raw["instance_type"].strip()
    try:
        vendor = catalog.instance(it).accelerator.vendor
    except catalog.UnknownInstanceType as exc:
        raise RowError(f"line {line}: column 'instance_type': {exc.args[0]}") from None
    stack = raw["serving_stack"].strip()
    if stack not in POLICIES:
        raise RowError(f"line {line}: column 'serving_stack': {stack!r} is not one of {', '.join(sorted(POLICIES))}")
    neuron_only = POLICIES[stack].kv_layout == "contiguous"
    if (neuron_only and vendor != "aws-neuron") or (not neuron_only and stack != "tgi" and vendor != "nvidia"):
        raise RowError(f"line {line}: column 'serving_stack': {stack} does not run on {it}")
    tp = _num(raw, "tensor_parallel", line, int)
    if tp not in catalog.instance(it).tp_degrees:
        raise RowError(
            f"line {line}: column 'tensor_parallel': {tp} is not a TP degree of {it} ({list(catalog.instance(it).tp_degrees)})"
        )
    replicas = _num(raw, "replicas_per_instance", line, int)
    if replicas * tp > catalog.instance(it).shards:
        shards = catalog.instance(it).shards
        raise RowError(
            f"line {line}: column 'replicas_per_instance': {replicas} x TP {tp} needs more than the {shards} devices/cores of {it}"
        )
    precision = raw["weights_precision"].strip()
    if precision not in catalog.BYTES_PER_PRECISION:
        raise RowError(
            f"line {line}: column 'weights_precision': {precision!r} is not one of {', '.join(catalog.BYTES_PER_PRECISION)}"
        )
    kind = raw["load_kind"].strip()
    if kind not in ("synchronous", "concurrency", "rate"):
        raise RowError(f"line {line}: column 'load_kind': {kind!r} is not synchronous, concurrency or rate")
    value = _num(raw, "load_value", line, float)
    if kind == "concurrency" and value != int(value):
        raise RowError(f"line {line}: column 'load_value': concurrency must be a whole number, got {value}")
    statistic = raw["statistic"].strip()
    if statistic not in ("mean", "p50"):
        raise RowError(f"line {line}: column 'statistic': {statistic!r} is not mean or p50")
    inp, out = _num(raw, "input_tokens", line, int), _num(raw, "output_tokens", line, int)
    shape = {k: (_num(raw, k, line, int) if (raw.get(k) or "").strip() else v) for k, v in LLAMA3_8B_SHAPE.items()}
    spreads = [
        _num(raw, c, line, int, positive=False) if (raw.get(c) or "").strip() else 0
        for c in ("input_tokens_spread", "output_tokens_spread")
    ]
    if min(spreads) < 0:
        raise RowError(f"line {line}: columns 'input_tokens_spread'/'output_tokens_spread' must be >= 0")
    distribution = (raw.get("length_distribution") or "uniform").strip()
    if distribution not in ("uniform", "normal"):
        raise RowError(f"line {line}: column 'length_distribution': {distribution!r} is not uniform or normal")
    max_len = _num(raw, "max_model_len", line, int) if (raw.get("max_model_len") or "").strip() else inp + out
    if max_len < inp + out:
        raise RowError(f"line {line}: column 'max_model_len': {max_len} < input + output tokens ({inp + out})")
    buckets = _buckets(raw, line, max_len)
    held = [
        _num(raw, c, line, float) if (raw.get(c) or "").strip() else None
        for c in ("requests_per_s", "request_latency_s")
    ]
    use = (raw.get("use") or "fit").strip()
    if use not in USES:
        raise RowError(f"line {line}: column 'use': {use!r} is not {' or '.join(USES)}")
    client = (raw.get("client") or "steady").strip()
    if client not in CLIENTS:
        raise RowError(f"line {line}: column 'client': {client!r} is not one of {', '.join(CLIENTS)}")
    return Row(
        line=line,
        id=rid,
        instance_type=it,
        serving_stack=stack,
        tensor_parallel=tp,
        replicas=replicas,
        max_num_seqs=_num(raw, "max_num_seqs", line, int),
        max_model_len=max_len,
        buckets=buckets,
        params_b=_num(raw, "params_b", line, float),
        bytes_per_param=catalog.BYTES_PER_PRECISION[precision],
        kv_bytes_per_token=2.0 * shape["layers"] * shape["kv_heads"] * shape["head_dim"] * 2,  # BF16 KV cache
        input_tokens=inp,
        output_tokens=out,
        input_spread=spreads[0],
        output_spread=spreads[1],
        distribution=distribution,
        load=Load(kind, value),  # type: ignore[arg-type]
        published={m: _num(raw, m, line, float) for m in METRICS},
        source=raw["source"].strip(),
        requests_per_s=held[0],
        request_latency_s=held[1],
        use=use,
        statistic=statistic,
        client=client,
    )


def _buckets(raw: dict[str, str], line: int, max_len: int) -> tuple[int, ...]:
    """Optional column 'buckets': the compiled context lengths, space-separated, ascending."""
    text = (raw.get("buckets") or "").strip()
    if not text:
        return ()
    try:
        out = tuple(int(x) for x in text.split())
    except ValueError:
        raise RowError(
            f"line {line}: column 'buckets': {text!r} is not a space-separated list of whole numbers"
        ) from None
    if list(out) != sorted(set(out)) or out[0] <= 0 or out[-1] < max_len:
        raise RowError(
            f"line {line}: column 'buckets': {text!r} must ascend, be > 0 and end at or above max_model_len {max_len}"
        )
    return out


# --- fitting ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Range:
    """A published range for one efficiency of one vendor family: the fit stays within it, and
    where the rows cannot pin the parameter down a weak prior holds it near the geometric middle."""

    low: float
    high: float
    sources: tuple[str, ...]

    @property
    def prior(self) -> float:
        return math.sqrt(self.low * self.high)


RETRIEVED = "retrieved 2026-12-04"
_ROOFLINE_RULE = (
    "https://www.open-source-ai.tech/glossary/model-bandwidth-utilization: 'Real systems land around 60 to 85 percent' of peak "
    f"bandwidth in decode, 'a rule of thumb rather than a published constant' ({RETRIEVED})"
)
_A100_MBU = (
    "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on: vLLM, Llama-3.1-8B-Instruct BF16 on one A100 40GB, batch-1 "
    f"decode 'roughly 77% of the GPU's memory-bandwidth ceiling' ({RETRIEVED})"
)
_NEURON_BS1 = (
    "huggingface/optimum-neuron@55ecce60 docs/source/benchmarks/inferentia-llama3.1-8b.mdx and docs/assets/benchmarks/"
    "inferentia-llama3.1-8b/latency.png, ttft.png (2025-06-04): Llama-3.1-8B on inf2.48xlarge, TP=8, sequence length 4096, "
    "batch 1: 10-11 ms per token and 0.3 s to the first token for 512-1792 prompt tokens. One decode step streams the "
    "16.06 GB of weights plus 4,096 tokens of KV over 8 x 410 GiB/s in 4.7 ms at full bandwidth: the fraction is at "
    "least 4.7 / 10.5 = 0.45; one 4,096-token context pass is 65.8 TFLOP, 87 ms at the 760 TFLOPS of 8 NeuronCores: "
    "at least 87 / 300 = 0.29 of it"
)
_PALM_MFU = (
    "Pope et al., 'Efficiently Scaling Transformer Inference', arXiv:2211.05102 (2022): 76% model FLOPs utilization "
    "during large-batch prefill of PaLM 540B on TPU v4, the highest published prefill figure found; an upper bound here"
)
_FLOOR = "lower bound 0.2: no published floor; it keeps a fit on few rows off zero"
PHYSICS: dict[str, dict[str, Range]] = {
    "aws-neuron": {
        "bandwidth": Range(0.45, 0.85, (_NEURON_BS1, "upper bound 0.85: " + _ROOFLINE_RULE)),
        "compute": Range(0.29, 0.76, (_NEURON_BS1, _PALM_MFU)),
    },
    "nvidia": {
        "bandwidth": Range(0.60, 0.85, (_ROOFLINE_RULE, _A100_MBU)),
        "compute": Range(0.20, 0.76, (_FLOOR, _PALM_MFU)),
    },
}
STEP_OVERHEAD_MS = (0.0, 15.0)  # per decode/prefill step, host side (scheduling, sampling); bounds only
REQUEST_OVERHEAD_MS = (0.0, 500.0)  # per request, before the scheduler sees it (HTTP, tokenization, routing)
LOG_SIGMA = 0.1  # a row's error, in log units (about 10%), that weighs as much as ...
PRIOR_SIGMA = 0.5  # ... this distance of a fraction from its prior (a factor of 1.65)
GRID_STEP = 0.0025


def _grid(r: Range) -> list[float]:
    n = round((r.high - r.low) / GRID_STEP)
    return [r.low + i * (r.high - r.low) / n for i in range(n + 1)]


def _prior_cost(value: float, r: Range) -> float:
    return ((math.log(value) - math.log(r.prior)) / PRIOR_SIGMA) ** 2


def _log_cost(predicted: float, published: float) -> float:
    return (math.log(max(predicted, 1e-9) / published) / LOG_SIGMA) ** 2


def _clip(x: float, bounds: tuple[float, float]) -> float:
    return min(max(x, bounds[0]), bounds[1])


def _offset(residuals: list[tuple[float, float]], bounds: tuple[float, float]) -> float:
    """The constant that best fits (residual, published) pairs in relative terms, within bounds
    (the fit's cost is in log terms; for the errors that matter the two agree)."""
    w = [1 / y**2 for _, y in residuals]
    return _clip(sum(wi * r for wi, (r, _) in zip(w, residuals, strict=True)) / sum(w), bounds)


_UNIT = ResolvedEfficiency(1.0, 1.0, 0.0, 0.0, "probe")
_NO_MEMORY = ResolvedEfficiency(1e12, 1.0, 0.0, 0.0, "probe")
_NO_COMPUTE = ResolvedEfficiency(1.0, 1e12, 0.0, 0.0, "probe")


def decode_read_s(r: Row) -> float:
    """One single-user decode step's memory time at full bandwidth: weights plus the KV the
    stack's decode step reads at mid-generation (every compiled slot on a static-shape engine)."""
    return r.roofline().memory_s(r.timing(_UNIT).decode_kv_tokens([r.input_tokens + r.output_tokens // 2]), 1.0)


def prefill_parts_s(r: Row) -> tuple[float, float]:
    """(memory, compute) seconds of the row's mean prompt's prefill step at full efficiency, as
    the engine plans it (padded to the compiled bucket on Neuron)."""

    def step(eff: ResolvedEfficiency) -> float:
        engine = Engine(r.timing(eff))
        engine.submit(EngineSeq(r.input_tokens, r.output_tokens, 0.0))
        planned = engine.plan(0.0)
        assert planned is not None
        return planned.duration

    return step(_NO_COMPUTE), step(_NO_MEMORY)


def _fit_vendor(vendor: str, rs: list[Row]) -> dict[str, Any]:
    """Bandwidth fraction and step overhead from the rows' ITL, then the compute fraction and each
    stack's request overhead from their TTFT: bounded, least squares in log error, plus the prior."""
    ranges = PHYSICS[vendor]
    dec = [(decode_read_s(r), r.published["itl_ms"] / 1000) for r in rs]
    best: tuple[float, float, float] | None = None
    for e in _grid(ranges["bandwidth"]):
        s = _offset([(y - x / e, y) for x, y in dec], (STEP_OVERHEAD_MS[0] / 1000, STEP_OVERHEAD_MS[1] / 1000))
        cost = sum(_log_cost(x / e + s, y) for x, y in dec) + _prior_cost(e, ranges["bandwidth"])
        if best is None or cost < best[0]:
            best = (cost, e, s)
    assert best is not None
    _, e_bw, step = best
    parts = [(prefill_parts_s(r), r.published["ttft_ms"] / 1000, r.group) for r in rs]
    groups = sorted({g for _, _, g in parts})
    fit_c: tuple[float, float, dict[str, float]] | None = None
    req_bounds = (REQUEST_OVERHEAD_MS[0] / 1000, REQUEST_OVERHEAD_MS[1] / 1000)
    for e_c in _grid(ranges["compute"]):
        steps = [(max(m / e_bw, c / e_c) + step, y, g) for (m, c), y, g in parts]
        req = {g: _offset([(y - t, y) for t, y, gg in steps if gg == g], req_bounds) for g in groups}
        cost = sum(_log_cost(t + req[g], y) for t, y, g in steps) + _prior_cost(e_c, ranges["compute"])
        if fit_c is None or cost < fit_c[0]:
            fit_c = (cost, e_c, req)
    assert fit_c is not None
    _, e_c, req = fit_c
    at_bound = [
        name for name, v in (("bandwidth", e_bw), ("compute", e_c)) if v in (ranges[name].low, ranges[name].high)
    ]
    return {
        "bandwidth": round(e_bw, 4),
        "compute": round(e_c, 4),
        "step_overhead_ms": round(step * 1000, 2),
        "request_overhead_ms": {g: round(v * 1000, 1) for g, v in req.items()},
        "rows": [r.id for r in rs],
        "accelerators": sorted({catalog.instance(r.instance_type).accelerator.name for r in rs}),
        "at_bound": at_bound,
    }


METHOD = (
    "runtime.emulator.calibrate --fit: per vendor family one bandwidth fraction and one step overhead (ITL of its single-user rows) "
    "and one compute fraction (their TTFT), each within the published range in PHYSICS; per stack one request overhead"
)


def fit(rows: list[Row]) -> dict[str, Any]:
    """Calibration groups from the single-user rows marked use=fit: every group of a vendor family
    carries the family's fractions and step overhead and its own request overhead."""
    by_vendor: dict[str, list[Row]] = {}
    for r in rows:
        if r.fitted:
            by_vendor.setdefault(r.vendor, []).append(r)
    out: dict[str, Any] = {}
    for vendor, rs in sorted(by_vendor.items()):
        v = _fit_vendor(vendor, rs)
        for name in sorted({r.group for r in rs}):
            out[name] = {
                "vendor": vendor,
                "stacks": sorted({r.serving_stack for r in rs if r.group == name}),
                "bandwidth": v["bandwidth"],
                "compute": v["compute"],
                "step_overhead_ms": v["step_overhead_ms"],
                "request_overhead_ms": v["request_overhead_ms"][name],
                "rows": v["rows"],
                "accelerators": v["accelerators"],
                "own_rows": [r.id for r in rs if r.group == name],
                "at_bound": v["at_bound"],
                "method": METHOD,
            }
    return out


def ttft_below_synchronous(rows: list[Row]) -> dict[str, str]:
    """Rows under load whose TTFT is below the same configuration's single-user TTFT. Load only
    adds queueing and interruptions to a request's first token, so such a row says part of the
    single-user TTFT is not the server's (client or warm-up time): no server model matches both."""
    sync: dict[tuple[object, ...], float] = {}
    for r in rows:
        if r.single_user:
            sync[r.configuration] = min(sync.get(r.configuration, float("inf")), r.published["ttft_ms"])
    out: dict[str, str] = {}
    for r in rows:
        base = sync.get(r.configuration)
        if not r.single_user and base is not None and r.published["ttft_ms"] < base:
            out[r.id] = f"TTFT under load {r.published['ttft_ms']:.0f} ms is below its single-user TTFT {base:.0f} ms"
    return out


# --- comparing --------------------------------------------------------------------------------


def efficiency_of(row: Row, groups: dict[str, Any]) -> ResolvedEfficiency:
    """The row's group; for a stack no fitted row covers, its vendor family's fractions and step
    overhead with the median request overhead of the family's other stacks; for a family with no
    fitted row at all, the middle of each published range and no overheads."""
    g = groups.get(row.group)
    if g is not None:
        return ResolvedEfficiency(
            g["bandwidth"], g["compute"], g["step_overhead_ms"], g["request_overhead_ms"], row.group
        )
    kin = [x for x in groups.values() if x["vendor"] == row.vendor]
    if kin:
        req = statistics.median(x["request_overhead_ms"] for x in kin)
        return ResolvedEfficiency(
            kin[0]["bandwidth"], kin[0]["compute"], kin[0]["step_overhead_ms"], req, f"{row.vendor} family"
        )
    ranges = PHYSICS[row.vendor]
    return ResolvedEfficiency(ranges["bandwidth"].prior, ranges["compute"].prior, 0.0, 0.0, f"{row.vendor} prior")


@dataclass(frozen=True)
class ClientRun:
    """What a row's load generator counted: its requests on one clock, the span it divided
    tokens by, and whether its ITL pools every token gap (guidellm) or averages per request."""

    counted: list[EngineSeq]
    span_s: float
    pooled_itl: bool


def guidellm_run(r: Row, timing: TimingModel) -> ClientRun:
    """guidellm 0.1.0's benchmark of the row's load (CLIENTS): 120 s, the requests done by then."""
    sizes = r.sizes()
    end = GUIDELLM_SECONDS
    if r.load.kind == "rate":
        n = int(end * r.load.value) + 1
        seqs = replay(timing, [(i / r.load.value, *sizes(i)) for i in range(n)], until=end)
    else:
        # at most max_concurrency - 1 outstanding; a freed slot is refilled at the next 0.1 s poll
        users = max(1, r.load.users - 1) if r.load.kind == "concurrency" else 1
        poll = GUIDELLM_POLL_S / 2 if users > 1 else 0.0
        seqs = replay(
            timing, [(0.0, *sizes(i)) for i in range(users)], closed_loop=(10**9, sizes), think_s=poll, until=end
        )
    done = [s for s in seqs if s.finish_reason is not None]
    if not done:
        return ClientRun([], 0.0, True)
    first = min(done, key=lambda s: s.last_token_at or 0.0)  # results[0]: the first request to complete
    return ClientRun(done, max(s.last_token_at or 0.0 for s in done) - first.arrival, True)


def llmperf_waves_run(r: Row, timing: TimingModel) -> ClientRun:
    """llmperf before #59 (CLIENTS): waves of N requests launched LLMPERF_LAUNCH_S apart, the next
    wave after the last of this one is back."""
    sizes = r.sizes()
    n = r.load.users
    done: list[EngineSeq] = []
    clock = 0.0
    for w in range(math.ceil(LLMPERF_REQUESTS / n)):
        wave = replay(timing, [(i * LLMPERF_LAUNCH_S, *sizes(w * n + i)) for i in range(n)])
        for s in wave:  # onto the run's clock
            s.arrival += clock
            s.first_token_at = None if s.first_token_at is None else s.first_token_at + clock
            s.last_token_at = None if s.last_token_at is None else s.last_token_at + clock
        clock = max(s.last_token_at or clock for s in wave) + LLMPERF_LAUNCH_S
        done += wave
    return ClientRun(done, clock, False)


def _stat(r: Row, xs: list[float]) -> float:
    return statistics.median(xs) if r.statistic == "p50" else statistics.fmean(xs)


def _figures(r: Row, run: ClientRun) -> dict[str, float]:
    done = [s for s in run.counted if s.first_token_at is not None and s.last_token_at is not None]
    if not done or run.span_s <= 0:
        return {"output_tok_s": 0.0, "ttft_ms": GUIDELLM_SECONDS * 1000, "itl_ms": 0.0}
    span = [(s.last_token_at - s.first_token_at, s.generated - 1) for s in done if s.generated > 1]  # type: ignore[operator]
    itl = (
        sum(t for t, _ in span) / max(1, sum(g for _, g in span))
        if run.pooled_itl
        else _stat(r, [t / g for t, g in span] or [0.0])
    )
    return {
        "output_tok_s": sum(s.generated for s in done) / run.span_s,
        "ttft_ms": _stat(r, [s.first_token_at - s.arrival for s in done]) * 1000,  # type: ignore[operator]
        "itl_ms": itl * 1000,
    }


def predict(row: Row, groups: dict[str, Any]) -> dict[str, float]:
    policy_for(row.serving_stack, row.vendor)
    timing = row.timing(efficiency_of(row, groups))
    if row.client == "guidellm-0.1":
        return _figures(row, guidellm_run(row, timing))
    if row.client == "llmperf-waves":
        return _figures(row, llmperf_waves_run(row, timing))
    summary, _ = simulate(timing, row.held_load, row.sizes())
    return {"output_tok_s": summary.output_tok_s, "ttft_ms": summary.ttft_s * 1000, "itl_ms": summary.itl_s * 1000}


def _agg(fn: Any, sel: list[dict[str, Any]]) -> dict[str, float]:
    return {
        m: round(fn([abs(x["rel_error"]) for x in sel if x["metric"] == m]), 4)
        for m in METRICS
        if any(x["metric"] == m for x in sel)
    }


def _band(sel: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "median_abs_rel_error": _agg(statistics.median, sel),
        "max_abs_rel_error": _agg(max, sel),
        "rows": len({x["id"] for x in sel}),
    }


def report(rows: list[Row], predicted: dict[str, dict[str, float]], fitted: set[str]) -> dict[str, Any]:
    """Per row and metric the published and predicted figures; the median and maximum absolute
    relative error over all rows, per vendor family, over the rows a server model can match and
    over the rows kept unseen (use=test)."""
    results: list[dict[str, Any]] = []
    unmatchable = {r.id: why for r in rows if (why := r.load_shortfall()) is not None}
    for rid, why in ttft_below_synchronous(rows).items():
        unmatchable[rid] = f"{unmatchable[rid]}; {why}" if rid in unmatchable else why
    for r in rows:
        for metric in METRICS:
            pub, pred = r.published[metric], predicted[r.id][metric]
            results.append(
                {
                    "id": r.id,
                    "vendor": r.vendor,
                    "use": r.use,
                    "metric": metric,
                    "published": pub,
                    "predicted": round(pred, 3),
                    "rel_error": round((pred - pub) / pub, 4),
                }
            )
    matchable = [x for x in results if x["id"] not in unmatchable]
    return {
        "rows": [{k: x[k] for k in ("id", "metric", "published", "predicted", "rel_error")} for x in results],
        "median_abs_rel_error": _agg(statistics.median, results),
        "max_abs_rel_error": _agg(max, results),
        "by_vendor": {
            v: _band([x for x in results if x["vendor"] == v]) for v in sorted({x["vendor"] for x in results})
        },
        "fitted_rows": sorted(fitted),
        "not_matchable": unmatchable,
        "held_load": {r.id: note for r in rows if (note := r.held_note()) is not None},
        "clients": {c: [r.id for r in rows if r.client == c] for c in CLIENTS if any(r.client == c for r in rows)},
        "matchable_rows": _band(matchable),
        "unseen_rows": _band([x for x in results if x["use"] == "test"]),
        "unseen": sorted(r.id for r in rows if r.use == "test"),
    }


def compare(rows: list[Row], groups: dict[str, Any]) -> dict[str, Any]:
    """In sample: every row against one set of groups (the committed fit, or one fitted here)."""
    fitted = {rid for g in groups.values() for rid in g.get("rows", ())}
    return report(rows, {r.id: predict(r, groups) for r in rows}, fitted)


HOLDOUTS = ("configuration", "source")


def holdout_key(row: Row, by: str) -> str:
    if by == "configuration":
        return (
            f"{row.instance_type} {row.serving_stack} TP={row.tensor_parallel} x{row.replicas} batch {row.max_num_seqs}"
        )
    if by == "source":
        return row.source_key or row.id
    raise ValueError(f"holdout {by!r} is not one of {', '.join(HOLDOUTS)}")


def folds(rows: list[Row], by: str = "configuration") -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for r in rows:
        out.setdefault(holdout_key(r, by), []).append(r)
    return out


def loso(rows: list[Row], by: str = "configuration") -> dict[str, Any]:
    """Out of sample: for each configuration (or source), fit() on every other row and predict
    the ones left out; rows kept unseen (use=test) are predicted by the fit on all rows, which
    never sees them either. Same shape as compare(), plus the folds and what each fold's fit was."""
    predicted: dict[str, dict[str, float]] = {}
    fold_fits: dict[str, dict[str, Any]] = {}
    full = fit(rows)
    for key, held in folds(rows, by).items():
        train = [r for r in rows if holdout_key(r, by) != key]
        groups = fit(train)
        fold_fits[key] = {
            "rows": [r.id for r in held],
            "groups": {
                g: {k: v[k] for k in ("bandwidth", "compute", "step_overhead_ms", "request_overhead_ms")}
                for g, v in groups.items()
            },
        }
        for r in held:
            predicted[r.id] = predict(r, groups if r.use == "fit" else full)
    out = report(rows, predicted, set())
    out["holdout"] = by
    out["folds"] = fold_fits
    return out


def out_of_sample_bands(report_: dict[str, Any], groups: dict[str, Any]) -> dict[str, Any]:
    """Per group, the out-of-sample band of its vendor family's rows, as efficiency.json stores it."""
    return {
        name: dict(report_["by_vendor"][g["vendor"]], holdout=report_["holdout"])
        for name, g in groups.items()
        if g["vendor"] in report_["by_vendor"]
    }


def render(report_: dict[str, Any], elapsed: float) -> str:
    out_of_sample = "holdout" in report_
    lines = [f"{'row':28} {'metric':13} {'published':>10} {'predicted':>10} {'error':>8}"]
    fitted, unseen = set(report_["fitted_rows"]), set(report_["unseen"])
    for x in report_["rows"]:
        mark = "  (fit)" if x["id"] in fitted else "  (unseen)" if x["id"] in unseen else ""
        mark += "  (not matchable)" if x["id"] in report_["not_matchable"] else ""
        lines.append(
            f"{x['id']:28} {x['metric']:13} {x['published']:10.1f} {x['predicted']:10.1f} {x['rel_error'] * 100:+7.1f}%{mark}"
        )
    lines.append("")
    scopes = [("all rows", report_), *report_["by_vendor"].items(), ("matchable", report_["matchable_rows"])]
    if report_["unseen_rows"]["rows"]:
        scopes.append(("unseen", report_["unseen_rows"]))
    for scope, agg in scopes:
        med, worst = agg["median_abs_rel_error"], agg["max_abs_rel_error"]
        lines.append(
            f"{scope:12} " + "  ".join(f"{m}: median {med[m] * 100:.1f}% max {worst[m] * 100:.1f}%" for m in METRICS)
        )
    lines.append(
        "replayed as their load generator ran them (column client): "
        + ", ".join(f"{c} {len(ids)} rows" for c, ids in report_["clients"].items())
    )
    if report_["held_load"]:
        lines.append("")
        lines.append("rows replayed at the load they held (Little's law on their published requests/s and latency):")
        lines += [f"  {rid}: {why}" for rid, why in report_["held_load"].items()]
    if report_["not_matchable"]:
        lines.append("")
        lines.append("rows no server model can match, by their own published figures:")
        lines += [f"  {rid}: {why}" for rid, why in report_["not_matchable"].items()]
    if out_of_sample:
        lines.append(
            f"out of sample: each {report_['holdout']} left out of the fit in turn ({len(report_['folds'])} folds); "
            f"unseen rows (use=test) are never fitted. {elapsed:.1f} s"
        )
    else:
        lines.append(
            f"in sample: (fit) rows were used to fit the efficiencies; `--loso` gives the out-of-sample error. {elapsed:.1f} s"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m runtime.emulator.calibrate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rows", type=Path, default=DEFAULT_ROWS, help="CSV of published rows (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument(
        "--fit",
        action="store_true",
        help=f"fit the efficiencies on the rows and write {EFFICIENCY_FILE.relative_to(PACKAGES_DIR)}",
    )
    p.add_argument(
        "--loso",
        nargs="?",
        const="configuration",
        choices=HOLDOUTS,
        help="out of sample: leave each configuration (default) or source out of the fit in turn and predict it",
    )
    p.add_argument(
        "--efficiency",
        type=Path,
        default=EFFICIENCY_FILE,
        help="fitted efficiencies to compare with (default: %(default)s)",
    )
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    try:
        rows = read_rows(a.rows)
        if a.fit:
            groups = fit(rows)
            oos = loso(rows)
            for name, band in out_of_sample_bands(oos, groups).items():
                groups[name]["out_of_sample"] = band
            src = a.rows.resolve()
            name = str(src.relative_to(PACKAGES_DIR)) if src.is_relative_to(PACKAGES_DIR) else src.name
            physics = {
                v: {
                    k: {"low": r.low, "high": r.high, "prior": round(r.prior, 4), "sources": list(r.sources)}
                    for k, r in rs.items()
                }
                for v, rs in PHYSICS.items()
            }
            a.efficiency.write_text(json.dumps({"source": name, "physics": physics, "groups": groups}, indent=2) + "\n")
            print(f"wrote {a.efficiency}")
        if a.loso:
            out = loso(rows, a.loso)
        else:
            groups = (
                json.loads(a.efficiency.read_text())["groups"] if a.efficiency.is_file() and not a.fit else fit(rows)
            )
            out = compare(rows, groups)
    except RowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=2) if a.json else render(out, time.perf_counter() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
