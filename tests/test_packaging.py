"""The harness installs as a package (`pip install .` -> the `inf2-vs-g6` command) and runs from
anywhere: the wheel carries every package the code imports and the data it opens at run time,
declares every third-party distribution it imports, and what only a checkout has fails by name."""

from __future__ import annotations

import ast
import importlib.metadata as md
import itertools
import json
import os
import re
import shutil
import site
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from core import shipped
from tests.pins import closure, norm, pins

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
WHEEL_PACKAGES: list[str] = PYPROJECT["tool"]["setuptools"]["packages"]
MAPPED = set(PYPROJECT["tool"]["setuptools"].get("package-dir", {}))  # data directories shipped as packages
NOT_SHIPPED = {"tests", "bench", "testing", "node_modules", "cdk.out", "build", "runs"}
MANIFEST = ROOT / "manifests" / "llama3-8b-inf2-vs-g6.yaml"


def _source_packages() -> set[str]:
    """Every first-party package in the tree (a directory with __init__.py), dotted."""
    out = set()
    for init in ROOT.rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT)
        if rel.parts and not rel.parts[0].startswith(".") and rel.parts[0] not in NOT_SHIPPED:
            out.add(".".join(rel.parts))
    return out


def test_every_package_of_the_tree_is_in_the_wheel() -> None:
    tree, listed = _source_packages(), set(WHEEL_PACKAGES) - MAPPED
    assert not tree - listed, f"add {sorted(tree - listed)} to [tool.setuptools] packages in pyproject.toml"
    assert not listed - tree, f"pyproject.toml lists {sorted(listed - tree)}, which the tree does not have"


def _imported_top_level(packages: list[str]) -> set[str]:
    names: set[str] = set()
    for pkg in packages:
        for path in (ROOT / pkg.replace(".", "/")).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names.add(node.module.split(".")[0])
    return names


def test_runtime_requirements_declare_every_third_party_import() -> None:
    first_party = {p.split(".")[0] for p in WHEEL_PACKAGES}
    third_party = _imported_top_level(WHEEL_PACKAGES) - set(sys.stdlib_module_names) - first_party - {"__future__"}
    by_module = md.packages_distributions()
    unknown = sorted(m for m in third_party if m not in by_module)
    assert not unknown, f"imported but not installed here: {unknown}"
    needed = {norm(d) for m in third_party for d in by_module[m]}
    declared = closure(set(pins(ROOT / "requirements-runtime.txt")))
    assert needed <= declared, (
        f"imported by the harness but not in requirements-runtime.txt: {sorted(needed - declared)}"
    )


def test_checkout_only_steps_name_what_they_need(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert shipped.checkout_root("deploy") == ROOT  # this test runs in a checkout
    monkeypatch.setattr(shipped, "PACKAGES_DIR", tmp_path)
    with pytest.raises(
        shipped.CheckoutRequired, match=r"^deploy needs a checkout of the repository .* installed copy in "
    ):
        shipped.checkout_root("deploy")


def test_shipped_data_comes_from_the_checkout_here() -> None:
    assert shipped.shipped_path("calibration/efficiency.json") == ROOT / "data" / "calibration" / "efficiency.json"
    assert shipped.shipped_path("calibration/efficiency.json").is_file()


def _recipe(target: str) -> list[str]:
    """The Makefile's recipe lines for `target`."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    return [line.strip() for line in itertools.takewhile(lambda line: line.startswith("\t"), lines[start + 1 :])]


def test_make_install_installs_the_project_into_the_venv() -> None:
    """`make install` installs the project itself, editable, after the pinned requirements: the
    `inf2-vs-g6` command and `python -m campaign` then run from any directory (before, only a
    separate `pip install .` made the command, and `-m campaign` failed outside the checkout)."""
    recipe = _recipe(".venv/.installed")
    editable = [i for i, line in enumerate(recipe) if re.search(r"\.venv/bin/pip install .*--no-deps .*-e \.$", line)]
    requirements = [i for i, line in enumerate(recipe) if "-r requirements.txt" in line]
    assert editable and requirements and requirements[0] < editable[0], recipe
    assert "pyproject.toml" in next(
        line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith(".venv/.installed:")
    )
    # ... and this venv (the one `make test` runs) has it so.
    dist = md.distribution(PYPROJECT["project"]["name"])
    assert json.loads(dist.read_text("direct_url.json") or "{}").get("dir_info", {}).get("editable") is True, (
        "run `make install`"
    )
    assert (Path(sys.executable).parent / "inf2-vs-g6").is_file()


def _copy_sources(dest: Path) -> Path:
    """What the build reads, copied: a build in the checkout would leave build/ and *.egg-info there."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", "requirements-runtime.txt"):
        shutil.copy2(ROOT / name, dest / name)
    for top in {p.split(".")[0] for p in WHEEL_PACKAGES} | {"data/calibration"}:
        shutil.copytree(ROOT / top, dest / top, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.mark.slow
def test_wheel_installs_a_working_command(tmp_path: Path) -> None:
    src = _copy_sources(tmp_path / "src")
    pip = [sys.executable, "-m", "pip"]
    # Offline and fast: the pinned setuptools is in this venv (requirements.txt), no isolated build env.
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(src)], check=True
    )
    (wheel,) = (tmp_path / "dist").glob("inf2_vs_g6-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site_dir = Path(
        subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # The dependencies: this venv's, the same pins (no downloads); after the new venv's own site-packages.
    (site_dir / "shared-venv.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([*pip, "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)], check=True)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing points back at the checkout

    def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(a) for a in argv], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120
        )

    cli = venv / "bin" / "inf2-vs-g6"
    r = run(cli, "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: inf2-vs-g6 "), r.stdout + r.stderr
    r = run(cli, "validate", MANIFEST)
    assert r.returncode == 0 and r.stdout.startswith(f"ok: {MANIFEST} "), r.stdout + r.stderr
    r = run(cli, "plan", MANIFEST)
    assert r.returncode == 0 and "from calibration 'neuron-nxd'" in r.stdout, r.stdout + r.stderr
    r = run(py, "-m", "campaign", "validate", MANIFEST)
    assert r.returncode == 0 and r.stdout.startswith("ok: "), r.stdout + r.stderr
    # Imported from the installed copy, reading the installed copy's data.
    r = run(py, "-c", "import core.catalog as c; print(c.__file__); print(c.CALIBRATION_FILE)")
    module, data = r.stdout.split()
    assert (
        Path(module).is_relative_to(site_dir)
        and Path(data) == site_dir / "core" / "shipped" / "calibration" / "efficiency.json"
    )
    r = run(cli, "local", MANIFEST, "--engine", "vllm-cpu", "--out", tmp_path / "run")
    assert (
        r.returncode == 2 and "--engine vllm-cpu (`make engine` makes its .venv-engine) needs a checkout" in r.stderr
    ), r.stderr
    assert not (tmp_path / "run").exists()
    r = run(py, "-m", "stacks.checkov_gate", tmp_path / "template.json")
    assert (
        r.returncode == 2 and "the checkov gate (`make checkov` builds its .venv-checkov) needs a checkout" in r.stderr
    ), r.stderr
