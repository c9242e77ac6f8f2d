from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from core.manifest import load_manifest
from core.tokenizer import WordTokenizer, apply_chat_template, for_manifest


def test_special_tokens_count_as_one(example_manifest_path: Path) -> None:
    m = load_manifest(example_manifest_path)
    tok = for_manifest(m)
    assert tok.count("<|begin_of_text|>hello world<|eot_id|>") == 4
    assert tok.encode("a  b\n c") == ["a", "b", "c"]


def test_chat_template_is_the_manifests(example_manifest_path: Path) -> None:
    m = load_manifest(example_manifest_path)
    text = apply_chat_template(
        m.tokenizer.chat_template, [{"role": "user", "content": "hi there"}], m.tokenizer.special_tokens
    )
    assert text.startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|> hi there <|eot_id|>")
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>")
    # bos, header open/close around the role... every special is a single token.
    assert for_manifest(m).count(text) == 1 + 3 + 2 + 1 + 3


def test_longest_special_token_wins() -> None:
    tok = WordTokenizer(["<|a|>", "<|a|><|b|>"])
    assert tok.encode("<|a|><|b|>x") == ["<|a|><|b|>", "x"]


_SPECIALS = ["<|begin_of_text|>", "<|eot_id|>", "[INST]", "a<b"]


def _reference_words(text: str) -> list[str]:
    """The word tokenizer's definition spelled out the slow way: a special token (longest
    first, or any `<|name|>`) is one token; otherwise a run of non-space characters that
    stops where a special token starts."""
    specials = sorted(_SPECIALS, key=len, reverse=True)
    out, i, word = [], 0, ""
    generic = re.compile(r"<\|[^|\s]+\|>")
    while i < len(text):
        hit = next((s for s in specials if text.startswith(s, i)), None)
        m = generic.match(text, i) if hit is None else None
        if hit or m:
            if word:
                out.append(word)
                word = ""
            tok = hit or m.group(0)  # type: ignore[union-attr]
            out.append(tok)
            i += len(tok)
        elif text[i].isspace():
            if word:
                out.append(word)
                word = ""
            i += 1
        else:
            word += text[i]
            i += 1
    return [*out, word] if word else out


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from([*"ab<|>[]INST -_x", " ", "\n", *_SPECIALS, "<|foo|>"]), max_size=24).map("".join))
def test_word_tokenizer_matches_its_definition(text: str) -> None:
    tok = WordTokenizer(_SPECIALS)
    assert tok.encode(text) == _reference_words(text)
    assert tok.count(text) == len(tok.encode(text))
    ends = tok.token_ends(text)
    assert [text[a:b].strip() for a, b in zip([0, *ends], ends, strict=False)] == tok.encode(text)
