"""Each AWS API call a process of an offline run makes, recorded as its caller's, for
testing/iam_policy.py to evaluate against the caller's role (issue 49).

Every actor's process (the operator's, the conductor's, each task's) is given its own access key
id, its role's name (moto takes any), and `environment(calls_dir)`: botocore's client plugin hook
(botocore/plugin.py, BOTOCORE_EXPERIMENTAL__PLUGINS, `name=module`) then calls
`initialize_client_plugin` on every client the process makes, which records each call's operation
and parameters as the user gave them (`before-parameter-build`, before serialization) under the
access key that signs it, one JSON line per call, to `calls_dir/calls-<pid>.jsonl`. One hook for
every process, whatever code makes the call: no client of the project is wrapped.

The hook swallows a plugin's exceptions (logged at debug), so a recorder that failed would record
nothing; `testing.cloud_offline` therefore fails a run in which an actor that must have called
AWS recorded nothing.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CALLS_DIR_ENV = "HARNESS_IAM_CALLS_DIR"
PLUGIN_ENV = "BOTOCORE_EXPERIMENTAL__PLUGINS"
PLUGIN = "harness_iam_recorder=testing.iam_recorder"
# what a call's record leaves out: payloads (bytes, files), which no authorization looks at
PAYLOADS = frozenset({"Body", "MetricData"})

_lock = threading.Lock()


def environment(calls_dir: Path) -> dict[str, str]:
    """The variables that make every botocore client of a process record its calls in `calls_dir`."""
    return {CALLS_DIR_ENV: str(calls_dir), PLUGIN_ENV: PLUGIN}


def initialize_client_plugin(client: Any) -> None:
    """botocore's plugin entry point: record each of `client`'s calls (see the module's docstring)."""
    where = os.environ.get(CALLS_DIR_ENV)
    if not where:
        return
    service = client.meta.service_model.service_name  # boto3's client name: s3, elbv2, servicediscovery

    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        credentials = client._request_signer._credentials  # the key that signs this call
        line = {
            "actor": credentials.access_key if credentials is not None else "",
            "service": service,
            "operation": model.name,
            "params": {k: v for k, v in params.items() if k not in PAYLOADS},
        }
        text = json.dumps(line, default=str) + "\n"
        with _lock, (Path(where) / f"calls-{os.getpid()}.jsonl").open("a", encoding="utf-8") as fh:
            fh.write(text)

    client.meta.events.register("before-parameter-build", record)


def read(calls_dir: Path) -> Iterator[dict[str, Any]]:
    """Every call recorded in `calls_dir`, process by process."""
    for path in sorted(calls_dir.glob("calls-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                yield json.loads(line)
