"""The pre-run tokenizer check against servers that cannot answer it (the test SSE server has
no /tokenize; a closed port answers nothing). The emulator case is in test_emulator_replay."""

from __future__ import annotations

import socket

from core.manifest import Manifest
from core.schedule import ScheduledRequest
from loadgen.prompts import Prompt, PromptBuilder
from loadgen.tokenizer_check import check_prompt_counts, pick_samples, tokenize_url
from tests.loadgen.sse_server import SSEServer


def _prompts(m: Manifest, lengths: list[int]) -> list[tuple[int, Prompt]]:
    b = PromptBuilder(m, "chat")
    return [(i, b.build(ScheduledRequest(i, 0.0, n, 4, None, i, False))) for i, n in enumerate(lengths)]


def test_samples_cover_shortest_longest_and_first(manifest: Manifest) -> None:
    ps = _prompts(manifest, [50, 900, 20, 300, 40, 2000, 60])
    assert [rid for rid, _ in pick_samples(ps)] == [0, 1, 2, 5]
    assert pick_samples([]) == []


def test_url_keeps_a_path_prefix() -> None:
    assert tokenize_url("http://h:8000/") == "http://h:8000/tokenize"
    assert tokenize_url("https://gw.example/fleet-a") == "https://gw.example/fleet-a/tokenize"


def test_a_server_without_tokenize_is_skipped_with_a_reason(sse_server: SSEServer, manifest: Manifest) -> None:
    res = check_prompt_counts(sse_server.url, "m", _prompts(manifest, [50, 60]))
    assert res.checked == 0 and res.skipped is not None and "no /tokenize" in res.skipped


def test_an_unreachable_server_is_skipped_not_fatal(manifest: Manifest) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connection refused
        res = check_prompt_counts(f"http://127.0.0.1:{port}", "m", _prompts(manifest, [50]), timeout_s=2)
    assert res.checked == 0 and res.skipped is not None and "unusable" in res.skipped
