"""The Fargate image installs only loadgen/requirements-loadgen.txt: everything the locustfile
imports must come from it, at the same pins as requirements.txt (a missing package there
means a task that dies at start-up in AWS, after the fleets are already paid for)."""

from __future__ import annotations

import importlib.metadata as md
import json
import subprocess
import sys
from pathlib import Path

from tests.pins import closure, norm, pins

ROOT = Path(__file__).resolve().parents[2]
# Imported only when used: S3 upload of records, and manifests with a huggingface tokenizer.
LAZY = {"boto3", "tokenizers"}
# Present in the python base image itself.
BASE_IMAGE = {"pip", "setuptools", "wheel"}
# Our own distribution (pyproject), when an installed or built copy is visible: the image copies its packages.
FIRST_PARTY = "inf2-vs-g6"


def test_image_requirements_are_pinned_like_the_project() -> None:
    image = pins(ROOT / "loadgen" / "requirements-loadgen.txt")
    project = pins(ROOT / "requirements.txt")
    for name, version in image.items():
        assert project.get(name) == version, f"{name}=={version} in the image, {project.get(name)} in requirements.txt"


def test_everything_the_locustfile_imports_is_installed_in_the_image() -> None:
    code = (
        "import sys, json, loadgen.locustfile, loadgen.launch, loadgen.probe, loadgen.recording, loadgen.task_entry\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in list(sys.modules)})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    modules = json.loads(out.stdout.strip().splitlines()[-1])
    by_module = md.packages_distributions()
    needed = ({norm(d) for m in modules for d in by_module.get(m, ())} | LAZY) - {FIRST_PARTY}
    installed = closure(set(pins(ROOT / "loadgen" / "requirements-loadgen.txt"))) | BASE_IMAGE
    assert needed <= installed, f"imported but not in requirements-loadgen.txt: {sorted(needed - installed)}"
