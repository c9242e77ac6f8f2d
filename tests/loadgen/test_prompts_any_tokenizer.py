"""Exact prompt lengths under tokenizers whose pieces are not words (byte-level BPE, WordPiece,
Unigram, characters), counted as vLLM counts them: a completions prompt with the tokenizer's
special tokens (BOS), a chat prompt as the rendered template without them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from core.manifest import Manifest, manifest_from_data
from core.schedule import ScheduledRequest
from core.traces import BLOCK_TOKENS
from loadgen.prompts import Api, PromptBuilder
from tests.loadgen.tokenizer_zoo import KINDS, save

MAX_TOKENS = 4096


@pytest.fixture(scope="module")
def zoo(
    tmp_path_factory: pytest.TempPathFactory, _example_data: dict[str, Any]
) -> dict[str, tuple[Manifest, Tokenizer]]:
    import copy

    out: dict[str, tuple[Manifest, Tokenizer]] = {}
    d = tmp_path_factory.mktemp("zoo")
    for kind in KINDS:
        path = save(kind, d / f"{kind}.json")
        data = copy.deepcopy(_example_data)
        data["workload"]["trace"]["path"] = str(
            Path(__file__).resolve().parents[2] / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
        )
        data["tokenizer"] = {**data["tokenizer"], "kind": "huggingface", "path": str(path)}
        out[kind] = (manifest_from_data(data), Tokenizer.from_file(str(path)))
    return out


def server_count(m: Manifest, hf: Tokenizer, api: Api, text: str) -> int:
    """What vLLM's tokenizer would say, computed here without the builder's own code."""
    if api == "completions":
        return len(hf.encode(text, add_special_tokens=True).ids)
    from core.tokenizer import apply_chat_template

    rendered = apply_chat_template(
        m.tokenizer.chat_template, [{"role": "user", "content": text}], dict(m.tokenizer.special_tokens)
    )
    return len(hf.encode(rendered, add_special_tokens=False).ids)


def req(i: int, n: int, hashes: tuple[int, ...] | None = None) -> ScheduledRequest:
    return ScheduledRequest(i, 0.0, n, 8, hashes, i, False)


def test_filler_words_are_several_tokens(zoo: dict[str, tuple[Manifest, Tokenizer]]) -> None:
    # The case that broke the word-per-token builder: ~3 tokens per filler word.
    from core.tokenizer import VOCAB

    _, hf = zoo["byte_bpe"]
    assert len(hf.encode(" ".join(VOCAB)).ids) / len(VOCAB) > 2.5


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("kind", KINDS)
def test_long_prompts_exact(zoo: dict[str, tuple[Manifest, Tokenizer]], kind: str, api: Api) -> None:
    m, hf = zoo[kind]
    b = PromptBuilder(m, api)
    for i, n in enumerate((2048, MAX_TOKENS, b.overhead + 1, 777)):
        p = b.build(req(i, n))
        assert p.exact and p.tokens == n == server_count(m, hf, api, p.text), (kind, api, n)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_length_any_tokenizer(zoo: dict[str, tuple[Manifest, Tokenizer]], data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(KINDS), label="kind")
    api: Api = data.draw(st.sampled_from(["completions", "chat"]), label="api")
    n = data.draw(st.integers(1, MAX_TOKENS), label="tokens")
    n_blocks = -(-n // BLOCK_TOKENS)  # a trace's hash ids cover the whole prompt
    blocks = data.draw(
        st.none() | st.lists(st.integers(0, 50), min_size=n_blocks, max_size=n_blocks + 1).map(tuple), label="hash_ids"
    )
    rid = data.draw(st.integers(0, 10**6), label="request_id")
    m, hf = zoo[kind]
    b = PromptBuilder(m, api)
    p = b.build(req(rid, n, blocks))
    if n < b.overhead:
        assert p.text == "" and not p.exact and p.tokens == b.overhead
    else:
        assert p.exact and p.tokens == n == server_count(m, hf, api, p.text)


@pytest.mark.parametrize("kind", KINDS)
def test_shared_prefix_blocks_give_the_same_tokens(zoo: dict[str, tuple[Manifest, Tokenizer]], kind: str) -> None:
    m, hf = zoo[kind]
    b = PromptBuilder(m, "completions")

    def ids(r: ScheduledRequest) -> list[int]:
        return hf.encode(b.build(r).text, add_special_tokens=True).ids

    a, c, d = ids(req(1, 1100, (5, 6, 7))), ids(req(2, 700, (5, 6))), ids(req(3, 1100, (9, 6, 7)))
    shared = 1 + BLOCK_TOKENS + 100  # BOS, block 5, most of block 6 (the cut may change the last tokens)
    assert a[:shared] == c[:shared]
    assert a[1 : 1 + BLOCK_TOKENS] != d[1 : 1 + BLOCK_TOKENS]
    # Block 6 after a different first block: the same tokens at the same position.
    assert a[1 + BLOCK_TOKENS : 1 + 2 * BLOCK_TOKENS] == d[1 + BLOCK_TOKENS : 1 + 2 * BLOCK_TOKENS]
    u1, u2 = ids(req(10, 300)), ids(req(11, 300))
    assert u1[:50] != u2[:50]  # no block ids: no accidental sharing
