"""Fixtures for the CDK tests: each manifest is synthesized once per session.

These tests run in a pytest process that never imports gevent (`make pytest` runs them first in
its nice-10 process, before the analysis and core tests): jsii's node child process and gevent's
monkey-patching (imported by Locust) deadlock when they share one.
"""

from __future__ import annotations

import sys

_CONFLICTING = sorted(m for m in ("locust", "gevent") if m in sys.modules)
if _CONFLICTING:
    raise RuntimeError(
        f"tests/stacks imports aws_cdk (jsii/node), but {', '.join(_CONFLICTING)} is already imported in this process; "
        "jsii hangs under gevent's monkey-patching. Run the CDK tests alone: `pytest tests/stacks` "
        "(and the rest with `pytest --ignore=tests/stacks`)."
    )

import json  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_MANIFEST = REPO_ROOT / "manifests" / "llama3-8b-inf2-vs-g6.yaml"
THREE_FLEET_MANIFEST = REPO_ROOT / "manifests" / "llama3-8b-three-fleets.yaml"


@dataclass(frozen=True)
class Synth:
    outdir: Path
    template_json: dict[str, Any]
    template_path: Path
    manifest_path: Path

    def resources(self, cfn_type: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.template_json["Resources"].items() if v["Type"] == cfn_type}


def _stand_in_build_context(tmp: Path) -> Path:
    ctx = tmp / "loadgen-context"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM scratch\n", encoding="utf-8")
    return ctx


def synthesize(manifest: Path, outdir: Path, **context: str) -> Synth:
    """In-process synth with the same builder as app.py (cdk-nag attached); `context`: more -c values."""
    import stacks.load_generator
    from stacks.app_builder import build_app

    with pytest.MonkeyPatch.context() as mp:
        if not (REPO_ROOT / "Dockerfile").is_file():
            # The loadgen owner has not added the root Dockerfile yet; the infrastructure is
            # still checked, and test_cli_synth fails until the real one exists.
            mp.setattr(stacks.load_generator, "REPO_ROOT", _stand_in_build_context(outdir.parent))
        app, stack = build_app(context={"manifest": str(manifest), **context}, outdir=str(outdir))
        app.synth()
    path = outdir / f"{stack.artifact_id}.template.json"
    return Synth(outdir, json.loads(path.read_text(encoding="utf-8")), path, manifest)


@pytest.fixture(scope="session")
def example(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synthesize(EXAMPLE_MANIFEST, tmp_path_factory.mktemp("example") / "cdk.out")


@pytest.fixture(scope="session")
def three_fleets(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synthesize(THREE_FLEET_MANIFEST, tmp_path_factory.mktemp("three") / "cdk.out")


@pytest.fixture(scope="session")
def compile_phase(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The example as `deploy`'s compile phase synthesizes it (campaign/aws/compile_phase.py)."""
    from stacks.compile_boot import COMPILE_FLEETS_CONTEXT

    return synthesize(
        EXAMPLE_MANIFEST, tmp_path_factory.mktemp("compile") / "cdk.out", **{COMPILE_FLEETS_CONTEXT: "inf2"}
    )


@pytest.fixture(scope="session")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The example as `deploy --rehearsal` synthesizes it (issue 51): every fleet its emulator."""
    from core.naming import REHEARSAL_CONTEXT

    return synthesize(EXAMPLE_MANIFEST, tmp_path_factory.mktemp("rehearsal") / "cdk.out", **{REHEARSAL_CONTEXT: "1"})


@pytest.fixture(scope="session")
def example_template(example: Synth) -> Iterator[Any]:
    from aws_cdk.assertions import Template

    yield Template.from_json(example.template_json)
