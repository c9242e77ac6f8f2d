"""Live progress of a running campaign, read from the records the load generators flush.

Reading the records (not the load generators' memory) means the display shows exactly what
the analysis will see, and costs the load generators nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from core.quantiles import nearest_rank
from core.records import COMPLETED_OUTCOMES, ERROR_OUTCOMES, Outcome, latency_values, split_torn_tail
from loadgen.recording import fleet_records, in_stream_order


@dataclass
class FleetProgress:
    fleet: str
    scheduled: int
    done: int = 0
    failed: int = 0
    not_sent: int = 0
    ttfts: list[float] = field(default_factory=list)
    # what the capacity search's early stop needs (campaign.stages.capacity): errors as the error
    # rate counts them and the ITLs, non-warmup
    errors: int = 0
    itls: list[float] = field(default_factory=list)

    @property
    def ttft_p95_s(self) -> float | None:
        if not self.ttfts:
            return None
        return sorted(self.ttfts)[nearest_rank(len(self.ttfts), 0.95) - 1]  # as the report computes it


class RecordTail:
    """Follows `records-<fleet>-*.jsonl` files, reading only what was appended since last time:
    a local worker's growing file, or the parts a cloud worker uploads (each new part is read once,
    in sequence). The other two readers, loadgen.recording.read_records and
    analysis.sources.records, read finished files whole."""

    def __init__(self, records_dir: Path, fleet: str, scheduled: int):
        self.dir = records_dir
        self.progress = FleetProgress(fleet, scheduled)
        self._offsets: dict[Path, int] = {}

    def poll(self) -> FleetProgress:
        p = self.progress
        for path in in_stream_order(fleet_records(self.dir, p.fleet)):
            start = self._offsets.get(path, 0)
            with path.open("rb") as fh:
                fh.seek(start)
                chunk = fh.read()
            complete, _torn = split_torn_tail(chunk)  # a half-written last line waits for the next poll
            self._offsets[path] = start + len(complete)
            for line in complete.splitlines():
                if not line.strip():
                    continue
                r = json.loads(line)
                if r["outcome"] == Outcome.NOT_SENT.value:
                    p.not_sent += 1
                elif r["outcome"] in COMPLETED_OUTCOMES:
                    p.done += 1
                    if r.get("ttft_s") is not None and not r.get("warmup"):
                        p.ttfts.append(float(r["ttft_s"]))
                    if r.get("itl_s") is not None and not r.get("warmup"):
                        p.itls.append(float(r["itl_s"]))
                else:
                    p.failed += 1
                    p.errors += r["outcome"] in ERROR_OUTCOMES and not r.get("warmup")
                    if r["outcome"] == Outcome.SLO_ABANDONED.value and not r.get("warmup"):
                        ttft, itl = latency_values(
                            r["outcome"], r.get("ttft_s"), r.get("itl_s"), r.get("e2e_s"), int(r.get("max_tokens") or 0)
                        )
                        p.ttfts += [ttft] if ttft is not None else []
                        p.itls += [itl] if itl is not None else []
        return p


def render(rows: list[FleetProgress], elapsed_s: float) -> str:
    parts = [f"[{elapsed_s:5.0f} s]"]
    for p in rows:
        p95 = f"{p.ttft_p95_s * 1000:.0f} ms" if p.ttft_p95_s is not None else "-"
        parts.append(f"{p.fleet}: {p.done + p.failed}/{p.scheduled} done, {p.failed} failed, TTFT p95 {p95}")
    return "  ".join(parts)
