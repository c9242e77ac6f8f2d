from __future__ import annotations

from pathlib import Path

from campaign.manifest import load_manifest
from campaign.tokenizer import WordTokenizer, apply_chat_template, for_manifest


def test_special_tokens_count_as_one(example_manifest_path: Path) -> None:
    m = load_manifest(example_manifest_path)
    tok = for_manifest(m)
    assert tok.count("<|begin_of_text|>hello world<|eot_id|>") == 4
    assert tok.encode("a  b\n c") == ["a", "b", "c"]


def test_chat_template_is_the_manifests(example_manifest_path: Path) -> None:
    m = load_manifest(example_manifest_path)
    text = apply_chat_template(m.tokenizer.chat_template, [{"role": "user", "content": "hi there"}], m.tokenizer.special_tokens)
    assert text.startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|> hi there <|eot_id|>")
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>")
    # bos, header open/close around the role... every special is a single token.
    assert for_manifest(m).count(text) == 1 + 3 + 2 + 1 + 3


def test_longest_special_token_wins() -> None:
    tok = WordTokenizer(["<|a|>", "<|a|><|b|>"])
    assert tok.encode("<|a|><|b|>x") == ["<|a|><|b|>", "x"]
