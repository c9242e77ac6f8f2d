"""Each stack's scheduling, driven by the clock-free Engine in simulated time (no sockets)."""

from __future__ import annotations

import pytest

from core.manifest import ResolvedEfficiency
from core.roofline import Roofline
from runtime.emulator.engine import Engine, EngineSeq, block_hashes
from runtime.emulator.simulate import Load, simulate
from runtime.emulator.timing import TimingModel

EFF = ResolvedEfficiency(0.5, 0.5, 0.0, 0.0, "test")
W, KV, P = 16e9, 131072.0, 8e9


def timing(
    stack: str, instance: str, tp: int, max_num_seqs: int = 4, max_model_len: int = 4096, **kw: object
) -> TimingModel:
    return TimingModel.build(
        instance_type=instance,
        tensor_parallel=tp,
        roofline=Roofline.of(instance, tp, W, KV, P),
        efficiency=kw.pop("eff", EFF),  # type: ignore[arg-type]
        stack=stack,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        **kw,
    )  # type: ignore[arg-type]


def run(engine: Engine, until: int = 10_000) -> list[tuple[float, list[EngineSeq], object]]:
    """Step the engine back to back from t=0; (end time, emitted, step) per step."""
    out = []
    now = 0.0
    for _ in range(until):
        step = engine.plan(now)
        if step is None:
            break
        now += step.duration
        emitted = engine.complete(step, now)
        for s in emitted:
            if s.generated == 1:
                s.first_token_at = now
            if s.generated >= s.max_tokens:
                s.finish_reason = "length"
        out.append((now, emitted, step))
    return out


def test_neuron_prefill_step_runs_one_padded_pass_per_prompt_and_emits_together() -> None:
    t = timing("vllm-neuron", "inf2.xlarge", 2)
    e = Engine(t)
    a, b = EngineSeq(600, 3, 0.0), EngineSeq(600, 3, 0.0)
    e.submit(a)
    e.submit(b)
    steps = run(e)
    first = steps[0][2]
    # Both prompts in one step (vLLM admits within its token budget), encoded in two context
    # passes of batch 1, each padded to the 1,024 bucket; no decode in that step.
    assert [s for s, _ in first.prefill] == [a, b] and first.decode == []  # type: ignore[attr-defined]
    assert first.duration == pytest.approx(2 * t.step_s(1024, 1024, 0))  # type: ignore[attr-defined]
    # Every first token comes out when the whole step ends.
    assert a.first_token_at == b.first_token_at == pytest.approx(2 * t.step_s(1024, 1024, 0))
    assert t.padded(600) == 1024 and t.padded(1024) == 1024 and t.padded(1025) == 2048


def test_vllm_neuron_prefill_step_stays_within_max_num_batched_tokens() -> None:
    e = Engine(timing("vllm-neuron", "inf2.xlarge", 2, max_model_len=4096))
    seqs = [EngineSeq(1500, 2, 0.0) for _ in range(3)]
    for s in seqs:
        e.submit(s)
    steps = run(e)
    # max(max_model_len, 2048) = 4,096 unpadded prompt tokens: two prompts, then the third.
    assert [s for s, _ in steps[0][2].prefill] == seqs[:2]  # type: ignore[attr-defined]
    assert [s for s, _ in steps[1][2].prefill] == seqs[2:]  # type: ignore[attr-defined]


def test_neuron_decode_runs_every_compiled_slot_over_the_bucket() -> None:
    t = timing("vllm-neuron", "inf2.xlarge", 2, max_num_seqs=4)
    e = Engine(t)
    e.submit(EngineSeq(600, 3, 0.0))
    steps = run(e)
    decode = steps[1][2]
    # One live sequence of 601 tokens, but the graph runs 4 slots x the 1,024 bucket.
    assert decode.kv_tokens_read == 4 * 1024  # type: ignore[attr-defined]
    assert decode.duration == pytest.approx(t.step_s(4 * 1024, 0, 4))  # type: ignore[attr-defined]
    single = timing("vllm-neuron", "inf2.xlarge", 2, max_num_seqs=4, buckets=(4096,))
    assert single.decode_kv_tokens([601]) == 4 * 4096  # optimum-neuron: one bucket, the full length


def test_neuron_capacity_is_max_num_seqs_sequences_not_a_token_pool() -> None:
    t = timing("vllm-neuron", "inf2.xlarge", 2, max_num_seqs=2, max_model_len=4096)
    assert t.kv_capacity_tokens == 2 * 4096
    e = Engine(t)
    seqs = [EngineSeq(10, 5, 0.0) for _ in range(3)]
    for s in seqs:
        e.submit(s)
    run(e)
    # The third waits for a slot: its first token comes after the first two finished.
    assert seqs[2].first_token_at is not None and seqs[0].first_token_at is not None
    assert seqs[2].admitted_at is not None and seqs[2].admitted_at >= max(s.last_token_at or 0 for s in seqs[:1])
    assert all(s.generated == 5 for s in seqs)


def test_vllm_gpu_chunks_a_long_prompt_while_others_keep_decoding() -> None:
    t = timing("vllm", "g6.xlarge", 1, max_num_seqs=8, max_model_len=8192)
    e = Engine(t)
    short = EngineSeq(100, 50, 0.0)
    e.submit(short)
    run(e, until=3)  # short is decoding now
    long = EngineSeq(5000, 2, 0.0)
    e.submit(long)
    steps = run(e)
    chunks = [c for _, _, st in steps for s, c in st.prefill if s is long]  # type: ignore[attr-defined]
    assert chunks == [2047, 2047, 906]  # 2,048-token budget less the decoding sequence's token
    # short emitted a token in every one of those steps: no decode pause for a prefill.
    assert all(short in em for _, em, st in steps[:3])


def test_prefix_cache_skips_shared_blocks_and_counts_like_vllm() -> None:
    t = timing("vllm", "g6.xlarge", 1, max_num_seqs=8, max_model_len=8192)
    e = Engine(t)
    shared = [f"w{i}" for i in range(1024)]
    a = EngineSeq(1040, 1, 0.0, block_hashes([*shared, *["a"] * 16]))
    e.submit(a)
    run(e)
    b = EngineSeq(1040, 1, 0.0, block_hashes([*shared, *["b"] * 16]))
    e.submit(b)
    steps = run(e)
    assert b.cached_tokens == 1024  # 64 shared blocks of 16
    assert sum(c for _, c in steps[0][2].prefill) == 16  # type: ignore[attr-defined]
    assert (e.prefix_queries, e.prefix_hits) == (2080, 1024)
    # Neuron (no prefix caching here): the same pair is a miss.
    n = Engine(timing("vllm-neuron", "inf2.xlarge", 2))
    n.submit(EngineSeq(1040, 1, 0.0, a.block_hashes))
    n.submit(EngineSeq(1040, 1, 0.0, a.block_hashes))
    run(n)
    assert n.prefix_hits == 0


def test_paged_kv_preempts_and_recomputes_when_full() -> None:
    t = timing("vllm", "g6.xlarge", 1, max_num_seqs=8, max_model_len=8192)
    small = TimingModel(t.roofline, t.efficiency, t.policy, 8, 8192, (), kv_capacity_tokens=64)
    e = Engine(small)
    seqs = [EngineSeq(20, 30, 0.0) for _ in range(3)]
    for s in seqs:
        e.submit(s)
    run(e)
    assert e.preemptions > 0
    assert all(s.generated == 30 for s in seqs)
    assert e.used_pages == 0


def test_data_parallel_replicas_serve_side_by_side() -> None:
    one = timing("vllm-neuron", "inf2.48xlarge", 8, max_num_seqs=4)
    three = TimingModel(
        one.roofline, one.efficiency, one.policy, 4, 4096, one.buckets, one.kv_capacity_tokens, replicas=3
    )
    sizes = lambda i: (1500, 20)  # noqa: E731
    s1, _ = simulate(one, Load("concurrency", 3), sizes, requests=3)
    s3, _ = simulate(three, Load("concurrency", 3), sizes, requests=3)
    prefill = one.step_s(2048, 2048, 0)
    # Three replicas encode the three prompts at once; one replica encodes two in its first step
    # (4,096 prompt tokens of budget), then the third: first tokens at 2, 2 and 3 passes.
    assert s3.ttft_s == pytest.approx(prefill, rel=0.01)
    assert s1.ttft_s == pytest.approx(7 / 3 * prefill, rel=0.01)


def test_tgi_router_adds_newcomers_by_its_ratio_or_after_max_waiting_tokens() -> None:
    t = timing("tgi-neuron", "inf2.xlarge", 2, max_num_seqs=8)
    e = Engine(t)
    first = EngineSeq(100, 200, 0.0)
    e.submit(first)
    run(e, until=5)  # 1 prefill + 4 decode steps
    # One running: floor(1 x 1.2) = 1 waiting request is enough, at the next step.
    e.submit(late := EngineSeq(100, 200, 0.0))
    assert [s for s, _ in e.plan(0.0).prefill] == [late]  # type: ignore[union-attr]
    g = Engine(t)
    for _ in range(2):
        g.submit(EngineSeq(100, 200, 0.0))
    run(g, until=5)  # one prefill of both + 4 decodes
    g.submit(EngineSeq(100, 5, 0.0))
    steps = run(g, until=40)
    # Two running: floor(2.4) = 2 waiting needed, so the newcomer waits until the router's
    # waiting_tokens (1 after a prefill, +1 per decode) reaches 20: after the 19th decode.
    prefill_at = next(i for i, (_, _, st) in enumerate(steps) if st.prefill)  # type: ignore[attr-defined]
    assert prefill_at == 19 - 4


def test_tgi_neuron_prefills_every_waiting_request_up_to_the_free_slots() -> None:
    e = Engine(timing("tgi-neuron", "inf2.xlarge", 2, max_num_seqs=3, max_model_len=4096))
    seqs = [EngineSeq(1500, 2, 0.0) for _ in range(4)]
    for s in seqs:
        e.submit(s)
    steps = run(e)
    # No token budget short of the whole static batch: three prompts (the free slots) at once,
    # past vLLM's 4,096; then a decode always follows a prefill.
    assert [s for s, _ in steps[0][2].prefill] == seqs[:3]  # type: ignore[attr-defined]
    assert steps[1][2].decode and not steps[1][2].prefill  # type: ignore[attr-defined]


def test_admission_delay_adds_to_ttft_without_occupying_the_device() -> None:
    eff = ResolvedEfficiency(0.5, 0.5, 0.0, 100.0, "test")
    t = timing("vllm", "g6.xlarge", 1, max_num_seqs=8, eff=eff)
    summary, _ = simulate(t, Load("synchronous", 1), lambda i: (512, 4), requests=3)
    base = timing("vllm", "g6.xlarge", 1, max_num_seqs=8)
    plain, _ = simulate(base, Load("synchronous", 1), lambda i: (512, 4), requests=3)
    assert summary.ttft_s == pytest.approx(plain.ttft_s + 0.1, rel=1e-6)
    assert summary.itl_s == pytest.approx(plain.itl_s, rel=1e-6)
