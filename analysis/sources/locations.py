"""Where a campaign's records are: a local directory or an `s3://bucket/prefix`, behind one
fsspec filesystem, so the records' loader lists, checks and scans both by the same code.

For S3, duckdb reads the objects in place through the same filesystem (registered with
`DuckDBPyConnection.register_filesystem`): Parquet by ranged reads of the columns the analysis
needs, JSONL streamed. Nothing is copied down first, except the complete lines of a JSONL
object cut mid-write, which go to a temporary file as they do for a local one.

The filesystem is pyarrow's S3 client (a pinned wheel, with the standard AWS credential chain)
wrapped for fsspec. duckdb's own httpfs extension would do the same, but it is downloaded at
run time from duckdb's extension repository, for the exact duckdb build: no pinned package
provides it, and a campaign machine or CI without that download could not read S3 at all.
`AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL` (the AWS SDKs' variables) point it at another
endpoint, as the tests do at a moto server.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from fsspec import AbstractFileSystem
from fsspec.implementations.arrow import ArrowFSWrapper
from fsspec.implementations.local import LocalFileSystem

from analysis.errors import EmptyWindow

S3_SCHEME = "s3://"


class _S3(ArrowFSWrapper):  # type: ignore[misc]
    """pyarrow's S3 filesystem under the "s3" protocol, so duckdb routes s3:// paths to it."""

    protocol = "s3"


@dataclass(frozen=True)
class RecordsLocation:
    fs: AbstractFileSystem
    root: str  # the directory or prefix as the filesystem names it (bucket/prefix for S3)
    scheme: str  # "" for a local directory, "s3://" for S3

    @property
    def remote(self) -> bool:
        return bool(self.scheme)

    def url(self, path: str) -> str:
        """What duckdb reads: the local path, or the s3:// URI."""
        return self.scheme + path

    def relative(self, path: str) -> str:
        return posixpath.relpath(path, self.root) if self.remote else Path(path).relative_to(self.root).as_posix()

    def find(self, name_glob: str, *, non_empty: bool = False) -> list[str]:
        """Every file below the root whose name matches, sorted (one listing, sizes included)."""
        found: dict[str, dict[str, Any]] = self.fs.find(self.root, detail=True)
        return sorted(
            p
            for p, info in found.items()
            if fnmatch.fnmatch(posixpath.basename(p), name_glob) and (not non_empty or int(info.get("size") or 0) > 0)
        )

    def last_byte(self, path: str) -> bytes:
        with self.fs.open(path, "rb") as fh:
            fh.seek(-1, 2)
            return bytes(fh.read(1))

    def read_bytes(self, path: str) -> bytes:
        return bytes(self.fs.cat_file(path))

    def register(self, con: Any) -> None:
        """Let duckdb read this location's URIs (nothing to do for local paths)."""
        if self.remote:
            con.register_filesystem(self.fs)


def s3_filesystem(region: str | None = None) -> AbstractFileSystem:
    from pyarrow import fs as pafs

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    kw: dict[str, Any] = {
        "region": region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    }
    if endpoint:
        parsed = urlparse(endpoint)
        kw.update(endpoint_override=parsed.netloc or parsed.path, scheme=parsed.scheme or "https")
    return _S3(pafs.S3FileSystem(**kw))


def open_location(records: str | Path) -> RecordsLocation:
    """A local directory, or an s3://bucket/prefix URI; EmptyWindow when there is none."""
    text = str(records)
    if text.startswith(S3_SCHEME):
        root = text[len(S3_SCHEME) :].rstrip("/")
        if not root or root.startswith("/"):
            raise EmptyWindow(f"records location {text!r} names no bucket (s3://BUCKET/PREFIX)")
        fs = s3_filesystem()
        try:
            if not fs.isdir(root):
                raise EmptyWindow(f"no records under {text}: the prefix holds no objects")
        except OSError as exc:
            raise EmptyWindow(f"cannot list {text}: {exc}") from None
        return RecordsLocation(fs, root, S3_SCHEME)
    d = Path(records)
    if not d.is_dir():
        raise EmptyWindow(f"records directory {d} does not exist")
    return RecordsLocation(LocalFileSystem(), Path(d).resolve().as_posix(), "")
