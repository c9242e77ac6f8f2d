"""The emulator image (Dockerfile.emulator), which a rehearsal's fleet instances run (issue 51):
every first-party module `python -m runtime.emulator` can import lies under a directory the image
copies to /app, with the data those packages ship, and every third-party package they import (and
huggingface_hub, which the boot's Hub download of the tokenizer files runs in it) is installed by
requirements-emulator.txt at requirements-runtime.txt's pins. Read, not built, as the conductor's
(tests/stacks/test_conductor_image.py)."""

from __future__ import annotations

from stacks.rehearsal_fleet import EMULATOR_DOCKERFILE
from tests.pins import pins
from tests.stacks.conftest import REPO_ROOT
from tests.stacks.test_conductor_image import (
    _covered,
    copied_to_app,
    missing_distributions,
    reachable_modules,
    shipped_data_dirs,
    uncovered_modules,
)

ENTRY = "runtime.emulator.__main__"  # the image's ENTRYPOINT: python -m runtime.emulator
REQUIREMENTS = REPO_ROOT / "requirements-emulator.txt"
# The boot's Hub download runs `python3 -c "from huggingface_hub import snapshot_download; ..."`
# in the image (core.serving.tokenizer_staging); no module of the harness imports it there.
BOOT_IMPORTS = {"huggingface_hub"}


def test_the_image_copies_every_first_party_module_and_data_the_emulator_can_import() -> None:
    first, _ = reachable_modules(ENTRY)
    assert {"runtime.emulator.app", "core.manifest", "core.tokenizer"} <= first
    copied = copied_to_app(REPO_ROOT / EMULATOR_DOCKERFILE)
    assert uncovered_modules(first, copied) == []
    assert sorted(str(d) for d in shipped_data_dirs(first) if not _covered(d, copied)) == []


def test_the_image_installs_every_third_party_package_the_emulator_and_the_boot_import() -> None:
    _, external = reachable_modules(ENTRY)
    assert {"aiohttp", "prometheus_client", "pydantic"} <= external
    assert not {"aws_cdk", "boto3", "locust"} & external  # nothing of the campaign's or the cloud's
    assert missing_distributions(external | BOOT_IMPORTS, REQUIREMENTS) == []


def test_the_image_requirements_are_pinned_like_the_runtime() -> None:
    image, runtime = pins(REQUIREMENTS), pins(REPO_ROOT / "requirements-runtime.txt")
    assert image and all(runtime.get(name) == version for name, version in image.items()), image
