"""Prompt synthesis time for a manifest's whole schedule: every request's exact-length prompt,
as `Replayer.prepare` builds them before the clock starts. Prints figures; asserts nothing.

    .venv/bin/python -m bench.prompt_build [MANIFEST] [--tokenizer tokenizer.json] [--runs 5]

`--tokenizer` swaps in a Hugging Face tokenizer.json (tokenizer.kind huggingface) for the
manifest's own, e.g. to time a byte-level BPE whose filler words are several tokens each.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from core.manifest import load_manifest
from core.schedule import build_schedule
from core.tokenizer import HuggingFaceTokenizer, Tokenizer
from loadgen.prompts import PromptBuilder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("manifest", nargs="?", default="manifests/llama3-8b-inf2-vs-g6.yaml")
    ap.add_argument("--tokenizer", type=Path, help="a tokenizer.json to use instead of the manifest's tokenizer")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    m = load_manifest(Path(a.manifest))
    tok: Tokenizer | None = HuggingFaceTokenizer(a.tokenizer) if a.tokenizer else None
    schedule = build_schedule(m)
    tokens = sum(r.input_tokens for r in schedule)
    print(
        f"{a.manifest}: {len(schedule)} requests, {tokens:,} prompt tokens; tokenizer {a.tokenizer or m.tokenizer.kind}"
    )
    for api in ("chat", "completions"):
        times = []
        for _ in range(a.runs):
            t = time.perf_counter()
            b = PromptBuilder(m, api, tok)
            for r in schedule:
                b.build(r)
            times.append(time.perf_counter() - t)
        med = statistics.median(times)
        print(
            f"  {api:<11} median {med * 1e3:7.1f} ms over {a.runs} runs (range {min(times) * 1e3:.1f}-{max(times) * 1e3:.1f}); "
            f"{med / len(schedule) * 1e3:.2f} ms per request, {tokens / med / 1e6:.2f} M prompt tokens/s"
        )


if __name__ == "__main__":
    main()
