"""The deployed stack's run configuration (its LoadgenRunConfig output: cluster, subnets, task
definitions, results bucket; and its PrometheusQueryUrl output), as `campaign run`, `report
--run-id` and `teardown` read it, and the error a cloud run raises when a step of it fails."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from core import cloud_contract as cc
from core.errors import EXIT_FAILED_STEP, CampaignError


class CloudRunError(CampaignError, RuntimeError):
    exit_code = EXIT_FAILED_STEP


def read_run_config(cfn: Any, stack: str) -> cc.RunConfig:
    try:
        described = cfn.describe_stacks(StackName=stack)["Stacks"][0]
    except Exception as exc:  # botocore ClientError or no credentials: say which stack we looked for
        raise CloudRunError(f"cannot read stack {stack}: {exc}") from None
    outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
    if cc.RUN_CONFIG_OUTPUT not in outputs:
        raise CloudRunError(
            f"stack {stack} has no {cc.RUN_CONFIG_OUTPUT} output (outputs: {sorted(outputs)}): deploy with this version"
        )
    try:
        cfg = cc.RunConfig.from_json(outputs[cc.RUN_CONFIG_OUTPUT])
    except ValueError as exc:
        raise CloudRunError(str(exc)) from None
    return replace(cfg, prometheus_url=outputs.get(cc.PROMETHEUS_QUERY_OUTPUT, cfg.prometheus_url))
