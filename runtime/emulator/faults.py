"""Per-request fault draws, deterministic in (fault_seed, arrival index)."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from runtime.emulator.config import FaultConfig


@dataclass(frozen=True)
class RequestFaults:
    error: bool = False
    reset_at: int | None = None  # output-token index after which the connection is reset
    truncate_at: int | None = None  # output-token index after which the stream just ends
    stall_at: int | None = None  # output-token index before which the sequence pauses
    stall_s: float = 0.0
    first_token_delay_s: float = 0.0

    @property
    def any(self) -> bool:
        return (
            self.error
            or self.reset_at is not None
            or self.truncate_at is not None
            or self.stall_at is not None
            or self.first_token_delay_s > 0
        )


NO_FAULTS = RequestFaults()


def draw(cfg: FaultConfig, request_index: int, max_tokens: int) -> RequestFaults:
    if not (cfg.error_rate or cfg.reset_rate or cfg.truncate_rate or cfg.stall_rate or cfg.slow_start_s):
        return NO_FAULTS
    digest = hashlib.sha256(f"{cfg.fault_seed}:{request_index}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    # Draw every decision in a fixed order so one rate never shifts another's outcomes.
    error, reset, truncate, stall, slow = (rng.random() for _ in range(5))
    mid = max(1, max_tokens // 2)  # mid-stream: half-way, but after at least one token
    if error < cfg.error_rate:
        return RequestFaults(error=True)
    return RequestFaults(
        reset_at=mid if reset < cfg.reset_rate else None,
        truncate_at=mid if truncate < cfg.truncate_rate else None,
        stall_at=mid if stall < cfg.stall_rate and max_tokens > 1 else None,
        stall_s=cfg.stall_s,
        first_token_delay_s=cfg.slow_start_s if slow < cfg.slow_start_rate else 0.0,
    )
