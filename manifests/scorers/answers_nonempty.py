#!/usr/bin/env python3
"""Example buyer-owned scorer for quality.task_acceptance (replace it with your own task's).

Reads one fleet's fixture answers as JSONL on stdin, one object per line with the fields
fleet, id, prompt, output, finish_reason, completion_tokens, and prints the pass rate (the
share of answers accepted) as its last line. An answer passes when it has visible text and
the generation ended normally (finish_reason "stop" or "length"). A line that is not such an
object is an error naming the line (exit 2): a scorer must never pass what it could not read.
"""

from __future__ import annotations

import json
import sys


def accepted(answer: dict[str, object]) -> bool:
    return bool(str(answer.get("output") or "").strip()) and answer.get("finish_reason") in ("stop", "length")


def main() -> int:
    passed = total = 0
    for n, line in enumerate(sys.stdin, 1):
        if not line.strip():
            continue
        try:
            answer = json.loads(line)
        except ValueError as exc:
            print(f"stdin line {n}: not JSON: {exc}", file=sys.stderr)
            return 2
        if not isinstance(answer, dict) or "output" not in answer:
            print(f"stdin line {n}: not an answer object with an 'output' field", file=sys.stderr)
            return 2
        total += 1
        passed += accepted(answer)
    if total == 0:
        print("stdin: no answers to score", file=sys.stderr)
        return 2
    print(f"{passed / total:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
