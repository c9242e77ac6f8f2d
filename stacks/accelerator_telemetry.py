"""Accelerator telemetry configs, stored in SSM parameters that the instances fetch at boot.

GPU fleets: the CloudWatch agent's `nvidia_gpu` plugin (utilization, memory, power, clocks).
Inf2 fleets: `neuron-monitor` (NeuronCore utilization, device memory, execution latency and
errors) piped into `neuron-monitor-cloudwatch.py`, both shipped with the Neuron tools on the
Neuron DLAMI. Both kinds run the CloudWatch agent for host metrics and the container's log.
"""

from __future__ import annotations

import json
from typing import Any

from stacks.fleet_paths import BOOT_LOG, CACHE_MOUNT

NVIDIA_GPU_MEASUREMENTS = (
    "utilization_gpu",
    "utilization_memory",
    "memory_used",
    "memory_total",
    "power_draw",
    "temperature_gpu",
    "clocks_current_sm",
)


# One namespace per fleet: the fleet role's PutMetricData is conditioned on its own namespaces,
# so one fleet's instances cannot write (forge) the other fleet's metrics.
def cloudwatch_namespace(campaign: str, fleet: str) -> str:
    return f"Harness/{campaign}/{fleet}"


def neuron_namespace(campaign: str, fleet: str) -> str:
    return f"Harness/{campaign}/{fleet}/neuron"


def cloudwatch_agent_config(*, campaign: str, fleet: str, gpu: bool, log_group: str) -> dict[str, Any]:
    collected: dict[str, Any] = {
        "mem": {"measurement": ["mem_used_percent"]},
        "disk": {"measurement": ["used_percent"], "resources": ["/", CACHE_MOUNT]},
        "cpu": {"measurement": ["usage_active"], "totalcpu": True},
    }
    if gpu:
        collected["nvidia_gpu"] = {"measurement": list(NVIDIA_GPU_MEASUREMENTS)}
    return {
        "agent": {"metrics_collection_interval": 10, "run_as_user": "root"},
        "metrics": {
            "namespace": cloudwatch_namespace(campaign, fleet),
            "append_dimensions": {"InstanceId": "${aws:InstanceId}", "InstanceType": "${aws:InstanceType}"},
            "aggregation_dimensions": [["fleet"], ["fleet", "InstanceType"]],
            "metrics_collected": {k: {**v, "append_dimensions": {"fleet": fleet}} for k, v in collected.items()},
        },
        "logs": {
            "logs_collected": {
                "files": {
                    "collect_list": [
                        # The serving container logs through Docker's json-file driver.
                        {
                            "file_path": "/var/lib/docker/containers/*/*-json.log",
                            "log_group_name": log_group,
                            "log_stream_name": "{instance_id}/serving",
                        },
                        {"file_path": BOOT_LOG, "log_group_name": log_group, "log_stream_name": "{instance_id}/boot"},
                    ]
                }
            }
        },
    }


def neuron_monitor_config() -> dict[str, Any]:
    """neuron-monitor's JSON config (Neuron tools docs, "neuron-monitor User Guide")."""
    return {
        "period": "10s",
        "neuron_runtimes": [
            {
                "tag_filter": ".*",
                "metrics": [
                    {"type": "neuroncore_counters"},
                    {"type": "memory_used"},
                    {"type": "neuron_runtime_vcpu_usage"},
                    {"type": "execution_stats"},
                ],
            }
        ],
        "system_metrics": [{"type": "vcpu_usage"}, {"type": "memory_info"}, {"type": "neuron_hw_counters"}],
    }


def as_json(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"))
