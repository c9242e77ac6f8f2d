"""Before the first request: does the server count our prompts the way we do?

A prompt's length comes from the manifest's tokenizer and chat template. If the server runs a
different tokenizer, or renders a different template, every request is a different length
from the one the trace asked for, and the run measures the wrong workload. vLLM (and the
emulator) answer `POST /tokenize` with `count` for the same `prompt` or `messages` body the
generation endpoints take, with the same defaults (BOS for a prompt, the generation prompt for
messages), so a handful of sample prompts settles it before any money is spent. Servers
without `/tokenize` (TGI, TensorRT-LLM) are skipped with a reason; the records' prompt
mismatch rate still catches a disagreement after the run.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from core.errors import CampaignError
from loadgen.prompts import Prompt
from loadgen.resolver import resolved_url


class TokenizerMismatch(CampaignError, ValueError):
    pass


@dataclass(frozen=True)
class CheckResult:
    checked: int  # prompts the server counted
    skipped: str | None = None  # why the server could not be asked (no /tokenize, unreachable)


def tokenize_url(host: str) -> str:
    u = urlsplit(host)
    return f"{u.scheme}://{u.netloc}{u.path.rstrip('/')}/tokenize"


def _server_count(url: str, model: str, prompt: Prompt, timeout_s: float, api_key: str | None) -> int:
    body = {"model": model, **prompt.payload_fields()}
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        reply = json.loads(resp.read())
    count = reply.get("count") if isinstance(reply, dict) else None
    if not isinstance(count, int):
        raise ValueError(f"{url} answered without an integer 'count': {str(reply)[:200]}")
    return count


def check_prompt_counts(
    host: str,
    model: str,
    samples: Sequence[tuple[int, Prompt]],
    *,
    timeout_s: float = 10.0,
    api_key: str | None = None,
    resolver: str | None = None,
) -> CheckResult:
    """`samples` are (request_id, prompt). Raises TokenizerMismatch naming the first request
    whose count differs; returns a skip reason when the server has no usable /tokenize.
    `resolver`: where the host name's addresses come from, as for the replay (loadgen/resolver.py)."""
    try:
        url = tokenize_url(resolved_url(host, resolver))
    except (OSError, ValueError) as exc:  # the answer source is down or answered nothing usable
        return CheckResult(0, f"{host}: its address could not be looked up: {exc}")
    checked = 0
    for rid, prompt in samples:
        try:
            got = _server_count(url, model, prompt, timeout_s, api_key)
        except urllib.error.HTTPError as exc:
            if checked == 0 and exc.code in (404, 405, 501):
                return CheckResult(0, f"{url} answered HTTP {exc.code}: the server has no /tokenize")
            return CheckResult(checked, f"{url} answered HTTP {exc.code} for request {rid}")
        except (OSError, ValueError) as exc:  # refused, timed out, not JSON
            return CheckResult(checked, f"{url} unusable: {exc}")
        checked += 1
        if got != prompt.tokens:
            raise TokenizerMismatch(
                f"request {rid}: the manifest's tokenizer and chat template give {prompt.tokens} prompt tokens, "
                f"the server counts {got} ({url}); check tokenizer.path, tokenizer.chat_template and --api"
            )
    return CheckResult(checked)


def pick_samples(prompts: Sequence[tuple[int, Prompt]], n: int = 4) -> list[tuple[int, Prompt]]:
    """The shortest prompt (mostly template), the longest (most merges), and the first ones:
    deterministic, and cheap for the server."""
    if not prompts:
        return []
    by_len = sorted(prompts, key=lambda p: (p[1].tokens, p[0]))
    chosen = {by_len[0][0]: by_len[0], by_len[-1][0]: by_len[-1]}
    for rid, p in prompts:
        if len(chosen) >= n:
            break
        chosen.setdefault(rid, (rid, p))
    return sorted(chosen.values(), key=lambda x: x[0])
