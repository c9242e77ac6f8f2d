"""Synthetic prompts with an exact token count under the manifest's tokenizer.

With the chat API the count is taken on the prompt as the server will see it: the manifest's
chat template rendered around the message (never a default template or tokenizer). Requests
whose trace carries prefix-cache block ids reuse the same text for the same id, so a server's
prefix cache sees the reuse the trace recorded.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from campaign.errors import CampaignError
from campaign.manifest import Manifest
from campaign.tokenizer import VOCAB, Tokenizer, apply_chat_template, for_manifest
from loadgen.schedule import ScheduledRequest
from loadgen.traces import BLOCK_TOKENS

Api = Literal["chat", "completions"]
_MAX_ADJUST = 12


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


@lru_cache(maxsize=4096)
def _block_words(hash_id: int) -> tuple[str, ...]:
    rng = random.Random(f"block:{hash_id}")
    return tuple(rng.choices(VOCAB, k=BLOCK_TOKENS))


class PromptBuilder:
    def __init__(self, manifest: Manifest, api: Api = "chat", tokenizer: Tokenizer | None = None):
        self.api: Api = api
        self.tokenizer = tokenizer or for_manifest(manifest)
        self.template = manifest.tokenizer.chat_template
        self.special = dict(manifest.tokenizer.special_tokens)
        self.seed = manifest.workload.sample_seed
        self.overhead = self.count("")

    def render(self, content: str) -> str:
        if self.api == "chat":
            return apply_chat_template(self.template, [{"role": "user", "content": content}], self.special)
        return content

    def count(self, content: str) -> int:
        # vLLM tokenizes a completions prompt with the tokenizer's special tokens (BOS) and a
        # rendered chat prompt without them: count the way the server will.
        return self.tokenizer.count(self.render(content), add_special_tokens=self.api == "completions")

    def _words(self, req: ScheduledRequest, n: int) -> list[str]:
        words: list[str] = []
        for h in req.hash_ids or ():
            words.extend(_block_words(h))
        if len(words) < n:
            # Unique per request (and per fleet-independent request_id): no accidental prefix hits.
            rng = random.Random(f"req:{self.seed}:{req.request_id}")
            words.extend(rng.choices(VOCAB, k=n - len(words)))
        return words[:n]

    def build(self, req: ScheduledRequest) -> Prompt:
        target = req.input_tokens
        want = target - self.overhead
        if want <= 0:
            return Prompt(self.api, "", self.overhead, target == self.overhead)
        pool = self._words(req, want + 64)  # margin for tokenizers that merge words
        k = want
        for _ in range(_MAX_ADJUST):
            text = " ".join(pool[:k])
            got = self.count(text)
            if got == target:
                return Prompt(self.api, text, got, True)
            k = max(1, min(len(pool), k + (target - got)))
        raise PromptError(f"request {req.request_id}: cannot reach exactly {target} tokens (last try {got})")
