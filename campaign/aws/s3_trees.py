"""A run's files in the results bucket: whole trees up and down, and a step's records as the
workers upload them (read back while the step runs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from core import cloud_contract as cc


def download_run(s3: Any, uri: str, dest: Path) -> list[Path]:
    """Records and summaries directly under `uri` (one replay or step, not its inputs) into `dest`;
    returns the files. boto3 writes each to a temporary name first, so a reader never sees half a download.
    Workers upload their records as parts that only ever grow (loadgen.recording.RecordParts: a retried
    part is put again with more lines), so a step polled every few seconds fetches only the new ones."""
    return download_tree(
        s3,
        uri,
        dest,
        keep=lambda rel: "/" not in rel and rel.startswith(("records-", "summary-")),
        append_only=lambda rel: rel.startswith("records-"),
    )


def download_tree(
    s3: Any,
    uri: str,
    dest: Path,
    skip: Sequence[str] = (cc.INPUTS_DIR + "/",),
    keep: Callable[[str], bool] = lambda rel: True,
    append_only: Callable[[str], bool] = lambda rel: False,
) -> list[Path]:
    """Everything under `uri` (a whole run: records, capacity steps, quality, report) into `dest`,
    in the same layout, except the prefixes in `skip` and the relative paths `keep` refuses. An object
    `append_only` accepts only ever grows: a local copy of its size is current and is not fetched again."""
    bucket, prefix = cc.split_s3_uri(uri)
    dest.mkdir(parents=True, exist_ok=True)
    got: list[Path] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix) + 1 :]
            if not rel or rel.endswith("/") or any(rel.startswith(s) for s in skip) or ".." in rel.split("/"):
                continue
            if not keep(rel):
                continue
            path = dest / rel
            got.append(path)
            if append_only(rel) and path.is_file() and path.stat().st_size == obj["Size"]:
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, obj["Key"], str(path))
    return sorted(got)


def upload_tree(
    s3: Any,
    src: Path,
    uri: str,
    skip: Callable[[Path], bool] = lambda p: False,
    order: Callable[[str], Any] = lambda rel: rel,
    uploaded: Callable[[Path], None] = lambda p: None,
) -> int:
    """Every file under `src` that `skip` refuses not to `uri`/<relative path>, in `order` of their
    relative paths (by path), `uploaded` called with each once its upload returned (an upload that
    raises stops the tree there); returns how many."""
    bucket, prefix = cc.split_s3_uri(uri)
    n = 0
    for path in sorted((p for p in src.rglob("*") if p.is_file()), key=lambda p: order(p.relative_to(src).as_posix())):
        rel = path.relative_to(src).as_posix()
        if skip(path):
            continue
        s3.upload_file(str(path), bucket, f"{prefix}/{rel}")
        uploaded(path)
        n += 1
    return n
