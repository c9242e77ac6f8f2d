"""One emulated server's scheduler, clock-free: `plan` the next step, `complete` it.

The same Engine runs the live emulator (runtime/emulator/scheduler.py sleeps each step's
duration on the event loop) and the simulated-time replays (runtime/emulator/simulate.py, used
by runtime/emulator/calibrate.py), so a benchmark of the model is a benchmark of the server.

What a step contains follows the stack's policy (core/scheduling.py):
- Neuron (static shapes): a prefill step encodes the admitted prompts one pass each (context
  batch 1), each padded to its bucket, while every running sequence waits, and all of them emit
  their first token when the step ends; vLLM admits prompts as slots free up, within its token
  budget, TGI's router when its rule says so (stacks.py). Otherwise all max_num_seqs slots
  decode over the bucket covering the longest live sequence. Capacity is max_num_seqs
  sequences: contiguous KV without prefix caching; with it (the fleet's serving.prefix_caching)
  the plugin's block layout, ceil(max_model_len / 32) 32-token blocks per slot, where a prompt's
  cached blocks are not encoded again (SDK 2.28 vLLM user guide, Known Issues 2).
- vLLM V0: all waiting prompts that fit the token budget are encoded together, decode paused.
- Chunked prefill (vLLM V1, TGI v3, TensorRT-LLM): every decoding sequence gets one token,
  then partial prompts and newcomers share what is left of max_num_batched_tokens.
Paged KV is allocated in 16-token pages as sequences grow; when it runs out the newest running
sequence is preempted and recomputed later (vLLM's recompute preemption). With prefix caching,
prompt pages already in the cache (chained hashes of 16-token blocks) are not encoded again.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict, deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from runtime.emulator.timing import PAGE_TOKENS, TimingModel


def _pages(tokens: int) -> int:
    return -(-tokens // PAGE_TOKENS)


def block_hashes(tokens: Seq[object]) -> tuple[int, ...]:
    """Chained hashes of the prompt's full 16-token blocks, as vLLM's prefix cache keys them:
    a block matches only when every token before it matches too. Stable within one process."""
    out: list[int] = []
    prev = 0
    for i in range(0, len(tokens) - PAGE_TOKENS + 1, PAGE_TOKENS):
        prev = hash((prev, tuple(tokens[i : i + PAGE_TOKENS])))
        out.append(prev)
    return tuple(out)


class EngineSeq:
    """One request as the engine sees it; the live server's LiveSequence adds its stream."""

    def __init__(self, prompt_tokens: int, max_tokens: int, arrival: float, block_hashes: Seq[int] | None = None):
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.arrival = arrival
        self.block_hashes = tuple(block_hashes or ())
        self.generated = 0
        self.context = prompt_tokens  # tokens whose KV the sequence holds once encoded
        self.to_compute = prompt_tokens  # prompt (+ generated, after a preemption) to encode
        self.computed = 0
        self.cached_tokens = 0  # prefix-cache hit of the first admission
        self.pages = 0
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.last_token_at = 0.0
        self.finish_reason: str | None = None
        self.cancelled = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.cancelled

    @property
    def encoding(self) -> bool:
        return self.computed < self.to_compute

    def ready(self, now: float) -> bool:
        """Whether a token computed now is emitted now (the live server delays some on purpose)."""
        return True


@dataclass
class Step:
    duration: float
    prefill: list[tuple[EngineSeq, int]] = field(default_factory=list)  # (sequence, tokens encoded)
    decode: list[EngineSeq] = field(default_factory=list)
    admitted: list[EngineSeq] = field(default_factory=list)
    kv_tokens_read: int = 0

    @property
    def batch(self) -> int:
        return len(self.decode) + len(self.prefill)


class PrefixCache:
    """Prompt pages by chained block hash, least recently used evicted first."""

    def __init__(self, capacity_pages: int):
        self.capacity = capacity_pages
        self._pages: OrderedDict[int, None] = OrderedDict()

    def hit_blocks(self, hashes: tuple[int, ...]) -> int:
        n = 0
        for h in hashes:
            if h not in self._pages:
                break
            self._pages.move_to_end(h)
            n += 1
        return n

    def insert(self, hashes: tuple[int, ...]) -> None:
        for h in hashes:
            self._pages[h] = None
            self._pages.move_to_end(h)
        while len(self._pages) > self.capacity:
            self._pages.popitem(last=False)


class Engine:
    def __init__(self, timing: TimingModel):
        self.timing = timing
        self.policy = timing.policy
        self.waiting: deque[EngineSeq] = deque()
        self.running: list[EngineSeq] = []
        self.capacity_pages = _pages(timing.kv_capacity_tokens) if self.policy.kv_layout == "paged" else 0
        self.used_pages = 0
        self.prefix = PrefixCache(self.capacity_pages) if self.policy.prefix_caching else None
        self.prefix_queries = 0  # prompt tokens looked up (vLLM: vllm:prefix_cache_queries)
        self.prefix_hits = 0  # of which found cached (vllm:prefix_cache_hits)
        self.preemptions = 0
        self._waiting_tokens = 1  # TGI router: 1 + decode passes since newcomers were last added
        self._prefilled_last = False  # TGI router: a prefill is always followed by a decode

    # --- intake -------------------------------------------------------------------------------

    def submit(self, seq: EngineSeq) -> None:
        self.waiting.append(seq)

    def cancel(self, seq: EngineSeq) -> None:
        seq.cancelled = True
        with contextlib.suppress(ValueError):  # running: released at the next plan()
            self.waiting.remove(seq)

    def has_work(self) -> bool:
        return bool(self.waiting) or any(not s.finished for s in self.running)

    @property
    def kv_usage(self) -> float:
        if self.policy.kv_layout == "contiguous":
            return len(self.running) / self.timing.max_concurrency
        return min(1.0, self.used_pages / self.capacity_pages) if self.capacity_pages else 1.0

    # --- one step -----------------------------------------------------------------------------

    def plan(self, now: float) -> Step | None:
        """Decide the next step's work at time `now`; None when there is nothing to do."""
        self._release_finished()
        if self.policy.static_batch:
            return self._plan_static(now)
        if self.policy.prefill_alone:
            return self._plan_prefill_first(now)
        return self._plan_chunked(now)

    def complete(self, step: Step, now: float) -> list[EngineSeq]:
        """Apply a finished step; returns the sequences that emit a token at `now`."""
        out: list[EngineSeq] = []
        for seq, tokens in step.prefill:
            seq.computed += tokens
            if not seq.encoding:
                if self.prefix is not None:
                    self.prefix.insert(seq.block_hashes)
                if not seq.finished:
                    out.append(seq)  # the pass that finishes a prompt samples its next token
        out += [s for s in step.decode if not s.finished]
        emitted = [s for s in out if s.ready(now)]
        for seq in emitted:
            seq.generated += 1
            seq.context += 1
        return emitted

    # --- policies -----------------------------------------------------------------------------

    def _newcomers_due(self) -> bool:
        """Whether waiting requests may join now (always, except behind TGI's router)."""
        p = self.policy
        decoding = sum(1 for s in self.running if not s.finished)
        if p.max_waiting_tokens is None or not decoding:
            return True
        if self._prefilled_last:
            return False
        ratio = p.waiting_served_ratio or 0.0
        return len(self.waiting) >= int(decoding * ratio) or self._waiting_tokens >= p.max_waiting_tokens

    def _plan_static(self, now: float) -> Step | None:
        t = self.timing
        free = t.max_concurrency - len(self.running)
        if self.waiting and free > 0 and self._newcomers_due():
            budget = self.policy.max_batched_tokens(t.max_model_len) if self.policy.prefill_token_budget else None
            admitted: list[EngineSeq] = []
            while self.waiting and len(admitted) < free:
                need = self.waiting[0].to_compute
                if budget is not None and admitted and need > budget:
                    break
                seq = self.waiting.popleft()
                self._admit(seq, now)
                self.running.append(seq)
                admitted.append(seq)
                if budget is not None:
                    budget -= need
            self._prefilled_last, self._waiting_tokens = True, 1
            # One context-encoding pass per prompt, back to back, each padded to its bucket; with
            # prefix caching only the uncached part is encoded, attending over the cached blocks.
            new = [(s, s.to_compute - s.computed) for s in admitted]
            duration = sum(t.step_s(t.padded(n) + s.computed, t.padded(n), 0) for s, n in new)
            return Step(
                duration, prefill=new, admitted=admitted, kv_tokens_read=sum(t.padded(n) + s.computed for s, n in new)
            )
        self._prefilled_last = False
        decode = self._grow_for_decode([s for s in self.running if not s.encoding])
        if not decode:
            return None
        self._waiting_tokens += 1
        kv = t.decode_kv_tokens([s.context for s in decode])
        return Step(t.step_s(kv, 0, t.max_concurrency), decode=decode, kv_tokens_read=kv)

    def _plan_prefill_first(self, now: float) -> Step | None:
        t = self.timing
        budget = self.policy.max_batched_tokens(t.max_model_len)
        admitted: list[EngineSeq] = []
        while self.waiting and len(self.running) < t.max_concurrency:
            seq = self.waiting[0]
            need = seq.to_compute - self._cache_hit(seq, count=False)
            if admitted and need > budget:
                break
            if not self._fits(seq):
                break
            self.waiting.popleft()
            self._admit(seq, now)
            self.running.append(seq)
            admitted.append(seq)
            budget -= seq.to_compute - seq.computed
        if admitted:
            tokens = sum(s.to_compute - s.computed for s in admitted)
            kv = sum(s.to_compute for s in admitted)
            return Step(
                t.step_s(kv, tokens, 0),
                prefill=[(s, s.to_compute - s.computed) for s in admitted],
                admitted=admitted,
                kv_tokens_read=kv,
            )
        decode = self._grow_for_decode([s for s in self.running if not s.encoding])
        if not decode:
            return None
        kv = sum(s.context for s in decode)
        return Step(t.step_s(kv, 0, len(decode)), decode=decode, kv_tokens_read=kv)

    def _plan_chunked(self, now: float) -> Step | None:
        t = self.timing
        budget = self.policy.max_batched_tokens(t.max_model_len)
        decode = self._grow_for_decode([s for s in self.running if not s.encoding])
        budget -= len(decode)
        prefill: list[tuple[EngineSeq, int]] = []
        for seq in self.running:
            if seq.encoding and budget > 0:
                chunk = min(seq.to_compute - seq.computed, budget)
                prefill.append((seq, chunk))
                budget -= chunk
        admitted: list[EngineSeq] = []
        if self.waiting and self._newcomers_due():
            self._waiting_tokens = 1
        elif decode:
            self._waiting_tokens += 1
            budget = 0
        while budget > 0 and self.waiting and len(self.running) < t.max_concurrency and self._fits(self.waiting[0]):
            seq = self.waiting.popleft()
            self._admit(seq, now)
            self.running.append(seq)
            admitted.append(seq)
            chunk = min(seq.to_compute - seq.computed, budget)
            if chunk > 0:
                prefill.append((seq, chunk))
                budget -= chunk
        if not decode and not prefill:
            return None
        tokens = sum(c for _, c in prefill)
        kv = sum(s.context for s in decode) + sum(s.computed + c for s, c in prefill)
        return Step(
            t.step_s(kv, tokens, len(decode)), prefill=prefill, decode=decode, admitted=admitted, kv_tokens_read=kv
        )

    # --- KV and prefix cache ------------------------------------------------------------------

    def _cache_hit(self, seq: EngineSeq, count: bool) -> int:
        if self.prefix is None or seq.generated:
            return 0
        blocks = self.prefix.hit_blocks(seq.block_hashes)
        # Hits come in whole KV blocks (32 tokens on Neuron's block layout, 16 on GPU vLLM); at
        # least the prompt's last token is always computed (it yields the first logits).
        whole = blocks * PAGE_TOKENS // self.timing.prefix_block_tokens * self.timing.prefix_block_tokens
        hit = min(whole, seq.prompt_tokens - 1) if whole else 0
        if count:
            self.prefix_queries += seq.prompt_tokens
            self.prefix_hits += hit
        return hit

    def _fits(self, seq: EngineSeq) -> bool:
        if self.policy.kv_layout == "contiguous":
            return True
        # An empty engine always admits, so one oversized request cannot wedge the queue.
        return not self.running or self.used_pages + _pages(seq.to_compute + 1) <= self.capacity_pages

    def _admit(self, seq: EngineSeq, now: float) -> None:
        if seq.admitted_at is None:
            seq.admitted_at = now
            seq.cached_tokens = self._cache_hit(seq, count=True)
            seq.computed = seq.cached_tokens
        if self.policy.kv_layout == "paged":
            seq.pages = _pages(seq.to_compute + 1)
            self.used_pages += seq.pages

    def _grow_for_decode(self, decode: list[EngineSeq]) -> list[EngineSeq]:
        """Give each decoding sequence room for one more token, preempting the newest if full."""
        if self.policy.kv_layout != "paged":
            return decode
        keep = list(decode)
        for seq in list(keep):
            if seq not in keep:
                continue
            need = _pages(seq.context + 1) - seq.pages
            while need > 0 and self.used_pages + need > self.capacity_pages and len(self.running) > 1:
                victim = self.running[-1]
                self._preempt(victim)
                if victim in keep:
                    keep.remove(victim)
                if victim is seq:
                    need = 0
                    break
            if seq in keep and need > 0:
                seq.pages += need
                self.used_pages += need
        return keep

    def _preempt(self, seq: EngineSeq) -> None:
        self.running.remove(seq)
        self.used_pages -= seq.pages
        seq.pages = 0
        seq.to_compute = seq.prompt_tokens + seq.generated
        seq.context = seq.to_compute
        seq.computed = 0
        self.waiting.appendleft(seq)
        self.preemptions += 1

    def _release_finished(self) -> None:
        keep: list[EngineSeq] = []
        for seq in self.running:
            if seq.finished:
                self.used_pages -= seq.pages
                seq.pages = 0
            else:
                keep.append(seq)
        self.running = keep
