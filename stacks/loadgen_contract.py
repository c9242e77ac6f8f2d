"""The stacks' view of the load-generator contract; the one definition is core/cloud_contract.py
(`campaign run` and the task's entry point read the same names)."""

from __future__ import annotations

from core.cloud_contract import (
    CONTAINER_NAME,
    ENV_MANIFEST_DIGEST,
    ENV_MASTER_PORT,
    ENV_RESULTS_URI,
    ENV_ROLE,
    LOADGEN_TASK_MEMORY_GIB,
    LOADGEN_TASK_VCPU,
    LOCUST_MASTER_PORT,
    LOCUST_WEB_PORT,
    METRICS_PORT,
    RUN_CONFIG_OUTPUT,
    UI_LINGER_S,
    master_service_name,
    workers_service_name,
)

__all__ = [
    "CONTAINER_NAME",
    "ENV_MANIFEST_DIGEST",
    "ENV_MASTER_PORT",
    "ENV_RESULTS_URI",
    "ENV_ROLE",
    "LOADGEN_TASK_MEMORY_GIB",
    "LOADGEN_TASK_VCPU",
    "LOCUST_MASTER_PORT",
    "LOCUST_WEB_PORT",
    "METRICS_PORT",
    "RUN_CONFIG_OUTPUT",
    "UI_LINGER_S",
    "master_service_name",
    "workers_service_name",
]
