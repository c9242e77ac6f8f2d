"""Deterministic output text and OpenAI-exact stop-string handling.

Each output token is one word of core.tokenizer.VOCAB, chosen by a PRNG seeded from the
generation seed and the prompt, so the same request always yields the same text and the
word tokenizer counts exactly one token per word.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from core.tokenizer import VOCAB


class TokenStream:
    def __init__(self, seed: int, prompt: str, stop: Sequence[str] = ()):
        digest = hashlib.sha256(f"{seed}\x00{prompt}".encode()).digest()
        self._rng = random.Random(int.from_bytes(digest[:8], "big"))
        self._stop = tuple(s for s in stop if s)
        self._text = ""  # everything generated so far (only kept when stops are set)
        self._sent = 0  # characters of _text already released to the client
        self.count = 0

    def next_token(self) -> tuple[str, bool]:
        """The text to release for the next token, and whether a stop string ended the output.

        With stop strings, text that could be the start of a stop string is held back (as
        vLLM does), so the stop string never reaches the client; it is released later if the
        match fails.
        """
        word = self._rng.choice(VOCAB)
        piece = word if self.count == 0 else " " + word
        self.count += 1
        if not self._stop:
            return piece, False
        self._text += piece
        text = self._text
        search_from = max(0, self._sent - max(len(s) for s in self._stop))
        hits = [i for s in self._stop if (i := text.find(s, search_from)) != -1]
        if hits:
            cut = min(hits)
            out = text[self._sent : cut]
            self._sent = cut
            return out, True
        hold = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        end = len(text) - hold
        out = text[self._sent : end] if end > self._sent else ""
        self._sent = max(self._sent, end)
        return out, False

    def flush(self) -> str:
        """Held-back text released when the output ends by length."""
        out = self._text[self._sent :] if self._stop else ""
        self._sent = len(self._text)
        return out
