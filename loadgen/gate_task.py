"""A cloud campaign's first task per fleet, inside the VPC: wait until the fleet serves, then run
the quality gate's fixtures against it, and write what it saw to S3.

`python -m loadgen.task_entry --gate` runs it after staging and checking the run's inputs. The
fleets' NLB is internal, so the operator's machine cannot reach it; this task can.

Ready means: `GET <host>/v1/models` through the NLB answers 200 and names the id the fleet's
stack serves the model as (core.serving.served_model_id: vLLM's `--served-model-name`, model.repo;
trtllm-serve's weights directory name). An ASG can report healthy targets while the server still
loads or compiles; the model list answers only once the server is up.
The wait ends after `LOADGEN_READY_TIMEOUT_S` (set by `campaign run` from the fleet's health
grace). The result, `<run>/gate-<fleet>.json`, says how long it took (`ready_after_s`) and what
the last probe saw, and holds the gate's `GateResult` when the fleet became ready.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from core import cloud_contract as cc
from core.manifest import Manifest
from core.serving import served_model_id
from loadgen.resolver import RESOLVER_ENV, resolved_url

ENV_READY_TIMEOUT = "LOADGEN_READY_TIMEOUT_S"
READY_POLL_S = 5.0


@dataclass(frozen=True)
class Readiness:
    ready: bool
    after_s: float
    seen: str  # the last probe's answer or error, for the operator when the fleet never came up


def probe_models(host: str, timeout_s: float = 5.0) -> tuple[list[str] | None, str]:
    """The model ids `/v1/models` lists, or None and why not."""
    url = host.rstrip("/") + "/v1/models"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return None, f"GET {url}: HTTP {exc.code}"
    except (OSError, ValueError) as exc:  # refused, reset, timeout, not JSON
        return None, f"GET {url}: {exc}"
    ids = [str(d.get("id")) for d in body.get("data", []) if isinstance(d, dict)] if isinstance(body, dict) else []
    return ids, f"GET {url}: models {ids}"


def wait_until_serving(
    host: str,
    model: str,
    timeout_s: float,
    *,
    poll_s: float = READY_POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    resolver: str | None = None,
) -> Readiness:
    """`resolver`: where the host name's addresses come from, as for the replay (each probe looks
    the name up again: an NLB node that leaves the DNS answer is left too)."""
    t0 = clock()
    while True:
        try:
            ids, seen = probe_models(resolved_url(host, resolver))
        except (OSError, ValueError) as exc:  # the answer source is down or answered nothing usable
            ids, seen = None, f"{host}: its address could not be looked up: {exc}"
        if ids is not None and model in ids:
            return Readiness(True, clock() - t0, seen)
        if ids is not None:
            seen += f" (not {model!r})"
        if clock() - t0 + poll_s > timeout_s:
            return Readiness(False, clock() - t0, seen)
        sleep(poll_s)


def gate_key(fleet: str) -> str:
    return f"{cc.GATE_PREFIX}{fleet}.json"


def run(m: Manifest, env: Mapping[str, str], s3: Any) -> dict[str, Any]:
    """Readiness, then the gate (when ready); writes and returns `<run>/gate-<fleet>.json`."""
    from loadgen.fixtures import run_gate

    fleet, host = env[cc.ENV_FLEET], env[cc.ENV_HOST]
    resolver = env.get(RESOLVER_ENV) or None  # offline: a stand-in for the NLB's DNS (loadgen/resolver.py)
    timeout = float(env.get(ENV_READY_TIMEOUT) or 600)
    ready = wait_until_serving(host, served_model_id(m, m.fleet(fleet)), timeout, resolver=resolver)
    out: dict[str, Any] = {
        "fleet": fleet,
        "ready": ready.ready,
        "ready_after_s": ready.after_s,
        "seen": ready.seen,
        "gate": None,
    }
    if ready.ready:
        out["gate"] = run_gate(m, fleet, resolved_url(host, resolver)).as_dict()
    bucket, prefix = cc.split_s3_uri(cc.run_uri(env[cc.ENV_RESULTS_URI], env[cc.ENV_RUN_ID]))
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{gate_key(fleet)}", Body=json.dumps(out, indent=2).encode())
    return out
