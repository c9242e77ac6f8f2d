"""A fleet's compiled artifacts: the first instance compiles and publishes, later ones fetch.

The boot script's two snippets (stacks.fleet_boot.compiled_fetch before `docker run`,
compiled_publish after the health wait) run under bash with `aws` stubbed by a local directory
standing in for the results bucket, across the boots of one fleet: the first instance compiles
(the stand-in server writes a NEFF) and publishes it, marker last; a fresh instance fetches it
instead of compiling; a reboot uses its own volume; a failed upload leaves no marker, so the
next instance compiles rather than load half a set; a bucket that cannot be read is logged as
such (with the AWS error), not as "no complete set", and the instance compiles.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from core.manifest import load_manifest
from core.serving import CACHE_MOUNT, CompiledArtifacts, definition_for
from stacks.fleet_boot import COMPLETE_MARKER, compiled_fetch, compiled_publish
from tests.conftest import EXAMPLE_MANIFEST

pytestmark = pytest.mark.boot_script

REGION = "eu-north-1"  # stands for the stack's region (stacks/fleet.py passes Stack.of(fleet).region)

# `aws s3api list-objects-v2 --bucket B --prefix P ...` (one key a line, `None` when there is none, as
# `--query 'Contents[].[Key]' --output text` prints) and `aws s3 cp [--recursive] SRC DST` against $BUCKET_DIR.
# FAIL_READ=1: reading the bucket's listing is refused, with the AWS CLI's error text and exit status.
AWS_STUB = r"""#!/bin/bash
echo "aws $*" >> "$CALLS"
# --region (logged above) does not change where the local bucket is: drop it with its value.
rest=(); while [ $# -gt 0 ]; do if [ "$1" = --region ]; then shift 2; else rest+=("$1"); shift; fi; done
set -- "${rest[@]}"
to_local() { echo "${1/s3:\/\//$BUCKET_DIR/}"; }
if [ "${FAIL_READ:-0}" = 1 ] && [ "$1" = s3api ]; then
  printf '\nAn error occurred (AccessDenied) when calling the ListObjectsV2 operation: Access Denied\n' >&2; exit 254
fi
if [ "$1" = s3api ] && [ "$2" = list-objects-v2 ]; then
  bucket=""; prefix=""; prev=""
  for a in "$@"; do [ "$prev" = --bucket ] && bucket="$a"; [ "$prev" = --prefix ] && prefix="$a"; prev="$a"; done
  keys="$(cd "$BUCKET_DIR/$bucket" 2>/dev/null && [ -d "$prefix" ] && find "$prefix" -type f | sort)" || true
  if [ -n "$keys" ]; then echo "$keys"; else echo None; fi
  exit 0
fi
args=(); exclude=""; recursive=0; prev=""
for a in "${@:3}"; do
  case "$a" in --recursive) recursive=1;; --only-show-errors) ;; --exclude) ;; *) [ "$prev" = --exclude ] && exclude="$a" || args+=("$a");; esac
  prev="$a"
done
src="${args[0]}"; dst="${args[1]}"
[ "${FAIL_UPLOAD:-0}" = 1 ] && [[ "$dst" == s3://* ]] && { echo "upload failed" >&2; exit 1; }
# a download that breaks half-way: one file lands, then the copy fails
[ "${FAIL_DOWNLOAD:-0}" = 1 ] && [[ "$src" == s3://* ]] && { d="$(to_local "$dst")"; mkdir -p "$d"; echo partial > "$d/model.pt"; exit 1; }
if [ "$src" = - ]; then d="$(to_local "$dst")"; mkdir -p "$(dirname "$d")"; cat > "$d"; exit 0; fi
s="$(to_local "$src")"; d="$(to_local "$dst")"
[ "$recursive" = 1 ] || { cp "$s" "$d"; exit; }
mkdir -p "$d"
(cd "$s" && find . -type f ! -name "$exclude") | while read -r f; do mkdir -p "$d/$(dirname "$f")"; cp "$s/$f" "$d/$f"; done
"""


def _boot(
    tmp: Path,
    volume: Path,
    bucket: Path,
    *,
    fail_upload: bool = False,
    fail_download: bool = False,
    fail_read: bool = False,
    serve: list[str] | None = None,
) -> tuple[str, str]:
    """One boot of an instance whose cache volume is `volume`: fetch, "serve", publish."""
    m = load_manifest(EXAMPLE_MANIFEST, check_files=False)
    defn = definition_for(m, m.fleet("inf2"))
    assert defn.compiled is not None
    directory = defn.compiled.directory
    # What the server does with NEURON_COMPILED_ARTIFACTS: load what is there, else compile into it.
    serve = serve or [
        f'if [ -f {directory}/model.pt ]; then echo "server: loaded"; '
        f'else echo "server: compiled"; echo neff > {directory}/model.pt; fi'
    ]
    script = "\n".join(
        [
            "set -euo pipefail",
            *compiled_fetch(defn, "s3://results/compiled", region=REGION),
            *serve,
            *compiled_publish(defn, region=REGION),
        ]
    )
    script = script.replace(CACHE_MOUNT, str(volume))
    (tmp / "bin").mkdir(exist_ok=True)
    stub = tmp / "bin" / "aws"
    stub.write_text(AWS_STUB, encoding="utf-8")
    stub.chmod(0o755)
    calls = tmp / "calls.log"
    calls.write_text("", encoding="utf-8")
    env = {
        "PATH": f"{tmp / 'bin'}:/usr/bin:/bin",
        "BUCKET_DIR": str(bucket),
        "CALLS": str(calls),
        "FAIL_UPLOAD": "1" if fail_upload else "0",
        "FAIL_DOWNLOAD": "1" if fail_download else "0",
        "FAIL_READ": "1" if fail_read else "0",
    }
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, calls.read_text(encoding="utf-8")


def _published(bucket: Path, key: str) -> list[Path]:
    root = bucket / "results" / "compiled" / key
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def test_first_instance_compiles_and_publishes_later_ones_fetch(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    key = definition_for(*_inf2()).compiled.key  # type: ignore[union-attr]

    out, _ = _boot(tmp_path, tmp_path / "vol-a", bucket)
    assert f"no complete set in s3://results/compiled/{key}; this instance compiles" in out
    assert "server: compiled" in out and "published to" in out and "could not read" not in out
    (shared,) = _published(bucket, key)  # its own prefix under the key
    assert (shared / "model.pt").read_text() == "neff\n" and (shared / COMPLETE_MARKER).read_text() == f"{key}\n"
    assert not (shared / ".harness-complete").exists()  # the local marker stays local

    out, calls = _boot(tmp_path, tmp_path / "vol-b", bucket)  # a new instance: an empty volume
    assert f"compiled artifacts fetched from s3://results/compiled/{key}/{shared.name} in" in out
    assert "server: loaded" in out and f"aws s3 cp --region {REGION} --recursive" in calls and "published" not in out

    out, calls = _boot(tmp_path, tmp_path / "vol-b", bucket)  # the same instance rebooted
    assert "on the cache volume" in out and "server: loaded" in out and "s3 cp" not in calls


def test_every_aws_call_names_the_stacks_region(tmp_path: Path) -> None:
    # As the boot script's other aws calls do: the CLI's default region on the host is not the stack's.
    bucket = tmp_path / "bucket"
    _, compiled = _boot(tmp_path, tmp_path / "vol-a", bucket)  # lists, compiles, publishes
    _, fetched = _boot(tmp_path, tmp_path / "vol-b", bucket)  # lists, fetches
    calls = (compiled + fetched).splitlines()
    downloads = [c for c in fetched.splitlines() if c.startswith("aws s3 cp") and c.split()[-1].startswith("/")]
    assert downloads and any(c.endswith(f"/{COMPLETE_MARKER}") for c in compiled.splitlines())
    for call in calls:
        assert f" --region {REGION} " in call, call


def test_instances_compiling_at_once_publish_apart_and_only_a_complete_set_is_fetched(tmp_path: Path) -> None:
    # A new fleet's instances boot together, so each compiles: one has published, the other is
    # still uploading (no marker yet). A third instance fetches the complete set only.
    bucket = tmp_path / "bucket"
    key = definition_for(*_inf2()).compiled.key  # type: ignore[union-attr]
    _boot(tmp_path, tmp_path / "vol-a", bucket)
    (done,) = _published(bucket, key)
    uploading = done.with_name("ip-10-0-1-9-1")  # sorts before it: listed first
    uploading.mkdir()
    (uploading / "model.pt").write_text("half\n")
    out, _ = _boot(tmp_path, tmp_path / "vol-c", bucket)
    assert f"fetched from s3://results/compiled/{key}/{done.name} in" in out and "server: loaded" in out
    assert (tmp_path / "vol-c" / "compile" / key / "model.pt").read_text() == "neff\n"


def test_a_failed_upload_leaves_no_marker_and_the_next_instance_compiles(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    out, _ = _boot(tmp_path, tmp_path / "vol-a", bucket, fail_upload=True)
    assert "server: compiled" in out and "publishing to s3://results/compiled/" in out and "failed" in out
    out, _ = _boot(tmp_path, tmp_path / "vol-b", bucket)
    assert "this instance compiles" in out and "server: compiled" in out


def test_a_failed_fetch_starts_clean_and_compiles(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    _boot(tmp_path, tmp_path / "vol-a", bucket)  # published
    out, _ = _boot(tmp_path, tmp_path / "vol-b", bucket, fail_download=True)
    assert "fetching s3://results/compiled/" in out and "failed; this instance compiles" in out
    assert "server: compiled" in out  # nothing half-downloaded was loaded


def test_a_bucket_that_cannot_be_read_is_logged_as_such_and_the_instance_compiles(tmp_path: Path) -> None:
    # A set is published, but this instance may not list it (say, a role without the grant): the
    # boot log says so, with the AWS error, rather than "no complete set"; the instance still boots.
    bucket = tmp_path / "bucket"
    key = definition_for(*_inf2()).compiled.key  # type: ignore[union-attr]
    _boot(tmp_path, tmp_path / "vol-a", bucket)
    out, _ = _boot(tmp_path, tmp_path / "vol-b", bucket, fail_read=True)
    assert f"compiled artifacts: could not read s3://results/compiled/{key} (" in out
    assert "(AccessDenied) when calling the ListObjectsV2 operation: Access Denied" in out
    assert "this instance compiles" in out and "server: compiled" in out and "no complete set" not in out


def _inf2() -> tuple[object, object]:
    m = load_manifest(EXAMPLE_MANIFEST, check_files=False)
    return m, m.fleet("inf2")


def test_the_key_names_what_shapes_the_compiled_model() -> None:
    m = load_manifest(EXAMPLE_MANIFEST, check_files=False)
    inf2 = m.fleet("inf2")
    base = definition_for(m, inf2)
    assert base.compiled is not None
    assert base.environment["NEURON_COMPILED_ARTIFACTS"] == base.compiled.directory == base.cache_dir
    assert base.compiled.directory == f"{CACHE_MOUNT}/compile/{base.compiled.key}"
    assert definition_for(m, inf2).compiled == base.compiled  # deterministic
    changed = inf2.model_copy(update={"sequence_buckets": [512, 1024, 2560]})
    other = definition_for(m, changed)
    assert other.compiled is not None and other.compiled.key != base.compiled.key
    assert definition_for(m, m.fleet("g6")).compiled is None  # CUDA vLLM compiles nothing to share
    assert (
        CompiledArtifacts.for_server("inf2.xlarge", "img", ("a",), {}, "/r").key
        != CompiledArtifacts.for_server("inf2.xlarge", "img", ("b",), {}, "/r").key
    )


def test_the_key_names_the_instance_type() -> None:
    # The same server (image, argv, environment: TP2 on one chip) on another instance type is
    # another target, so another key: a fleet never fetches a set compiled for other hardware.
    m = load_manifest(EXAMPLE_MANIFEST, check_files=False)
    inf2 = m.fleet("inf2")
    bigger = inf2.model_copy(update={"instance_type": "inf2.8xlarge"})
    base, other = definition_for(m, inf2), definition_for(m, bigger)
    assert (other.image, other.command) == (base.image, base.command)
    assert base.compiled is not None and other.compiled is not None
    assert other.compiled.key != base.compiled.key
    assert (
        CompiledArtifacts.for_server("inf2.xlarge", "img", ("a",), {}, "/r").key
        != CompiledArtifacts.for_server("trn1.2xlarge", "img", ("a",), {}, "/r").key
    )


def _nxdi_stand_in() -> list[str]:
    """The server as NxD Inference behaves with the fleet's own override_neuron_config (core/serving.py
    cites the sources): compiling writes the NEFF and, with save_sharded_checkpoint, each rank's
    weights/tp<rank>_sharded_checkpoint.safetensors into the compiled directory; loading a set
    compiled with it reads those files, and without it shards the whole checkpoint on the host."""
    import json
    import shlex

    from core.serving import render_docker_run

    m = load_manifest(EXAMPLE_MANIFEST, check_files=False)
    defn = definition_for(m, m.fleet("inf2"))
    assert defn.compiled is not None
    argv = shlex.split(render_docker_run(defn))
    cfg = json.loads(argv[argv.index("--additional-config") + 1])["override_neuron_config"]
    tp = argv[argv.index("--tensor-parallel-size") + 1]
    d = defn.compiled.directory
    shard = f"{d}/weights/tp${{r}}_sharded_checkpoint.safetensors"
    if cfg.get("save_sharded_checkpoint"):
        compile_weights = f'mkdir -p {d}/weights; for r in $(seq 0 $(({tp} - 1))); do echo "rank $r" > {shard}; done'
        load_weights = (
            f'for r in $(seq 0 $(({tp} - 1))); do [ -f {shard} ] || {{ echo "server: no {shard}"; exit 1; }}; done; '
            'echo "server: pre-sharded weights loaded"'
        )
    else:
        compile_weights = "true"
        load_weights = 'echo "server: sharded the whole checkpoint on load"'
    return [
        f'if [ -f {d}/model.pt ]; then echo "server: loaded"; {load_weights}; '
        f'else echo "server: compiled"; echo neff > {d}/model.pt; {compile_weights}; fi'
    ]


def test_the_compiled_set_carries_each_ranks_pre_sharded_weights_and_later_instances_load_them(tmp_path: Path) -> None:
    """Issue 50, item 1: the set published (COMPLETE last, as before) holds weights/tp0 and tp1 (TP 2),
    and an instance that fetches it finds them where NxD Inference's load_weights reads them."""
    bucket = tmp_path / "bucket"
    key = definition_for(*_inf2()).compiled.key  # type: ignore[union-attr]
    _boot(tmp_path, tmp_path / "vol-a", bucket, serve=_nxdi_stand_in())
    (shared,) = _published(bucket, key)
    shards = (
        sorted(str(p.relative_to(shared)) for p in (shared / "weights").glob("*"))
        if (shared / "weights").is_dir()
        else []
    )
    assert shards == ["weights/tp0_sharded_checkpoint.safetensors", "weights/tp1_sharded_checkpoint.safetensors"]
    assert (shared / COMPLETE_MARKER).is_file()

    out, _ = _boot(tmp_path, tmp_path / "vol-b", bucket, serve=_nxdi_stand_in())
    assert "compiled artifacts fetched from" in out and "server: pre-sharded weights loaded" in out
