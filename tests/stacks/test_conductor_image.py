"""The conductor image (Dockerfile.conductor) holds everything `python -m campaign` can import:
every first-party module reachable from campaign.__main__ (grimp reads every import statement,
function-level ones included, as tests/test_import_graph.py does) lies under a directory the image
copies to /app (its PYTHONPATH), the data those packages ship is copied too, and every third-party
package they import is installed by requirements-conductor.txt, at requirements-runtime.txt's pins.
A module, data file or import added later that the image lacks fails here, not as a conductor
that dies at start in AWS. No Docker here: the Dockerfile is read, not built."""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

import grimp
import pytest

from stacks.conductor import CONDUCTOR_DOCKERFILE
from tests.pins import closure, norm, pins
from tests.stacks.conftest import REPO_ROOT

ENTRY = "campaign.__main__"  # the image's ENTRYPOINT: python -m campaign
# The packages grimp reads: those a wheel ships (bench and testing are above campaign: nothing of it imports them).
FIRST_PARTY = ("campaign", "loadgen", "runtime", "analysis", "stacks", "core")
APP = PurePosixPath("/app")  # WORKDIR and PYTHONPATH of the image
REQUIREMENTS = REPO_ROOT / "requirements-conductor.txt"
BASE_IMAGE = {"pip", "setuptools", "wheel"}  # present in the python base image itself
OWN_DISTRIBUTION = "inf2-vs-g6"  # our own (pyproject), when an installed copy is visible: the image copies its packages


def copied_to_app(dockerfile: Path) -> set[PurePosixPath]:
    """The repository paths the Dockerfile's COPY lines put at the same path under /app."""
    out: set[PurePosixPath] = set()
    for line in dockerfile.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^COPY\s+(?!--)(\S+)\s+(\S+)\s*$", line)
        if m:
            src, dst = PurePosixPath(m.group(1)), PurePosixPath(m.group(2))
            if dst == APP / src:
                out.add(src)
    return out


def _covered(path: PurePosixPath, copied: Iterable[PurePosixPath]) -> bool:
    return any(path == c or c in path.parents for c in copied)


def reachable_modules(entry: str = ENTRY) -> tuple[set[str], set[str]]:
    """(first-party modules, third-party top-level packages) that `entry` imports, directly or not."""
    graph = grimp.build_graph(*FIRST_PARTY, include_external_packages=True)
    modules = graph.find_upstream_modules(entry) | {entry}
    first = {m for m in modules if m.split(".")[0] in FIRST_PARTY}
    external = {m.split(".")[0] for m in modules - first} - set(sys.stdlib_module_names) - {"__future__"}
    return first, external


def module_path(module: str) -> PurePosixPath:
    """Where a first-party module's source lies in the repository (a package: its __init__.py)."""
    rel = PurePosixPath(*module.split("."))
    return rel / "__init__.py" if (REPO_ROOT / rel).is_dir() else rel.with_suffix(".py")


def uncovered_modules(modules: Iterable[str], copied: set[PurePosixPath]) -> list[str]:
    return sorted(m for m in modules if not _covered(module_path(m), copied))


def shipped_data_dirs(packages: Iterable[str]) -> set[PurePosixPath]:
    """The directories of the data files pyproject ships with `packages` (package-data, a mapped
    package's files under its package-dir, e.g. core.shipped's data/calibration)."""
    setuptools = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dir: Mapping[str, str] = setuptools.get("package-dir", {})
    tops = {p.split(".")[0] for p in packages}
    out: set[PurePosixPath] = set()
    for package, globs in setuptools.get("package-data", {}).items():
        if package.split(".")[0] in tops:
            base = PurePosixPath(package_dir.get(package, package.replace(".", "/")))
            out |= {(base / g).parent for g in globs}
    return out


def missing_distributions(external: Iterable[str], requirements: Path) -> list[str]:
    """The distributions providing `external` that `requirements` (and what it pulls in) lacks."""
    by_module = md.packages_distributions()
    unknown = sorted(m for m in external if m not in by_module)
    assert not unknown, f"imported but not installed here: {unknown}"
    needed = {norm(d) for m in external for d in by_module[m]} - {OWN_DISTRIBUTION}
    installed = closure(set(pins(requirements))) | BASE_IMAGE
    return sorted(needed - installed)


@pytest.fixture(scope="module")
def reachable() -> tuple[set[str], set[str]]:
    return reachable_modules()


def test_the_image_copies_every_first_party_module_the_cli_can_import(reachable: tuple[set[str], set[str]]) -> None:
    first, _ = reachable
    assert {"campaign.cli.main", "campaign.backends.fargate.campaign", "analysis.report.build"} <= first
    copied = copied_to_app(REPO_ROOT / CONDUCTOR_DOCKERFILE)
    assert uncovered_modules(first, copied) == []
    assert sorted(str(d) for d in shipped_data_dirs(first) if not _covered(d, copied)) == []


def test_the_image_installs_every_third_party_package_the_cli_can_import(
    reachable: tuple[set[str], set[str]],
) -> None:
    _, external = reachable
    assert {"boto3", "duckdb", "pydantic"} <= external
    # `deploy` synthesizes with the CDK from a checkout; nothing `python -m campaign` imports needs it.
    assert not {"aws_cdk", "constructs", "cdk_nag"} & external
    assert missing_distributions(external, REQUIREMENTS) == []


def test_the_image_requirements_are_pinned_like_the_runtime() -> None:
    image, runtime = pins(REQUIREMENTS), pins(REPO_ROOT / "requirements-runtime.txt")
    assert image
    for name, version in image.items():
        assert runtime.get(name) == version, (
            f"{name}=={version} in the conductor image, {runtime.get(name)} at run time"
        )


def test_the_checks_see_a_missing_package_directory_data_or_requirement(
    reachable: tuple[set[str], set[str]], tmp_path: Path
) -> None:
    first, external = reachable
    copied = copied_to_app(REPO_ROOT / CONDUCTOR_DOCKERFILE)
    without_analysis = copied - {PurePosixPath("analysis")}
    missing = uncovered_modules(first, without_analysis)
    assert missing and all(m.startswith("analysis.") or m == "analysis" for m in missing)
    without_data = copied - {PurePosixPath("data/calibration")}
    assert PurePosixPath("data/calibration") in {d for d in shipped_data_dirs(first) if not _covered(d, without_data)}
    # A COPY to another place than /app/<same path> is not on the image's PYTHONPATH.
    elsewhere = tmp_path / "Dockerfile"
    elsewhere.write_text("COPY core/ /srv/core/\nCOPY campaign/ /app/campaign/\n", encoding="utf-8")
    assert copied_to_app(elsewhere) == {PurePosixPath("campaign")}
    reduced = tmp_path / "requirements.txt"
    lines = REQUIREMENTS.read_text(encoding="utf-8").splitlines()
    reduced.write_text("\n".join(line for line in lines if not line.startswith("duckdb==")), encoding="utf-8")
    assert missing_distributions(external, reduced) == ["duckdb"]
