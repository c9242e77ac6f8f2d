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

The fleet's boot bounds only its health wait (the grace, counted from its start); a `docker pull`,
a weight download or a `curl` that hangs before it would keep the larger host billing after
`deploy`'s terminal closed. So the whole boot runs under `timeout` (compile_boot_limit_s: the
grace plus COMPILE_BOOT_MARGIN_S to publish), the script re-running its own file ($0: cloud-init
runs user data as a script file, "User-data script" in the cloud-init docs' user-data formats)
inside it, and the EXIT trap of the outer run terminates the instance whatever the inner did.
`timeout` signals its whole process group ("Upon timeout, send the TERM signal to COMMAND" ...
it runs COMMAND in the background, its own process group, unless --foreground: GNU coreutils
manual, "timeout invocation"), so the hung child goes with the shell that waits on it.
"""

from __future__ import annotations

from core.cloud_contract import health_grace_s
from core.images import CachedPull
from core.serving import ServingDefinition
from stacks.fleet_boot import LOCAL_MARKER, boot_script
from stacks.fleet_paths import BOOT_LOG

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
# After the health wait (which gives up at the grace) the set is uploaded; 5 min of margin for that,
# inside the 10 min the plan allows beyond the grace (campaign.aws.compile_estimate
# COMPILE_PHASE_OVERHEAD_MIN: launch, publish, the second `cdk deploy`), so the instance's own bound
# ends before `deploy` would give up on it.
COMPILE_BOOT_MARGIN_S = 300
KILL_AFTER_S = 30  # a command that ignores TERM gets KILL this much later (timeout --kill-after)
INNER_ENV = "HARNESS_COMPILE_BOOT_INNER"  # set for the run inside the timeout


def compile_boot_limit_s(vendor: str) -> int:
    """The whole compile boot's bound: the fleet's health grace plus the publish margin."""
    return health_grace_s(vendor) + COMPILE_BOOT_MARGIN_S


def _terminate_on_exit(region: str) -> list[str]:
    """Defined in both runs, trapped in the outer one only; what it says goes to the boot log too
    (the inner run's tee is its own)."""
    return [
        f'compile_host_say() {{ echo "compile host: $*" | tee -a {BOOT_LOG}; }}',
        "compile_host_exit() {",
        "  local status=$?",
        "  set +e",
        '  compile_host_say "exit status $status; this instance terminates itself (its group goes to 0: no replacement)"',
        f"  sleep {LOG_FLUSH_WAIT_S}",
        "  local token instance",
        f"  token=\"$(curl -fsS -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' {IMDS}/api/token)\"",
        f'  instance="$(curl -fsS -H "X-aws-ec2-metadata-token: $token" {IMDS}/meta-data/instance-id)"',
        f"  for _ in $(seq 1 {TERMINATE_TRIES}); do",
        f'    if aws autoscaling terminate-instance-in-auto-scaling-group --region {region} --instance-id "$instance" '
        '--should-decrement-desired-capacity; then exit "$status"; fi',
        f"    sleep {TERMINATE_RETRY_S}",
        "  done",
        '  compile_host_say "could not terminate $instance; deploy stops its group when it gives up, teardown deletes it"',
        '  exit "$status"',
        "}",
    ]


def _whole_boot_timeout(region: str, limit_s: int) -> list[str]:
    """The outer run: the terminate trap, then this same file again under `timeout`; the inner run
    (INNER_ENV set) skips this block and is the boot itself. Exit 124 is timeout's own status for
    a command it stopped, 137 (128 + KILL) for one that needed --kill-after."""
    ran_past = f"the whole boot ran past {limit_s} s (the health grace + {COMPILE_BOOT_MARGIN_S} s to publish); stopped"
    return [
        *_terminate_on_exit(region),
        f'if [ "${{{INNER_ENV}:-0}}" != 1 ]; then',
        "  trap compile_host_exit EXIT",
        f'  {INNER_ENV}=1 timeout --kill-after={KILL_AFTER_S} {limit_s} bash "$0" && BOOT_STATUS=0 || BOOT_STATUS=$?',
        f'  case "$BOOT_STATUS" in 124|137) compile_host_say "{ran_past}";; esac',
        '  exit "$BOOT_STATUS"',
        "fi",
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
        *_whole_boot_timeout(region, compile_boot_limit_s(defn.host.vendor)),
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
