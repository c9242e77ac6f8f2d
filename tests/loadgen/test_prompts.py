from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.manifest import Manifest, load_manifest, manifest_from_data
from core.schedule import ScheduledRequest
from core.tokenizer import apply_chat_template, for_manifest
from loadgen.prompts import PromptBuilder


def req(i: int, n: int, hashes: tuple[int, ...] | None = None) -> ScheduledRequest:
    return ScheduledRequest(i, 0.0, n, 8, hashes, i, False)


@pytest.mark.parametrize("n", [9, 10, 100, 777, 2048])
def test_chat_prompt_has_exact_tokens_through_template(manifest: Manifest, n: int) -> None:
    p = PromptBuilder(manifest, "chat").build(req(1, n))
    rendered = apply_chat_template(
        manifest.tokenizer.chat_template, [{"role": "user", "content": p.text}], dict(manifest.tokenizer.special_tokens)
    )
    assert for_manifest(manifest).count(rendered) == n == p.tokens and p.exact


def test_completions_prompt_exact(manifest: Manifest) -> None:
    p = PromptBuilder(manifest, "completions").build(req(3, 321))
    assert for_manifest(manifest).count(p.text) == 321 and p.payload_fields() == {"prompt": p.text}


def test_manifest_template_is_used_not_a_default(manifest_data: dict[str, Any]) -> None:
    # A template with four extra words costs four tokens: the builder must notice.
    data = dict(manifest_data)
    data["tokenizer"] = {
        **data["tokenizer"],
        "chat_template": "{{ bos }}system says hello there {% for m in messages %}{{ m.content }}{% endfor %}",
    }
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
    with pytest.raises(ValueError, match=r"tokenizer\.path"):  # a bad file is named, never replaced by a default
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


def _hf_tokenizer_json(path: Path) -> None:
    """A real `tokenizers` file shaped like Llama 3's: word-level vocabulary, and a post-
    processor that puts BOS in front of every encoded text when special tokens are added."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from core.tokenizer import VOCAB

    specials = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "[UNK]"]
    vocab = {w: i for i, w in enumerate([*specials, *VOCAB, "user", "assistant"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(specials[:4])
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)]
    )
    tok.save(str(path))


def test_huggingface_prompts_count_like_the_server(manifest_data: dict[str, Any], tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    path = tmp_path / "tokenizer.json"
    _hf_tokenizer_json(path)
    data = dict(manifest_data)
    data["tokenizer"] = {**data["tokenizer"], "kind": "huggingface", "path": str(path)}
    m = manifest_from_data(data)
    hf = Tokenizer.from_file(str(path))
    # Completions: the server adds BOS to the raw prompt, so 300 tokens is BOS + 299 words.
    p = PromptBuilder(m, "completions").build(req(1, 300))
    assert len(hf.encode(p.text, add_special_tokens=True).ids) == 300 and p.tokens == 300
    assert len(p.text.split()) == 299
    # Chat: the rendered template carries BOS itself; the server adds nothing more.
    c = PromptBuilder(m, "chat").build(req(2, 300))
    rendered = apply_chat_template(
        m.tokenizer.chat_template, [{"role": "user", "content": c.text}], dict(m.tokenizer.special_tokens)
    )
    assert len(hf.encode(rendered, add_special_tokens=False).ids) == 300 and c.exact
