"""The compile instance's user data: a fleet instance's boot, then publish and terminate itself.

It is the fleet's own boot script (stacks/fleet_boot.boot_script) run on a larger host of the same
accelerator, so it stages the same weights and starts the same `docker run` (core.serving's
definition of the fleet: TP, buckets, flags, and NEURON_COMPILED_ARTIFACTS named by the fleet's
key). vLLM compiles into that directory, loads the result and serves it: a health check that
passes is the proof that the set loads. Then the script's own publish step uploads the set under
the fleet's key, COMPLETE last (compiled_publish, the fleet's fetch contract), and this script
requires that it did. Whatever the outcome, an EXIT trap then terminates the instance through its
Auto Scaling group with the desired capacity decremented, so the group never replaces it and
nothing is billed after it ("If you do not specify the option to decrement the desired capacity,
Amazon EC2 Auto Scaling launches instances to replace the ones that are terminated",
TerminateInstanceInAutoScalingGroup, https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_TerminateInstanceInAutoScalingGroup.html).
No neuron-monitor here: its metrics would be counted as the fleet's.
"""

from __future__ import annotations

from core.images import CachedPull
from core.serving import ServingDefinition
from stacks.fleet_boot import LOCAL_MARKER, boot_script

# What `deploy` (campaign/aws/compile_phase.py) and the stacks agree on: the CDK context that asks for
# the compile phase (fleet names, comma-separated), and the stack output that names, per fleet, its
# compile instance's Auto Scaling group and the log group its boot log goes to (JSON; present only
# while the compile phase is deployed).
COMPILE_FLEETS_CONTEXT = "compile_fleets"
COMPILE_PHASE_OUTPUT = "CompilePhase"

# IMDSv2, the only version the launch templates allow: a session token from a PUT, then the
# instance id with it ("Retrieve instance metadata", https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html).
IMDS = "http://169.254.169.254/latest"
# The CloudWatch agent sends the boot log every force_flush_interval, which "defaults to 5 seconds"
# (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Alarms.html):
# the script waits three of those before the instance goes, so the log's last lines, its failure
# included, reach the fleet's log group.
LOG_FLUSH_WAIT_S = 15
TERMINATE_TRIES = 10  # 30 s apart: the role's terminate grant is created just after the group
TERMINATE_RETRY_S = 30


def _terminate_on_exit(region: str) -> list[str]:
    return [
        "compile_host_exit() {",
        "  local status=$?",
        "  set +e",
        '  echo "compile host: exit status $status; this instance terminates itself (its group goes to 0: no replacement)"',
        f"  sleep {LOG_FLUSH_WAIT_S}",
        "  local token instance",
        f"  token=\"$(curl -fsS -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' {IMDS}/api/token)\"",
        f'  instance="$(curl -fsS -H "X-aws-ec2-metadata-token: $token" {IMDS}/meta-data/instance-id)"',
        f"  for _ in $(seq 1 {TERMINATE_TRIES}); do",
        f'    if aws autoscaling terminate-instance-in-auto-scaling-group --region {region} --instance-id "$instance" '
        '--should-decrement-desired-capacity; then exit "$status"; fi',
        f"    sleep {TERMINATE_RETRY_S}",
        "  done",
        '  echo "compile host: could not terminate $instance; deploy stops its group when it gives up, teardown deletes it"',
        '  exit "$status"',
        "}",
        "trap compile_host_exit EXIT",
    ]


def _require_published(defn: ServingDefinition) -> list[str]:
    """compiled_publish only logs a failed upload (a serving instance must go on serving); here it is
    the whole job. Its local marker is touched once the set is complete in the bucket."""
    assert defn.compiled is not None
    return [
        f"if [ ! -f {defn.compiled.directory}/{LOCAL_MARKER} ]; then",
        '  echo "compile host: no complete set under $COMPILED_URI; failing"; exit 1',
        "fi",
        'echo "compile host: the set under $COMPILED_URI is complete"',
    ]


def compile_script(
    defn: ServingDefinition,
    *,
    campaign: str,
    serving_digest: str,
    cached: CachedPull | None,
    weights_s3_uri: str | None = None,
    driver_version: str,
    region: str,
    agent_param: str,
    neuron_namespace: str,
    compiled_uri: str,
) -> list[str]:
    """`defn`: the FLEET's boot definition (its key names the fleet's instance type, not this
    host's), pulled as the fleet pulls it (`cached`); `agent_param`: the fleet's CloudWatch agent
    config, so the boot log lands in the fleet's log group as <instance id>/boot."""
    if defn.compiled is None:
        raise ValueError(f"stack {defn.stack!r} compiles nothing to share: no compile instance for it")
    return [
        *_terminate_on_exit(region),
        *boot_script(
            defn,
            campaign=campaign,
            serving_digest=serving_digest,
            cached=cached,
            weights_s3_uri=weights_s3_uri,
            driver_version=driver_version,
            region=region,
            agent_param=agent_param,
            neuron_monitor_param=None,
            neuron_namespace=neuron_namespace,
            compiled_uri=compiled_uri,
        ),
        *_require_published(defn),
    ]
