"""What the stacks give the load-generator container (root Dockerfile): ports, names, environment.

The container reads its inputs from S3 at start (no BucketDeployment: that is Lambda-backed);
the operator uploads them with the `UploadInputs` command from the stack outputs.
"""

from __future__ import annotations

LOCUST_WEB_PORT = 8089
LOCUST_MASTER_PORT = 5557  # workers connect to the master here (Locust default)
METRICS_PORT = 9646  # the loadgen Prometheus exporter (histograms) on master and workers
MASTER_SERVICE_NAME = "master"  # Cloud Map: master.<namespace>
WORKERS_SERVICE_NAME = "workers"

# Environment variable names the container reads (besides Locust's own LOCUST_* settings).
ENV_MANIFEST_URI = "HARNESS_MANIFEST_S3_URI"  # s3://bucket/campaigns/<campaign>/<digest12>/inputs/manifest.yaml
ENV_TRACE_URI = "HARNESS_TRACE_S3_URI"  # s3://bucket/campaigns/<campaign>/<digest12>/inputs/<trace file>
ENV_RESULTS_URI = "HARNESS_RESULTS_S3_URI"  # s3://bucket/campaigns/<campaign>/<digest12>/runs/
ENV_TARGETS = "HARNESS_TARGETS"  # JSON {"<fleet>": "http://<nlb>:<port>", ...}
ENV_MANIFEST_DIGEST = "HARNESS_MANIFEST_DIGEST"
ENV_METRICS_PORT = "HARNESS_METRICS_PORT"
ENV_ROLE = "HARNESS_LOADGEN_ROLE"  # "master" or "worker"
