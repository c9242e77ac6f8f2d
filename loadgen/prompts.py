"""Synthetic prompts with an exact token count under the manifest's tokenizer.

With the chat API the count is taken on the prompt as the server will see it: the manifest's
chat template rendered around the message (never a default template or tokenizer). Requests
whose trace carries prefix-cache block ids reuse the same text for the same id, so a server's
prefix cache sees the reuse the trace recorded.

Nothing here assumes a word is one token: filler text is cut at the tokenizer's own token
boundaries (`Tokenizer.token_ends`) and the cut moves until the server-side count is exact, so a
byte-level BPE that splits every filler word into three pieces gets exact lengths as well as
the emulator's one-token-per-word tokenizer. A prefix-cache block is the first BLOCK_TOKENS
tokens of its own filler text; every filler word starts with a space, so a block never merges
with its neighbours and the same block ids give the same leading tokens.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Literal

from core.errors import CampaignError
from core.manifest import Manifest
from core.schedule import ScheduledRequest
from core.tokenizer import VOCAB, Tokenizer, apply_chat_template, for_manifest
from core.traces import BLOCK_TOKENS

Api = Literal["chat", "completions"]
_MARGIN = 16  # filler tokens beyond the target, so the cut can move either way
_MAX_STEPS = 8  # count-and-correct steps on one text
# Ends tried around the cut when the count steps over the target (a merge at the cut or at the
# template's seam makes one more piece cost 0 or 2 tokens).
_SUFFIXES = ("", ".", " a", ",", "!", " x")
_ATTEMPTS = 4  # filler texts tried (a fresh per-request tail each) before giving up
_BLOCK_CACHE = 4096


class PromptError(CampaignError, ValueError):
    pass


@dataclass(frozen=True)
class Prompt:
    api: Api
    text: str  # completions: the prompt; chat: the user message content
    tokens: int  # tokens of what the server tokenizes (the rendered template for chat)
    exact: bool  # False only when the target is below the chat template's own overhead

    def payload_fields(self) -> dict[str, Any]:
        if self.api == "chat":
            return {"messages": [{"role": "user", "content": self.text}]}
        return {"prompt": self.text}


def _filler(rng: random.Random, n_words: int) -> str:
    # A leading space on every word: each block or tail starts at a word boundary.
    return " " + " ".join(rng.choices(VOCAB, k=n_words))


class PromptBuilder:
    def __init__(self, manifest: Manifest, api: Api = "chat", tokenizer: Tokenizer | None = None):
        self.api: Api = api
        self.tokenizer = tokenizer or for_manifest(manifest)
        self.template = manifest.chat_template
        self.special = dict(manifest.tokenizer.special_tokens)
        self.seed = manifest.workload.sample_seed
        self.overhead = self.count("")
        # Filler words per token under this tokenizer, so one encoding usually covers a target.
        sample = _filler(random.Random("calibrate"), 256)
        self._tokens_per_word = max(1.0, len(self.tokenizer.token_ends(sample)) / 256)
        self._blocks: dict[int, str] = {}

    def render(self, content: str) -> str:
        if self.api == "chat":
            return apply_chat_template(self.template, [{"role": "user", "content": content}], self.special)
        return content

    def count(self, content: str) -> int:
        # vLLM tokenizes a completions prompt with the tokenizer's special tokens (BOS) and a
        # rendered chat prompt without them: count the way the server will.
        return self.tokenizer.count(self.render(content), add_special_tokens=self.api == "completions")

    def _extend(self, text: str, rng: random.Random, tokens: int, have: int = 0) -> tuple[str, list[int]]:
        """`text` followed by filler until it has at least `tokens` tokens (`have`: the tokens
        `text` is known to hold); returns it with the end offset of each of its tokens."""
        while True:
            missing = tokens - have
            if missing > 0:
                # 10% over the calibrated rate: one encoding nearly always covers the target.
                text += _filler(rng, math.ceil(1.1 * missing / self._tokens_per_word) + 4)
            ends = self.tokenizer.token_ends(text)
            if len(ends) >= tokens:
                return text, ends
            have = len(ends)

    def _block(self, hash_id: int) -> str:
        text = self._blocks.get(hash_id)
        if text is None:
            full, ends = self._extend("", random.Random(f"block:{hash_id}"), BLOCK_TOKENS)
            text = full[: ends[BLOCK_TOKENS - 1]]
            if len(self._blocks) >= _BLOCK_CACHE:
                self._blocks.clear()
            self._blocks[hash_id] = text
        return text

    def _source(self, req: ScheduledRequest, tokens: int, attempt: int) -> tuple[str, list[int]]:
        """The request's blocks, then filler unique to the request (and to `attempt`)."""
        prefix, covered = "", 0
        for h in req.hash_ids or ():
            if covered >= tokens:
                break
            prefix += self._block(h)
            covered += BLOCK_TOKENS
        # Unique per request (and per fleet-independent request_id): no accidental prefix hits.
        salt = f":{attempt}" if attempt else ""
        return self._extend(prefix, random.Random(f"req:{self.seed}:{req.request_id}{salt}"), tokens, covered)

    def _fit(self, source: str, ends: list[int], want: int, target: int) -> str | None:
        """A prefix of `source`, cut at a token boundary (plus at most a short end), that the
        server counts as exactly `target` tokens; None when no cut near `want` gets there."""
        tried: set[int] = set()
        k = want
        for _ in range(_MAX_STEPS):
            text = source[: ends[k - 1]]
            got = self.count(text)
            if got == target:
                return text
            tried.add(k)
            k = min(len(ends), max(1, k + target - got))
            if k in tried:
                break
        for near in sorted(range(max(1, k - 3), min(len(ends), k + 3) + 1), key=lambda c: abs(c - k)):
            for suffix in _SUFFIXES:
                if suffix or near not in tried:
                    text = source[: ends[near - 1]] + suffix
                    if self.count(text) == target:
                        return text
        return None

    def build(self, req: ScheduledRequest) -> Prompt:
        target = req.input_tokens
        want = target - self.overhead
        if want <= 0:
            return Prompt(self.api, "", self.overhead, target == self.overhead)
        for attempt in range(_ATTEMPTS):
            source, ends = self._source(req, want + _MARGIN, attempt)
            text = self._fit(source, ends, want, target)
            if text is not None:
                return Prompt(self.api, text, target, True)
        raise PromptError(
            f"request {req.request_id}: no prompt of exactly {target} tokens under the manifest's tokenizer after {_ATTEMPTS} filler texts"
        )
