"""`deploy`'s compile phase: an at-risk Neuron fleet's model compiled once, on a larger host, first.

A fleet whose weights come close to its instance's host memory (core.compile_host, what `plan`
prints as AT RISK) would compile on every instance, crash or overrun its grace, and be replaced
until teardown. So `deploy`:
1. skips every such fleet whose compiled set the stack's results bucket already holds (a complete
   set under compiled/<key>/<publisher>/, the fleets' own fetch rule, stacks.fleet_boot), saying so;
2. refuses, with the numbers, a fleet left that no instance of its accelerator can compile, or any
   fleet left when the compile phase is disabled (`--no-compile-phase`): exit 2, nothing deployed;
3. runs `cdk deploy -c compile_fleets=...` (every fleet at 0, one compile instance's group per
   fleet: stacks/compile_instance.py), starts each group (desired capacity 1) and waits for each
   fleet's set, with a progress line per fleet every poll and at most the plan's minutes
   (campaign.aws.compile_estimate.compile_phase); a compile instance that ends without publishing, or the
   timeout, stops `deploy` with its boot log's last lines and its group's activities;
4. still on that template, brings one instance of each compiled fleet's own group up on the published
   set and waits, at most the fleet's health grace, until it is healthy in the fleet's target group
   (prove_on_fleet_type): the set loaded on the larger host, and only this shows the fleet's own
   type holds it. Not in time: that group back to 0, the set's markers withdrawn, the instance's
   console output and what to change, exit 1;
5. then the plain `cdk deploy` sizes the fleets and removes the compile resources (campaign.cli.aws_cmds.cmd_deploy).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from campaign.aws.compile_estimate import compile_phase
from campaign.aws.stack import AwsStepFailed
from core.compile_host import CompileHost, compile_host
from core.errors import EXIT_BAD_INPUT, CampaignError
from core.manifest import Manifest
from core.serving import definition_for
from stacks.compile_boot import COMPILE_PHASE_OUTPUT
from stacks.fleet_boot import complete_marker_pattern
from stacks.fleet_paths import COMPILED_PREFIX

RESULTS_BUCKET_OUTPUT = "ResultsBucketName"  # stacks/comparison_stack.py
LOG_LINES = 20  # of the compile instance's boot log, in the error when it failed


class CompileRefused(CampaignError):
    """A fleet would compile on a host that cannot hold the model: nothing is deployed."""

    exit_code = EXIT_BAD_INPUT


class CompilePhaseFailed(AwsStepFailed):
    """A compile instance ended without publishing its fleet's set, or the phase ran out of time."""


@dataclass(frozen=True)
class CompileTarget:
    """One at-risk fleet: its compile host, its compiled key and how long its phase may take."""

    host: CompileHost
    key: str
    timeout_min: float | None  # campaign.aws.compile_estimate.compile_phase's minutes; None: no host can compile it

    @property
    def fleet(self) -> str:
        return self.host.fleet

    @property
    def key_prefix(self) -> str:
        return f"{COMPILED_PREFIX}/{self.key}"


def compile_targets(m: Manifest) -> list[CompileTarget]:
    """Every fleet of the manifest whose own host memory is at risk, in manifest order."""
    out = []
    for f in m.fleets:
        host = compile_host(m, f)
        compiled = definition_for(m, f).compiled
        if host is None or compiled is None:
            continue
        phase = compile_phase(m, f)
        out.append(CompileTarget(host, compiled.key, phase.minutes if phase else None))
    return out


def stack_outputs(cfn: Any, stack: str) -> dict[str, str] | None:
    """The stack's outputs; None when there is no stack yet."""
    from botocore.exceptions import ClientError

    try:
        found = cfn.describe_stacks(StackName=stack)["Stacks"]
    except ClientError as exc:
        if "does not exist" in str(exc):
            return None
        raise
    return {o["OutputKey"]: o["OutputValue"] for o in found[0].get("Outputs", [])}


def published_set(s3: Any, bucket: str, key_prefix: str) -> str | None:
    """s3:// URI of a complete set under `key_prefix`, by the fleets' own rule; None when none is."""
    marker = re.compile(complete_marker_pattern(key_prefix))
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{key_prefix}/"):
        for obj in page.get("Contents", []):
            if marker.match(obj["Key"]):
                return f"s3://{bucket}/{obj['Key'].rsplit('/', 1)[0]}/"
    return None


def needed(
    session: Any, m: Manifest, stack: str, *, enabled: bool = True, say: Callable[[str], None] = print
) -> list[CompileTarget]:
    """The fleets the compile phase must compile; empty: none (no fleet at risk, or every set
    already published). CompileRefused when one cannot be compiled on a host that holds it."""
    targets = compile_targets(m)
    if not targets:
        return []
    outputs = stack_outputs(session.client("cloudformation"), stack)
    bucket = (outputs or {}).get(RESULTS_BUCKET_OUTPUT)
    todo = []
    for t in targets:
        found = published_set(session.client("s3"), bucket, t.key_prefix) if bucket else None
        if found:
            say(f"{t.fleet}: its compiled set is already published at {found}: no compile phase for it")
        else:
            todo.append(t)
    refused = [f"{t.host.cannot_compile()}" for t in todo if t.host.instance_type is None]
    if not enabled:
        refused += [
            f"{t.fleet}: weights {t.host.weights_gib:.1f} GiB are {t.host.weights_gib / t.host.fleet_host_gib:.0%} of "
            f"{t.host.fleet_instance_type}'s {t.host.fleet_host_gib} GiB host memory, and --no-compile-phase forbids "
            f"compiling it once on a {t.host.instance_type} ({t.host.host_gib} GiB host) first"
            for t in todo
            if t.host.instance_type is not None
        ]
    if refused:
        raise CompileRefused(
            "a fleet would compile on a host that cannot hold its model; nothing was deployed:\n  "
            + "\n  ".join(refused)
            + "\n  "
            + _way_out(bucket, enabled)
        )
    return todo


def _way_out(bucket: str | None, enabled: bool) -> str:
    if bucket is None:  # no stack yet, so no results bucket to stage a set in
        return (
            "drop --no-compile-phase" if not enabled else "give the fleet an instance_type whose host memory clears it"
        ) + " (the stack and its results bucket do not exist yet)"
    return (
        f"a set compiled elsewhere with the fleet's server flags and published under s3://{bucket}/{COMPILED_PREFIX}/"
        "<the fleet's key, `campaign plan` prints it>/<any name>/, COMPLETE written last, is fetched instead"
        + ("; or drop --no-compile-phase" if not enabled else "")
    )


@dataclass
class _Watch:
    target: CompileTarget
    group: str
    log_group: str
    instance_type: str
    instances: list[str] = field(default_factory=list)  # every instance the group had, in order


def _group_state(autoscaling: Any, group: str) -> tuple[int, list[tuple[str, str]]]:
    """(desired capacity, [(instance id, lifecycle state)])."""
    groups = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
    if not groups:
        raise CompilePhaseFailed(f"compile group {group} not found: was the stack changed or deleted meanwhile?")
    g = groups[0]
    return int(g["DesiredCapacity"]), [(i["InstanceId"], i.get("LifecycleState", "?")) for i in g.get("Instances", [])]


def _boot_log_tail(logs: Any, log_group: str, instance: str) -> str:
    try:
        events = logs.get_log_events(
            logGroupName=log_group, logStreamName=f"{instance}/boot", limit=LOG_LINES, startFromHead=False
        )["events"]
    except Exception as exc:  # botocore: no stream yet (the agent never started), no permission
        return f"    (not readable: {type(exc).__name__}: {exc})"
    return "\n".join(f"    | {e['message'].rstrip()}" for e in events) or "    (empty)"


def _log_pointer(w: _Watch, region: str) -> str:
    if not w.instances:
        return "no instance was launched: see the group's activities"
    i = w.instances[-1]
    return (
        f"boot log: CloudWatch Logs group {w.log_group}, stream {i}/boot "
        f"(`aws logs tail {w.log_group} --log-stream-names {i}/boot --region {region}`)"
    )


def _failure(w: _Watch, session: Any, region: str, why: str) -> CompilePhaseFailed:
    from campaign.aws.readiness import _activities  # one reading of a group's activities, as `run` prints it

    try:
        activities = _activities(session.client("autoscaling"), w.group)
    except Exception as exc:  # botocore
        activities = f"ASG {w.group} activities not readable ({type(exc).__name__}: {exc})"
    tail = _boot_log_tail(session.client("logs"), w.log_group, w.instances[-1]) if w.instances else ""
    return CompilePhaseFailed(
        f"{w.target.fleet}: {why}\n  {_log_pointer(w, region)}"
        + (f"\n  its last lines:\n{tail}" if tail else "")
        + f"\n  {activities} (`aws autoscaling describe-scaling-activities --auto-scaling-group-name {w.group} "
        f"--region {region}`)\n  every fleet is still at 0: fix the cause and run `deploy` again (it starts a new "
        "compile instance), or `teardown`"
    )


def run(
    session: Any,
    m: Manifest,
    stack: str,
    targets: Sequence[CompileTarget],
    *,
    poll_s: float = 60.0,
    say: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """After the compile phase's `cdk deploy`: start each fleet's compile group and wait until every
    fleet's set is published (CompilePhaseFailed otherwise)."""
    outputs = stack_outputs(session.client("cloudformation"), stack) or {}
    try:
        bucket = outputs[RESULTS_BUCKET_OUTPUT]
        phase = json.loads(outputs[COMPILE_PHASE_OUTPUT])
        watches = [
            _Watch(t, phase[t.fleet]["group"], phase[t.fleet]["log_group"], phase[t.fleet]["instance_type"])
            for t in targets
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise CompilePhaseFailed(
            f"stack {stack}: output {COMPILE_PHASE_OUTPUT} or {RESULTS_BUCKET_OUTPUT} missing or malformed ({exc}): "
            "the compile phase's `cdk deploy` did not build it"
        ) from None
    region = m.costs.region
    autoscaling, s3 = session.client("autoscaling"), session.client("s3")
    for w in watches:
        desired, instances = _group_state(autoscaling, w.group)
        if desired == 0 and not instances:
            autoscaling.set_desired_capacity(AutoScalingGroupName=w.group, DesiredCapacity=1, HonorCooldown=False)
            say(f"{w.target.fleet}: compile instance requested ({w.instance_type}, group {w.group})")
        else:
            say(f"{w.target.fleet}: a compile instance is already running in group {w.group}; waiting for it")
    start = clock()
    pending = list(watches)
    while pending:
        elapsed_min = (clock() - start) / 60
        for w in list(pending):
            if _done(s3, bucket, w, say):
                pending.remove(w)
                continue
            desired, instances = _group_state(autoscaling, w.group)
            w.instances += [i for i, _ in instances if i not in w.instances]
            if desired == 0 and not instances:
                if _done(s3, bucket, w, say):  # published, then terminated itself between the two reads
                    pending.remove(w)
                    continue
                raise _failure(
                    w,
                    session,
                    region,
                    f"the compile instance ended without publishing a set under s3://{bucket}/{w.target.key_prefix}/",
                )
            timeout = w.target.timeout_min
            assert timeout is not None  # needed() refused every target no host can compile
            if elapsed_min >= timeout:
                for late in pending:
                    autoscaling.set_desired_capacity(AutoScalingGroupName=late.group, DesiredCapacity=0)
                raise _failure(
                    w,
                    session,
                    region,
                    f"no set published under s3://{bucket}/{w.target.key_prefix}/ after "
                    f"{elapsed_min:.0f} min, the plan's at most {timeout:g}; its compile group is stopped (desired 0)",
                )
            state = ", ".join(f"{i} {s}" for i, s in instances) or "no instance yet"
            say(
                f"{w.target.fleet}: compiling on {w.instance_type} ({state}), {elapsed_min:.0f} of at most "
                f"{timeout:g} min; {_log_pointer(w, region)}"
            )
        if pending:
            sleep(poll_s)


def _done(s3: Any, bucket: str, w: _Watch, say: Callable[[str], None]) -> bool:
    found = published_set(s3, bucket, w.target.key_prefix)
    if found:
        say(f"{w.target.fleet}: compiled set published at {found}; its compile instance terminates itself")
    return found is not None


# --- after the compile phase: one instance of the fleet's own type serves the set first -----------

PROVEN_MARKER = "PROVEN"  # compiled/<key>/PROVEN: an instance of the fleet's own type served this key's set
CONSOLE_LINES = 30  # of the instance's console output, in the error when the check failed


class OneInstanceCheckFailed(AwsStepFailed):
    """The fleet's own type did not serve the published set within its grace; its group is at 0."""


def _console_tail(ec2: Any, instance: str) -> str:
    try:  # botocore decodes GetConsoleOutput's base64 Output
        text = ec2.get_console_output(InstanceId=instance, Latest=True).get("Output") or ""
    except Exception as exc:  # botocore: no permission, instance gone
        return f"    (not readable: {type(exc).__name__}: {exc})"
    lines = text.rstrip().splitlines()[-CONSOLE_LINES:]
    return "\n".join(f"    | {line}" for line in lines) or "    (empty)"


def _withdraw(s3: Any, bucket: str, key_prefix: str) -> list[str]:
    """Delete the key's COMPLETE markers: no fleet instance fetches a set its type cannot load,
    and the next `deploy` compiles (and checks) again instead of sizing the fleet on it."""
    marker = re.compile(complete_marker_pattern(key_prefix))
    gone = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{key_prefix}/"):
        for obj in page.get("Contents", []):
            if marker.match(obj["Key"]):
                s3.delete_object(Bucket=bucket, Key=obj["Key"])
                gone.append(obj["Key"])
    return gone


def prove_on_fleet_type(
    session: Any,
    m: Manifest,
    stack: str,
    targets: Sequence[CompileTarget],
    *,
    poll_s: float = 30.0,
    say: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """After `run` published every set, still on the compile phase's template (every fleet's group
    at 0, its max as the manifest's): one instance in each compiled fleet's own group, which must
    become healthy in the fleet's target group within the fleet's health grace before the plain
    `cdk deploy` sizes the group. The set was only proven to load on the larger compile host; the
    fleet's type may still not hold it (host memory at load). Healthy: PROVEN is written under the
    key, and a later deploy, which finds the set published, runs neither the phase nor this check.
    Not healthy in time: that group goes back to 0, the key's COMPLETE markers are withdrawn, and
    OneInstanceCheckFailed names the console output's last lines and what to change."""
    from core import catalog
    from core.cloud_contract import health_grace_s

    outputs = stack_outputs(session.client("cloudformation"), stack) or {}
    try:
        bucket = outputs[RESULTS_BUCKET_OUTPUT]
        phase = json.loads(outputs[COMPILE_PHASE_OUTPUT])
        checks = {t.fleet: (t, phase[t.fleet]["fleet_group"], phase[t.fleet]["target_group"]) for t in targets}
    except (KeyError, TypeError, ValueError) as exc:
        raise CompilePhaseFailed(
            f"stack {stack}: output {COMPILE_PHASE_OUTPUT} names no fleet group or target group ({exc}): "
            "the compile phase's `cdk deploy` did not build it"
        ) from None
    autoscaling, elbv2, s3 = session.client("autoscaling"), session.client("elbv2"), session.client("s3")
    for fleet, (_, group, _) in checks.items():
        autoscaling.update_auto_scaling_group(AutoScalingGroupName=group, MinSize=0, DesiredCapacity=1)
        say(
            f"{fleet}: one {m.fleet(fleet).instance_type} requested in its own group {group}: it must serve the "
            "published set (healthy in its target group) before the group is sized"
        )
    start = clock()
    pending = dict(checks)
    while pending:
        elapsed_s = clock() - start
        for fleet, (t, group, target_group) in list(pending.items()):
            f = m.fleet(fleet)
            grace = health_grace_s(catalog.instance(f.instance_type).accelerator.vendor)
            states = [
                d["TargetHealth"]["State"]
                for d in elbv2.describe_target_health(TargetGroupArn=target_group)["TargetHealthDescriptions"]
            ]
            if "healthy" in states:
                s3.put_object(Bucket=bucket, Key=f"{t.key_prefix}/{PROVEN_MARKER}", Body=f.instance_type.encode())
                say(f"{fleet}: one {f.instance_type} serves the set after {elapsed_s / 60:.0f} min; sizing the group")
                del pending[fleet]
                continue
            if elapsed_s >= grace:
                _, instances = _group_state(autoscaling, group)
                autoscaling.update_auto_scaling_group(AutoScalingGroupName=group, MinSize=0, DesiredCapacity=0)
                withdrawn = _withdraw(s3, bucket, t.key_prefix)
                tails = "\n".join(
                    f"  {i}'s console output, last lines (EC2 GetConsoleOutput):\n"
                    + _console_tail(session.client("ec2"), i)
                    for i, _ in instances
                )
                raise OneInstanceCheckFailed(
                    f"{fleet}: no {f.instance_type} of its own group was healthy in its target group within its "
                    f"{grace // 60}-min grace (targets: {', '.join(states) or 'none'}); its group is back at 0 and the "
                    f"set's marker withdrawn ({len(withdrawn)} COMPLETE), so no instance loads it and the next deploy "
                    f"compiles again\n{tails}\n  the set loads on {t.host.instance_type} but not, it seems, on "
                    f"{f.instance_type} ({f.instance_type}'s host memory against {t.host.weights_gib:.1f} GiB of "
                    "weights): give the fleet a larger instance_type, or quantized weights, and deploy again"
                )
            say(
                f"{fleet}: one {f.instance_type} booting on the published set ({', '.join(states) or 'not registered'}), "
                f"{elapsed_s / 60:.0f} of at most {grace // 60} min"
            )
        if pending:
            sleep(poll_s)
