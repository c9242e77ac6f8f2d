from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from campaign.manifest import Manifest, load_manifest, manifest_from_data
from campaign.tokenizer import apply_chat_template, for_manifest
from loadgen.prompts import PromptBuilder
from loadgen.schedule import ScheduledRequest


def req(i: int, n: int, hashes: tuple[int, ...] | None = None) -> ScheduledRequest:
    return ScheduledRequest(i, 0.0, n, 8, hashes, i, False)


@pytest.mark.parametrize("n", [9, 10, 100, 777, 2048])
def test_chat_prompt_has_exact_tokens_through_template(manifest: Manifest, n: int) -> None:
    p = PromptBuilder(manifest, "chat").build(req(1, n))
    rendered = apply_chat_template(manifest.tokenizer.chat_template, [{"role": "user", "content": p.text}], dict(manifest.tokenizer.special_tokens))
    assert for_manifest(manifest).count(rendered) == n == p.tokens and p.exact


def test_completions_prompt_exact(manifest: Manifest) -> None:
    p = PromptBuilder(manifest, "completions").build(req(3, 321))
    assert for_manifest(manifest).count(p.text) == 321 and p.payload_fields() == {"prompt": p.text}


def test_manifest_template_is_used_not_a_default(manifest_data: dict[str, Any]) -> None:
    # A template with four extra words costs four tokens: the builder must notice.
    data = dict(manifest_data)
    data["tokenizer"] = {**data["tokenizer"], "chat_template": "{{ bos }}system says hello there {% for m in messages %}{{ m.content }}{% endfor %}"}
    m = manifest_from_data(data)
    b = PromptBuilder(m, "chat")
    assert b.overhead == 5  # bos + 4 words
    p = b.build(req(1, 50))
    assert len(p.text.split()) == 45 and b.count(p.text) == 50


def test_huggingface_kind_never_falls_back(manifest_data: dict[str, Any], tmp_path: Path) -> None:
    tok = tmp_path / "tokenizer.json"
    tok.write_text("{}")
    data = dict(manifest_data)
    data["tokenizer"] = {**data["tokenizer"], "kind": "huggingface", "path": str(tok)}
    m = manifest_from_data(data)
    with pytest.raises((RuntimeError, OSError, ValueError)):  # missing package or bad file: never a default
        PromptBuilder(m, "chat")


def test_shared_prefix_blocks(manifest: Manifest) -> None:
    b = PromptBuilder(manifest, "completions")
    a = b.build(req(1, 1100, (5, 6, 7))).text.split()
    c = b.build(req(2, 700, (5, 6))).text.split()
    d = b.build(req(3, 700, (9, 6))).text.split()
    assert a[:700] == c  # same block ids -> same text
    assert a[:512] != d[:512] and a[512:700] == d[512:700]  # block 6 reused at the same position
    u1, u2 = b.build(req(10, 300)).text, b.build(req(11, 300)).text
    assert u1 != u2  # no block ids: no accidental sharing


def test_below_template_overhead_is_flagged(manifest: Manifest) -> None:
    b = PromptBuilder(manifest, "chat")
    p = b.build(req(1, 2))
    assert p.text == "" and p.tokens == b.overhead and not p.exact


def test_example_manifest_loads(example_manifest_path: Path) -> None:
    assert load_manifest(example_manifest_path).tokenizer.kind == "emulator"
