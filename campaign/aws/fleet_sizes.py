"""`deploy --extend-hours` after the deadline fired: the fleets' Auto Scaling groups set back to
their template's sizes.

At the deadline each fleet's scheduled action set its group's min, max and desired to 0
(stacks/fleet.py). `--extend-hours` updates the stack with a later deadline, which changes only the
actions' StartTime. The AWS::AutoScaling::ScheduledAction page of the CloudFormation template
reference says "When you update a stack with an Auto Scaling group and scheduled action,
CloudFormation always sets the min size, max size, and desired capacity properties of your group
to the values that are defined in the AWS::AutoScaling::AutoScalingGroup section of your
template"; it does not say that an update which leaves the group itself unchanged does so, and
nothing here has tried it on an account. So `deploy` reads the sizes the deployed template gives
each group (GetTemplate) and sets back every group below them (UpdateAutoScalingGroup, EC2 Auto
Scaling API reference), naming each: a run after it then finds its instances launching instead
of waiting out readiness on empty groups.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

GROUP_TYPE = "AWS::AutoScaling::AutoScalingGroup"


@dataclass(frozen=True)
class Sizes:
    min: int
    max: int
    desired: int | None  # None: the template sets none (the group starts at its min)

    def words(self) -> str:
        return f"min {self.min}, max {self.max}, desired {'unset' if self.desired is None else self.desired}"


@dataclass(frozen=True)
class Restored:
    group: str
    logical_id: str
    before: Sizes
    after: Sizes

    def line(self) -> str:
        return (
            f"restored {self.group} ({self.logical_id}): {self.before.words()} -> {self.after.words()} "
            "(the deployed template's)"
        )


def _literal(value: Any) -> int | None:
    """A size as the template writes it ("2" or 2); None for anything else (a reference, a function)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def template_sizes(cfn: Any, stack: str) -> tuple[dict[str, Sizes], list[str]]:
    """Each Auto Scaling group of the deployed stack (by logical id) with the sizes its template
    gives it, and a note for a group whose sizes are not literal numbers (left alone)."""
    body = cfn.get_template(StackName=stack, TemplateStage="Processed")["TemplateBody"]
    template = json.loads(body) if isinstance(body, str) else body  # boto3 parses a JSON template itself
    out: dict[str, Sizes] = {}
    notes: list[str] = []
    for logical_id, res in (template.get("Resources") or {}).items():
        if res.get("Type") != GROUP_TYPE:
            continue
        props = res.get("Properties") or {}
        lo, hi = _literal(props.get("MinSize")), _literal(props.get("MaxSize"))
        desired = props.get("DesiredCapacity")
        want = _literal(desired) if desired is not None else None
        if lo is None or hi is None or (desired is not None and want is None):
            notes.append(f"{logical_id}: its template's sizes are not literal numbers: left as it is")
            continue
        out[logical_id] = Sizes(lo, hi, want)
    return out, notes


def _group_names(cfn: Any, stack: str, logical_ids: set[str]) -> dict[str, str]:
    """Logical id -> the group's name (its physical id), over every page of ListStackResources
    (DescribeStackResources returns the first 100 resources only)."""
    names: dict[str, str] = {}
    for page in cfn.get_paginator("list_stack_resources").paginate(StackName=stack):
        for r in page.get("StackResourceSummaries", []):
            if r.get("LogicalResourceId") in logical_ids and r.get("PhysicalResourceId"):
                names[r["LogicalResourceId"]] = r["PhysicalResourceId"]
    return names


def restore_fleet_sizes(session: Any, stack: str) -> tuple[list[Restored], list[str]]:
    """Set every Auto Scaling group of `stack` that is below its template's min, max or desired
    back up to them (a size above the template's is kept); the groups restored and the notes."""
    cfn = session.client("cloudformation")
    autoscaling = session.client("autoscaling")
    wanted, notes = template_sizes(cfn, stack)
    names = _group_names(cfn, stack, set(wanted))
    by_name = {names[i]: i for i in wanted if i in names}
    restored: list[Restored] = []
    groups: list[dict[str, Any]] = []
    if by_name:  # no names at all would describe every group of the account
        pages = autoscaling.get_paginator("describe_auto_scaling_groups").paginate(
            AutoScalingGroupNames=sorted(by_name)
        )
        for page in pages:
            groups += page.get("AutoScalingGroups", [])
    for g in groups:
        logical_id = by_name[g["AutoScalingGroupName"]]
        t = wanted[logical_id]
        now = Sizes(g["MinSize"], g["MaxSize"], g["DesiredCapacity"])
        lo, hi = max(now.min, t.min), max(now.max, t.max)
        desired = max(now.desired or 0, t.desired if t.desired is not None else lo)
        after = Sizes(lo, hi, min(max(desired, lo), hi))
        if after == now:
            continue
        autoscaling.update_auto_scaling_group(
            AutoScalingGroupName=g["AutoScalingGroupName"],
            MinSize=after.min,
            MaxSize=after.max,
            DesiredCapacity=after.desired,
        )
        restored.append(Restored(g["AutoScalingGroupName"], logical_id, now, after))
    for logical_id in sorted(set(wanted) - set(names)):
        notes.append(f"{logical_id}: in the template but not among the stack's resources: not checked")
    return restored, notes
