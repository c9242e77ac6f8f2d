"""The manifest's tokenizer and chat template, shared by the emulator and the load generator.

A local campaign has no real checkpoint, so it uses the "emulator" tokenizer: special tokens
named in the manifest are one token each, everything else is one token per whitespace-
separated word. Both sides count with this same code, so prompt lengths are exact. Nothing
else assumes a word is a token: the prompt builder cuts its texts at the token boundaries
that `token_ends` reports, so any tokenizer gets exact lengths. A
"huggingface" tokenizer loads the checkpoint's tokenizer.json through the `tokenizers`
package when it is installed; nothing ever falls back to a default tokenizer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from itertools import accumulate
from pathlib import Path
from typing import Protocol

from jinja2 import Template
from jinja2.sandbox import ImmutableSandboxedEnvironment

from core.manifest import Manifest


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[str]: ...

    # add_special_tokens: what the server adds around a raw completions prompt (e.g. BOS).
    # A chat prompt is counted without: the rendered template already carries them.
    def count(self, text: str, *, add_special_tokens: bool = False) -> int: ...

    # The character offset where each token of `text` ends (no special tokens added): the prompt
    # builder cuts texts at token boundaries with it, whatever the tokenizer's pieces are.
    def token_ends(self, text: str) -> list[int]: ...


class WordTokenizer:
    """Special tokens (the manifest's, and any `<|name|>` marker) are one token each; the rest
    is one token per run of non-space characters, a run ending where a special token starts."""

    def __init__(self, special_tokens: Sequence[str] = ()):
        specials = sorted({s for s in special_tokens if s}, key=len, reverse=True)
        special = "|".join([*(re.escape(s) for s in specials), r"<\|[^|\s]+\|>"])
        # Only a character that can start a special token needs the look-ahead; the others are
        # matched by a plain class (the same tokens, several times faster on long prompts).
        starts = re.escape("".join(sorted({"<", *(s[0] for s in specials)})))
        token = f"(?:{special})|(?:[^\\s{starts}]|(?!{special})[{starts}])+"
        self._re = re.compile(token)
        # Each token with the whitespace before it: the matches tile the text up to the last
        # token, so their cumulative lengths are the tokens' end offsets (no Python loop).
        self._spaced = re.compile(f"\\s*(?:{token})")
        self.special_tokens = tuple(specials)

    def encode(self, text: str) -> list[str]:
        return self._re.findall(text)

    def count(self, text: str, *, add_special_tokens: bool = False) -> int:
        # The emulator adds nothing around a prompt, so the flag changes nothing here.
        return len(self._re.findall(text))

    def token_ends(self, text: str) -> list[int]:
        return list(accumulate(map(len, self._spaced.findall(text))))


class HuggingFaceTokenizer:
    def __init__(self, path: Path):
        try:
            from tokenizers import Tokenizer as _HF
        except ImportError as exc:
            raise RuntimeError("tokenizer.kind huggingface needs the 'tokenizers' package installed") from exc
        try:
            self._tok = _HF.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
            raise ValueError(f"tokenizer.path {path}: not a usable tokenizer.json ({exc})") from exc

    def encode(self, text: str) -> list[str]:
        return list(self._tok.encode(text, add_special_tokens=False).tokens)

    def count(self, text: str, *, add_special_tokens: bool = False) -> int:
        return len(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def token_ends(self, text: str) -> list[int]:
        return [end for _, end in self._tok.encode(text, add_special_tokens=False).offsets]


def for_manifest(m: Manifest) -> Tokenizer:
    t = m.tokenizer
    if t.kind == "emulator":
        return _word_tokenizer(tuple(sorted(t.special_tokens.values())))
    assert t.path is not None  # enforced by the manifest model
    return HuggingFaceTokenizer(m.resolve_path(t.path))


@lru_cache(maxsize=32)
def _word_tokenizer(specials: tuple[str, ...]) -> WordTokenizer:
    return WordTokenizer(specials)


_JINJA = ImmutableSandboxedEnvironment(keep_trailing_newline=True)


@lru_cache(maxsize=16)
def _compiled(template: str) -> Template:
    """Compiling costs milliseconds; the emulator renders once per request and the prompt
    builder once per prompt, always with the manifest's one template."""
    return _JINJA.from_string(template)


def apply_chat_template(template: str, messages: Sequence[Mapping[str, str]], special_tokens: Mapping[str, str]) -> str:
    """Render the manifest's chat template (Jinja, as Hugging Face chat templates are)."""
    return _compiled(template).render(messages=list(messages), add_generation_prompt=True, **dict(special_tokens))


# Deterministic filler vocabulary for synthetic prompts and emulator output: plain words,
# none of which collide with special tokens.
VOCAB: tuple[str, ...] = (
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "i",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "one",
    "all",
    "we",
    "their",
    "has",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "time",
    "model",
    "token",
    "fleet",
    "cost",
    "latency",
    "cache",
    "batch",
    "stream",
    "queue",
    "trace",
    "request",
    "server",
    "client",
    "metric",
    "alpha",
    "beta",
    "gamma",
    "delta",
    "sigma",
    "omega",
    "river",
    "stone",
    "cloud",
    "field",
    "light",
    "north",
    "south",
    "east",
    "west",
    "green",
    "blue",
)
