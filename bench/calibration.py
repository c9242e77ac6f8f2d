"""How far the emulator is from published measurements: every row replayed in simulated time.

    python bench/calibration.py [--rows CSV] [--json]     # predicted vs published, per row and metric
    python bench/calibration.py --fit                     # refit data/calibration/efficiency.json

Each row of the CSV (data/calibration/published.csv by default; columns in its SOURCES.md) is a
measured configuration: instance, serving stack, TP, replicas, batch, prompt/output tokens and a
load (synchronous, N concurrent users, or R requests/s). The row's configuration is built as an
emulated server with its calibration group's fitted efficiencies and replayed through the
emulator's own engine (runtime/emulator/simulate.py); output tok/s, mean TTFT and mean ITL are
compared with the published figures.

`--fit` derives each group's efficiencies from its single-user rows only (synchronous or
concurrency 1): ITL = weights / (bandwidth x e_bw) + step overhead, by least squares over the
rows' different bandwidths; TTFT = 2 x params x padded prompt / (FLOP/s x e_c) + overheads,
likewise. Rows under load are never fitted: they are the test.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core import catalog  # noqa: E402
from core.manifest import ResolvedEfficiency  # noqa: E402
from core.roofline import Roofline  # noqa: E402
from core.scheduling import POLICIES, policy_for  # noqa: E402
from runtime.emulator.simulate import Load, Sizes, simulate  # noqa: E402
from runtime.emulator.timing import TimingModel  # noqa: E402

DEFAULT_ROWS = ROOT / "data" / "calibration" / "published.csv"
EFFICIENCY_FILE = catalog.CALIBRATION_FILE
METRICS = ("output_tok_s", "ttft_ms", "itl_ms")
REQUIRED = ("id", "source", "date", "instance_type", "serving_stack", "tensor_parallel", "replicas_per_instance", "max_num_seqs",
            "params_b", "weights_precision", "input_tokens", "output_tokens", "load_kind", "load_value", "output_tok_s",
            "ttft_ms", "itl_ms", "statistic")  # fmt: skip
# Llama-3-8B's attention shape: every published row is a Llama-3/3.1-8B measurement. A row for
# another model needs these columns (optional: layers, kv_heads, head_dim).
LLAMA3_8B_SHAPE = {"layers": 32, "kv_heads": 8, "head_dim": 128}

LOAD_SHORTFALL = 0.8  # below this share of the stated load a row is reported as not matchable

# Which fitted group a stack's rows belong to. TGI on Neuron ran optimum-neuron v0.1.0's HLO backend,
# vLLM on Neuron its NxD backend (data/calibration/SOURCES.md), so they are fitted apart.
GROUP_OF_STACK = {"vllm-neuron": "neuron-nxd", "tgi-neuron": "neuron-hlo-tgi", "vllm": "nvidia-vllm", "vllm-v0": "nvidia-vllm",
                  "tgi": "nvidia-tgi", "tensorrt-llm": "nvidia-tensorrt-llm"}  # fmt: skip


class RowError(ValueError):
    pass


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

    @property
    def vendor(self) -> str:
        return catalog.instance(self.instance_type).accelerator.vendor

    @property
    def group(self) -> str:
        return GROUP_OF_STACK[self.serving_stack]

    def load_shortfall(self) -> str | None:
        """Little's law on the published figures: did the load generator hold the stated load?

        requests in flight = completion rate x mean latency, with completion rate = output tok/s
        / output tokens and latency = TTFT + (output tokens - 1) x ITL. Far below the stated
        users (or the stated rate) means the measurement is not of that load, so no model of the
        server can match it.
        """
        p = self.published
        rate = p["output_tok_s"] / self.output_tokens
        if self.load.kind == "rate":
            share = rate / self.load.value
            what = f"completed {rate:.2f} req/s of the {self.load.value:g} offered"
        else:
            share = rate * (p["ttft_ms"] + (self.output_tokens - 1) * p["itl_ms"]) / 1000 / self.load.users
            what = f"{share * self.load.users:.1f} requests in flight on average, not {self.load.users}"
        return f"Little's law: {what}" if share < LOAD_SHORTFALL else None

    @property
    def configuration(self) -> tuple[object, ...]:
        """What makes two rows the same server under the same request sizes, at different loads."""
        return (self.instance_type, self.serving_stack, self.tensor_parallel, self.replicas, self.max_num_seqs,
                self.max_model_len, self.buckets, self.input_tokens)  # fmt: skip

    @property
    def single_user(self) -> bool:
        return self.load.users == 1 and self.load.kind != "rate"

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
                cache[i] = (min(draw(self.input_tokens, self.input_spread), self.max_model_len - 1),
                            draw(self.output_tokens, self.output_spread))  # fmt: skip
                cache[i] = (cache[i][0], max(1, min(cache[i][1], self.max_model_len - cache[i][0])))
            return cache[i]

        return size

    def roofline(self) -> Roofline:
        params = self.params_b * 1e9
        return Roofline.of(self.instance_type, self.tensor_parallel, params * self.bytes_per_param, self.kv_bytes_per_token, params)

    def timing(self, eff: ResolvedEfficiency) -> TimingModel:
        return TimingModel.build(
            instance_type=self.instance_type, tensor_parallel=self.tensor_parallel, roofline=self.roofline(), efficiency=eff,
            stack=self.serving_stack, max_num_seqs=self.max_num_seqs, max_model_len=self.max_model_len, replicas=self.replicas,
            buckets=self.buckets,
        )  # fmt: skip


def _num(raw: dict[str, str], col: str, line: int, kind: type, positive: bool = True) -> Any:
    value = (raw.get(col) or "").strip()
    try:
        out = kind(value)
    except ValueError:
        raise RowError(f"line {line}: column {col!r}: {value!r} is not a {'number' if kind is float else 'whole number'}") from None
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
        raise RowError(f"line {line}: column 'tensor_parallel': {tp} is not a TP degree of {it} ({list(catalog.instance(it).tp_degrees)})")
    replicas = _num(raw, "replicas_per_instance", line, int)
    if replicas * tp > catalog.instance(it).shards:
        shards = catalog.instance(it).shards
        raise RowError(f"line {line}: column 'replicas_per_instance': {replicas} x TP {tp} needs more than the {shards} devices/cores of {it}")
    precision = raw["weights_precision"].strip()
    if precision not in catalog.BYTES_PER_PRECISION:
        raise RowError(f"line {line}: column 'weights_precision': {precision!r} is not one of {', '.join(catalog.BYTES_PER_PRECISION)}")
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
    spreads = [_num(raw, c, line, int, positive=False) if (raw.get(c) or "").strip() else 0 for c in ("input_tokens_spread", "output_tokens_spread")]
    if min(spreads) < 0:
        raise RowError(f"line {line}: columns 'input_tokens_spread'/'output_tokens_spread' must be >= 0")
    distribution = (raw.get("length_distribution") or "uniform").strip()
    if distribution not in ("uniform", "normal"):
        raise RowError(f"line {line}: column 'length_distribution': {distribution!r} is not uniform or normal")
    max_len = _num(raw, "max_model_len", line, int) if (raw.get("max_model_len") or "").strip() else inp + out
    if max_len < inp + out:
        raise RowError(f"line {line}: column 'max_model_len': {max_len} < input + output tokens ({inp + out})")
    buckets = _buckets(raw, line, max_len)
    return Row(
        line=line, id=rid, instance_type=it, serving_stack=stack, tensor_parallel=tp, replicas=replicas,
        max_num_seqs=_num(raw, "max_num_seqs", line, int), max_model_len=max_len, buckets=buckets, params_b=_num(raw, "params_b", line, float),
        bytes_per_param=catalog.BYTES_PER_PRECISION[precision],
        kv_bytes_per_token=2.0 * shape["layers"] * shape["kv_heads"] * shape["head_dim"] * 2,  # BF16 KV cache
        input_tokens=inp, output_tokens=out, input_spread=spreads[0], output_spread=spreads[1], distribution=distribution,
        load=Load(kind, value),  # type: ignore[arg-type]
        published={m: _num(raw, m, line, float) for m in METRICS},
    )  # fmt: skip


def _buckets(raw: dict[str, str], line: int, max_len: int) -> tuple[int, ...]:
    """Optional column 'buckets': the compiled context lengths, space-separated, ascending."""
    text = (raw.get("buckets") or "").strip()
    if not text:
        return ()
    try:
        out = tuple(int(x) for x in text.split())
    except ValueError:
        raise RowError(f"line {line}: column 'buckets': {text!r} is not a space-separated list of whole numbers") from None
    if list(out) != sorted(set(out)) or out[0] <= 0 or out[-1] < max_len:
        raise RowError(f"line {line}: column 'buckets': {text!r} must ascend, be > 0 and end at or above max_model_len {max_len}")
    return out


# --- fitting ----------------------------------------------------------------------------------


def _line_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope and intercept (>= 0); through the origin when all xs are equal."""
    if len({round(x, 9) for x in xs}) < 2:
        return sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs), 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    intercept = my - slope * mx
    if intercept < 0:
        return sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs), 0.0
    return slope, intercept


def fit(rows: list[Row]) -> dict[str, Any]:
    groups: dict[str, list[Row]] = {}
    for r in rows:
        if r.single_user:
            groups.setdefault(r.group, []).append(r)
    out: dict[str, Any] = {}
    for name, rs in sorted(groups.items()):
        unit = ResolvedEfficiency(1.0, 1.0, 0.0, 0.0, "probe")
        # Decode: one sequence at mid-generation context, reading what the stack's decode step reads.
        dec_x = [r.roofline().memory_s(r.timing(unit).decode_kv_tokens([r.input_tokens + r.output_tokens // 2]), 1.0) for r in rs]
        slope_d, step_overhead = _line_fit(dec_x, [r.published["itl_ms"] / 1000 for r in rs])
        pre_x = [r.roofline().compute_s(r.timing(unit).padded(r.input_tokens), 1.0) for r in rs]
        slope_p, pre_intercept = _line_fit(pre_x, [r.published["ttft_ms"] / 1000 - step_overhead for r in rs])
        out[name] = {
            "vendor": rs[0].vendor,
            "stacks": sorted({r.serving_stack for r in rs}),
            "bandwidth": round(min(1.0, 1.0 / slope_d), 4),
            "compute": round(min(1.0, 1.0 / slope_p), 4),
            "step_overhead_ms": round(step_overhead * 1000, 2),
            "request_overhead_ms": round(pre_intercept * 1000, 2),
            "rows": [r.id for r in rs],
            "method": "bench/calibration.py --fit: least squares on single-user rows (ITL vs weight+KV read time; "
            "TTFT vs padded-prompt compute time); intercepts only where the rows span more than one TP degree",
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
    g = groups.get(row.group)
    if g is None:
        raise RowError(
            f"line {row.line}: row {row.id!r}: no fitted efficiency for group {row.group!r} (its stack has no single-user row); "
            "run --fit on a file that has one"
        )
    return ResolvedEfficiency(g["bandwidth"], g["compute"], g["step_overhead_ms"], g["request_overhead_ms"], row.group)


def compare(rows: list[Row], groups: dict[str, Any]) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    unmatchable = {r.id: why for r in rows if (why := r.load_shortfall()) is not None}
    for rid, why in ttft_below_synchronous(rows).items():
        unmatchable[rid] = f"{unmatchable[rid]}; {why}" if rid in unmatchable else why
    for r in rows:
        policy_for(r.serving_stack, r.vendor)
        summary, _ = simulate(r.timing(efficiency_of(r, groups)), r.load, r.sizes())
        predicted = {"output_tok_s": summary.output_tok_s, "ttft_ms": summary.ttft_s * 1000, "itl_ms": summary.itl_s * 1000}
        for metric in METRICS:
            pub = r.published[metric]
            results.append({"id": r.id, "vendor": r.vendor, "fitted": r.single_user, "metric": metric, "published": pub,
                            "predicted": round(predicted[metric], 3), "rel_error": round((predicted[metric] - pub) / pub, 4)})  # fmt: skip

    def agg(fn: Any, sel: list[dict[str, Any]]) -> dict[str, float]:
        return {m: round(fn([abs(x["rel_error"]) for x in sel if x["metric"] == m]), 4) for m in METRICS if any(x["metric"] == m for x in sel)}

    matchable = [x for x in results if x["id"] not in unmatchable]
    by_vendor = {v: {"median_abs_rel_error": agg(statistics.median, [x for x in results if x["vendor"] == v]),
                     "max_abs_rel_error": agg(max, [x for x in results if x["vendor"] == v])}
                 for v in sorted({x["vendor"] for x in results})}  # fmt: skip
    return {
        "rows": [{k: x[k] for k in ("id", "metric", "published", "predicted", "rel_error")} for x in results],
        "median_abs_rel_error": agg(statistics.median, results),
        "max_abs_rel_error": agg(max, results),
        "by_vendor": by_vendor,
        "fitted_rows": sorted({x["id"] for x in results if x["fitted"]}),
        "not_matchable": unmatchable,
        "matchable_rows": {"median_abs_rel_error": agg(statistics.median, matchable), "max_abs_rel_error": agg(max, matchable)},
    }


def render(report: dict[str, Any], elapsed: float) -> str:
    lines = [f"{'row':28} {'metric':13} {'published':>10} {'predicted':>10} {'error':>8}"]
    fitted = set(report["fitted_rows"])
    for x in report["rows"]:
        mark = "  (fit)" if x["id"] in fitted else "  (not matchable)" if x["id"] in report["not_matchable"] else ""
        lines.append(f"{x['id']:28} {x['metric']:13} {x['published']:10.1f} {x['predicted']:10.1f} {x['rel_error'] * 100:+7.1f}%{mark}")
    lines.append("")
    for scope, agg in [("all rows", report), *report["by_vendor"].items(), ("matchable", report["matchable_rows"])]:
        med, worst = agg["median_abs_rel_error"], agg["max_abs_rel_error"]
        lines.append(f"{scope:12} " + "  ".join(f"{m}: median {med[m] * 100:.1f}% max {worst[m] * 100:.1f}%" for m in METRICS))
    if report["not_matchable"]:
        lines.append("")
        lines.append("rows no server model can match, by their own published figures:")
        lines += [f"  {rid}: {why}" for rid, why in report["not_matchable"].items()]
    lines.append(f"targets: median <= 15%, max <= 30% per metric; (fit) rows were used to fit the efficiencies. {elapsed:.1f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/calibration.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=Path, default=DEFAULT_ROWS, help="CSV of published rows (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--fit", action="store_true", help=f"fit the efficiencies on the rows and write {EFFICIENCY_FILE.relative_to(ROOT)}")
    p.add_argument("--efficiency", type=Path, default=EFFICIENCY_FILE, help="fitted efficiencies to compare with (default: %(default)s)")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    try:
        rows = read_rows(a.rows)
        if a.fit:
            groups = fit(rows)
            src = a.rows.resolve()
            name = str(src.relative_to(ROOT)) if src.is_relative_to(ROOT) else src.name
            a.efficiency.write_text(json.dumps({"source": name, "groups": groups}, indent=2) + "\n")
            print(f"wrote {a.efficiency}")
        else:
            groups = json.loads(a.efficiency.read_text())["groups"] if a.efficiency.is_file() else fit(rows)
        report = compare(rows, groups)
    except RowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if a.json else render(report, time.perf_counter() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
