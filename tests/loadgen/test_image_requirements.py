"""The Fargate image installs only loadgen/requirements-loadgen.txt: everything the locustfile
imports must come from it, at the same pins as requirements.txt (a missing package there
means a task that dies at start-up in AWS, after the fleets are already paid for)."""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Imported only when used: S3 upload of records, and manifests with a huggingface tokenizer.
LAZY = {"boto3", "tokenizers"}
# Present in the python base image itself.
BASE_IMAGE = {"pip", "setuptools", "wheel"}


def _pins(path: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+)==([^\s;]+)", line)
        assert m, f"{path.name}:{n}: {line!r} is not pinned with =="
        pins[_norm(m.group(1).split("[")[0])] = m.group(2)
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(roots: set[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            reqs = md.requires(name) or []
        except md.PackageNotFoundError:
            continue  # a dependency under a platform marker false here (e.g. pywin32)
        seen.add(name)
        for req in reqs:
            if "extra ==" in req:
                continue
            dep = re.match(r"[A-Za-z0-9_.\-]+", req)
            assert dep
            todo.append(_norm(dep.group(0)))
    return seen


def test_image_requirements_are_pinned_like_the_project() -> None:
    image = _pins(ROOT / "loadgen" / "requirements-loadgen.txt")
    project = _pins(ROOT / "requirements.txt")
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
    needed = {_norm(d) for m in modules for d in by_module.get(m, ())} | LAZY
    installed = _closure(set(_pins(ROOT / "loadgen" / "requirements-loadgen.txt"))) | BASE_IMAGE
    assert needed <= installed, f"imported but not in requirements-loadgen.txt: {sorted(needed - installed)}"
