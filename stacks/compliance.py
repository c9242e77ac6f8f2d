"""cdk-nag wiring.

cdk-nag 3.x is a CDK policy-validation plugin, not an Aspect: `Aspects.of(app).add(AwsSolutionsChecks())`
fails with `aspect.visit is not a function`. It is registered with `Validations.of(app).add_plugins(...)`
and findings are acknowledged with `Validations.of(scope).acknowledge(...)`, each with a reason.
Any unacknowledged finding makes synth raise `ValidationFailed` and writes
`validation-report.json` into the cloud assembly.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, App, CfnResource, Stack, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct


def add_nag_checks(app: App) -> None:
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    """Acknowledge one rule (or one `Rule[finding]`) on `scope` and its children, with the reason."""
    if len(reason.strip()) < 20:
        raise ValueError(f"acknowledging {rule} needs a real reason, got {reason!r}")
    Validations.of(scope).acknowledge(Acknowledgment(id=rule, reason=reason))


def arn_placeholder(resource: CfnResource) -> str:
    """How cdk-nag spells `Fn::GetAtt [X, Arn]` in a finding id: `<LogicalId.Arn>`."""
    return f"<{Stack.of(resource).resolve(resource.logical_id)}.Arn>"
