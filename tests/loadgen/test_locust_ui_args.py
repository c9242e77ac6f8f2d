"""The Locust web UI must not offer the harness's own options as editable fields: the run
request fixes manifest, fleet, records directory and S3 prefix, and a value changed in the UI
would be sent to the workers and measure something other than what the records claim."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

PROBE = (
    "import json, loadgen.locustfile\n"
    "from locust.argument_parser import default_args_dict, get_parser, ui_extra_args_dict\n"
    "ours = sorted(set(vars(get_parser().parse_args([]))) - set(default_args_dict()))\n"
    "print(json.dumps({'ours': ours, 'ui': sorted(ui_extra_args_dict([]))}))\n"
)


def test_no_loadgen_option_is_a_web_ui_field() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, timeout=120, check=True
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"manifest", "fleet", "records_dir", "s3_uri", "run_id"} <= set(seen["ours"])
    assert seen["ui"] == []
