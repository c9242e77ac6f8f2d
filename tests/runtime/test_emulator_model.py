"""Timing model calibration and deterministic text, without a server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from campaign.plan import roofline as plan
from core.manifest import fit
from core.tokenizer import VOCAB
from runtime.emulator.config import FaultConfig
from runtime.emulator.faults import draw
from runtime.emulator.textgen import TokenStream
from runtime.emulator.timing import TimingModel
from tests.runtime.conftest import load


def test_calibration_7b_bf16_full_bandwidth(manifest_data: dict[str, Any], tmp_path: Path) -> None:
    data = dict(manifest_data, model={**manifest_data["model"], "params_b": 7.0})
    for f in data["fleets"]:
        f["efficiency"] = {"bandwidth": 1.0, "compute": 1.0}
    _, m = load(tmp_path, data)
    inf2 = TimingModel.for_fleet(m, m.fleet("inf2")).batch1_decode_tok_s()
    g6 = TimingModel.for_fleet(m, m.fleet("g6")).batch1_decode_tok_s()
    # 820 GiB/s (the Neuron docs' unit) over 14e9 bytes of weights: 62.9 tok/s, not the 58.6 of
    # reading it as 820 GB/s; the L4's 300 GB/s: 21.4 tok/s.
    assert inf2 == pytest.approx(820 * 2**30 / 14e9, rel=1e-3)
    assert g6 == pytest.approx(300 / 14, rel=1e-3)
    assert inf2 / g6 == pytest.approx(820 * 2**30 / 1e9 / 300, rel=1e-3)


def test_step_time_is_campaign_plan_roofline(example: Any) -> None:
    _, m = example
    for f in m.fleets:
        t = TimingModel.for_fleet(m, f)
        eff = f.efficiency.resolved()
        overhead = eff.step_overhead_ms / 1000
        assert t.step_s(1000, 0, 4) == pytest.approx(plan.decode_step_s(m, f, 4, 250, eff.bandwidth) + overhead)
        assert t.step_s(2048, 2048, 0) == pytest.approx(
            max(plan.decode_step_s(m, f, 1, 2048, eff.bandwidth), plan.prefill_s(m, f, 2048, eff.compute)) + overhead
        )


def test_kv_capacity_follows_each_stacks_layout(example: Any) -> None:
    _, m = example
    inf2, g6 = (TimingModel.for_fleet(m, m.fleet(n)) for n in ("inf2", "g6"))
    # vLLM on Neuron: one contiguous max_model_len block per compiled batch slot.
    assert inf2.kv_capacity_tokens == 16 * 2560
    # vLLM on GPU: gpu_memory_utilization 0.9 of visible memory, less weights and reserve.
    ft = fit(m, m.fleet("g6"))
    free_gib = ft.visible_gib * 0.9 - ft.weights_gib - ft.reserve_gib
    assert g6.kv_capacity_tokens == pytest.approx(free_gib * 2**30 / (2 * 32 * 8 * 128 * 2), abs=1)


def test_text_is_deterministic_and_in_vocab() -> None:
    a = [TokenStream(7, "hello world").next_token()[0] for _ in range(1)]
    s1, s2, s3 = TokenStream(7, "hello"), TokenStream(7, "hello"), TokenStream(8, "hello")
    t1 = "".join(s1.next_token()[0] for _ in range(50))
    assert t1 == "".join(s2.next_token()[0] for _ in range(50))
    assert t1 != "".join(s3.next_token()[0] for _ in range(50))
    assert len(t1.split()) == 50 and set(t1.split()) <= set(VOCAB) and a[0] in VOCAB


def _run(stream: TokenStream, limit: int = 200) -> tuple[str, bool, int]:
    out = ""
    for _ in range(limit):
        piece, stopped = stream.next_token()
        out += piece
        if stopped:
            return out, True, stream.count
    return out + stream.flush(), False, stream.count


def test_stop_string_excluded_and_exact() -> None:
    full, _, _ = _run(TokenStream(3, "p"), 200)
    words = full.split()
    target = " ".join(words[10:12])  # a two-token stop string spanning a token boundary
    text, stopped, count = _run(TokenStream(3, "p", [target]), 200)
    assert stopped
    assert text == full[: full.index(target)]
    assert count == full[: full.index(target) + len(target)].count(" ") + 1
    # A stop that never appears: everything held back is released at the end.
    text, stopped, _ = _run(TokenStream(3, "p", ["zzz-never"]), 200)
    assert not stopped and text == full


def test_fault_draws_are_deterministic_per_seed() -> None:
    cfg = FaultConfig(error_rate=0.3, truncate_rate=0.3, fault_seed=5)
    a = [draw(cfg, i, 10) for i in range(200)]
    assert a == [draw(cfg, i, 10) for i in range(200)]
    assert a != [draw(FaultConfig(error_rate=0.3, truncate_rate=0.3, fault_seed=6), i, 10) for i in range(200)]
    errors = sum(f.error for f in a)
    assert 30 < errors < 90  # ~60 expected
    assert all(f.truncate_at == 5 for f in a if f.truncate_at is not None)
