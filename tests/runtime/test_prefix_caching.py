"""The emulator follows each fleet's serving.prefix_caching, with the KV layout vLLM on Neuron
picks from it (SDK 2.28 vLLM user guide, Known Issues 2): contiguous without, blocks with."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.manifest import Fleet, Manifest, load_manifest
from runtime.emulator.engine import Engine, EngineSeq, block_hashes
from runtime.emulator.timing import TimingModel


@pytest.fixture(scope="module")
def manifest(example_manifest_path: Path) -> Manifest:
    return load_manifest(example_manifest_path, check_files=False)


def _fleet(m: Manifest, name: str, on: bool | None) -> Fleet:
    f = m.fleet(name)
    return f.model_copy(update={"serving": f.serving.model_copy(update={"prefix_caching": on})})


def _drain(e: Engine) -> list[float]:
    """Step the engine back to back until idle, finishing sequences at max_tokens; step durations."""
    now, durations = 0.0, []
    for _ in range(10_000):
        step = e.plan(now)
        if step is None:
            break
        now += step.duration
        durations.append(step.duration)
        for s in e.complete(step, now):
            if s.generated >= s.max_tokens:
                s.finish_reason = "length"
    return durations


def _pair(t: TimingModel) -> tuple[Engine, EngineSeq, list[float]]:
    """Two 1,040-token prompts sharing their first 1,040 - 16 tokens, one after the other."""
    e = Engine(t)
    shared = [f"w{i}" for i in range(1024)]
    durations = []
    last = None
    for tail in ("a", "b"):
        seq = EngineSeq(1040, 1, 0.0, block_hashes([*shared, *[tail] * 16]) if t.policy.prefix_caching else None)
        e.submit(seq)
        durations.append(_drain(e)[0])  # the prompt's prefill step
        last = seq
    assert last is not None
    return e, last, durations


def test_neuron_fleet_is_contiguous_without_prefix_caching(manifest: Manifest) -> None:
    for on in (None, False):  # the example's explicit false, and the stack's default
        t = TimingModel.for_fleet(manifest, _fleet(manifest, "inf2", on))
        assert (t.policy.kv_layout, t.policy.prefix_caching) == ("contiguous", False)
        assert t.kv_capacity_tokens == t.max_concurrency * t.max_model_len
        e, b, _ = _pair(t)
        assert (b.cached_tokens, e.prefix_hits) == (0, 0)


def test_neuron_fleet_with_prefix_caching_uses_32_token_blocks_and_skips_cached_ones(manifest: Manifest) -> None:
    off = TimingModel.for_fleet(manifest, _fleet(manifest, "inf2", False))
    t = TimingModel.for_fleet(manifest, _fleet(manifest, "inf2", True))
    assert (t.policy.kv_layout, t.policy.prefix_caching, t.policy.static_batch) == ("paged", True, True)
    # The blocks core.serving allocates: ceil(2560 / 32) x 16 of 32 tokens.
    assert t.prefix_block_tokens == 32 and t.kv_capacity_tokens == 80 * 16 * 32
    e, b, durations = _pair(t)
    assert b.cached_tokens == 1024  # 64 shared 16-token pages = 32 whole 32-token blocks
    assert (e.prefix_queries, e.prefix_hits) == (2080, 1024)
    assert durations[1] < durations[0]  # the second prompt encodes its 16 new tokens (one bucket), not 1,040
    _, b_off, durations_off = _pair(off)
    assert b_off.cached_tokens == 0 and durations_off[1] == pytest.approx(durations_off[0])


def test_neuron_hits_come_in_whole_32_token_blocks(manifest: Manifest) -> None:
    t = TimingModel.for_fleet(manifest, _fleet(manifest, "inf2", True))
    e = Engine(t)
    shared = [f"w{i}" for i in range(48)]  # three 16-token pages = one whole 32-token block
    for tail in ("a", "b"):
        seq = EngineSeq(64, 1, 0.0, block_hashes([*shared, *[tail] * 16]))
        e.submit(seq)
        _drain(e)
    assert seq.cached_tokens == 32


def test_gpu_vllm_fleet_follows_the_field(manifest: Manifest) -> None:
    on = TimingModel.for_fleet(manifest, _fleet(manifest, "g6", True))
    off = TimingModel.for_fleet(manifest, _fleet(manifest, "g6", False))
    assert on.policy.prefix_caching and not off.policy.prefix_caching
    assert on.policy.kv_layout == off.policy.kv_layout == "paged" and on.kv_capacity_tokens == off.kv_capacity_tokens
    assert _pair(on)[1].cached_tokens == 1024
    e, b, _ = _pair(off)
    assert (b.cached_tokens, e.prefix_hits, e.prefix_queries) == (0, 0, 0)
