"""The images' build context (.dockerignore): it holds what the Dockerfiles COPY, and nothing a run
writes into the checkout changes an image asset's hash. Both are asked of CDK itself: the staged
asset directories of a synthesis, and the hash a `DockerImageAsset` computes over a copy of the
repository (CDK merges .dockerignore with the stacks' own excludes, IgnoreMode.DOCKER).

Inside `make test` the linters ran beside the stack tests and wrote .grimp_cache/ between the
example's synthesis and the rehearsal's: the load generator's image hash differed between the two
templates, and test_rehearsal_stack's comparison failed (2026-12-07)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from stacks.load_generator import IMAGE_EXCLUDES
from tests.stacks.conftest import REPO_ROOT, Synth


def _copy_sources(src: Path) -> list[str]:
    """A Dockerfile's COPY sources (flags such as --from left out)."""
    out: list[str] = []
    for line in src.read_text(encoding="utf-8").splitlines():
        words = line.split()
        if words and words[0] == "COPY":
            args = [w for w in words[1:] if not w.startswith("--")]
            out += args[:-1]
    return out


@pytest.mark.parametrize("which", ["example", "rehearsal"])
def test_every_path_a_dockerfile_copies_is_in_its_staged_context(which: str, request: pytest.FixtureRequest) -> None:
    synth: Synth = request.getfixturevalue(which)  # the rehearsal's has the emulator image too
    assets = json.loads(synth.template_path.with_name("Comparison.assets.json").read_text(encoding="utf-8"))
    checked = 0
    for image in assets["dockerImages"].values():
        context = synth.outdir / image["source"]["directory"]
        dockerfile = context / image["source"].get("dockerFile", "Dockerfile")
        copied = _copy_sources(dockerfile)
        assert copied, dockerfile
        for src in copied:
            assert (context / src).exists(), f"{dockerfile.name} copies {src}, which its staged context lacks"
            checked += 1
        # and only the image's own sources were staged: no tests, docs or caches
        assert not (context / "tests").exists() and not (context / "docs").exists(), sorted(context.iterdir())
    assert checked


def _image_hash(context: Path) -> str:
    """The hash CDK gives the load generator's image asset over `context` (computed when the
    construct is made: no synthesis)."""
    from aws_cdk import App, Stack
    from aws_cdk import aws_ecr_assets as ecr_assets

    stack = Stack(App(), "Hash")
    asset = ecr_assets.DockerImageAsset(
        stack, "Image", directory=str(context), file="Dockerfile", exclude=IMAGE_EXCLUDES
    )
    return str(asset.asset_hash)


def test_what_a_run_writes_into_the_checkout_leaves_the_image_hash_alone(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    tracked = (
        subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, tracked):
        if (REPO_ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO_ROOT / name, repo / name)
    before = _image_hash(repo)
    outputs = {
        ".grimp_cache/0.data.json": "{}",  # lint-imports
        ".import_linter_cache/x.json": "{}",
        ".test-main.log": "....",
        ".site/index.html": "<html>",
        "docs/draft.md": "# a page",
        "tests/test_new.py": "def test(): pass\n",
        "manifests/x.rehearsal.yaml": "a: 1\n",
        "core/__pycache__/naming.cpython-311.pyc": "x",
        "runs/20261207T000000Z-abcdef/run.json": "{}",
    }
    for name, text in outputs.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text, encoding="utf-8")
    assert _image_hash(repo) == before, sorted(outputs)
    # ... while the image's own sources do count
    (repo / "core" / "naming.py").write_text((repo / "core" / "naming.py").read_text() + "\n# changed\n")
    assert _image_hash(repo) != before
