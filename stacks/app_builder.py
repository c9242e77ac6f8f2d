"""Builds the CDK app from context: used by app.py (`cdk synth`) and the tests alike."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aws_cdk import App, Environment

from core.naming import REHEARSAL_CONTEXT, stack_name
from stacks.comparison_stack import ComparisonStack
from stacks.compile_boot import COMPILE_FLEETS_CONTEXT
from stacks.compliance import add_nag_checks
from stacks.settings import REPO_ROOT, settings_from_context

CONTEXT_FILES = ("cdk.json", "cdk.context.json")


def pinned_context() -> dict[str, Any]:
    """cdk.json + cdk.context.json, which the CLI passes in but a plain `python app.py` would miss."""
    ctx: dict[str, Any] = {}
    for name in CONTEXT_FILES:
        path = REPO_ROOT / name
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            ctx.update(data.get("context", {}) if name == "cdk.json" else data)
    return ctx


def build_app(
    *, context: Mapping[str, Any] | None = None, outdir: str | None = None, nag: bool = True
) -> tuple[App, ComparisonStack]:
    # Pinned context is the default; the CLI's context (CDK_CONTEXT_JSON, -c ...) and `context` win.
    app = App(context={**pinned_context(), **(context or {})}, outdir=outdir)
    merged = {
        key: app.node.try_get_context(key)
        for key in (
            "manifest",
            "weights_s3_uri",
            "harness:region-availability-zones",
            COMPILE_FLEETS_CONTEXT,
            REHEARSAL_CONTEXT,
        )
    }
    settings = settings_from_context(merged)
    m = settings.manifest
    # Account stays unresolved (deploy targets the credentials' account); the region is the
    # manifest's, so AZs, ARNs and endpoint names are concrete at synth time.
    stack = ComparisonStack(
        app, "Comparison", settings=settings, stack_name=stack_name(m.campaign), env=Environment(region=m.costs.region)
    )
    if nag:
        add_nag_checks(app)
    return app, stack
