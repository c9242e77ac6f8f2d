"""A checkpoint's file hashes at one commit, from the Hugging Face Hub, without downloading its weights.

The Hub's paths-info API (`HfApi.get_paths_info`, POST {endpoint}/api/models/{repo}/paths-info/{revision};
huggingface_hub 2.4.0, hf_api.py) answers per file its size, git blob id and, for an LFS file, `lfs.oid`:
the sha256 of the file's content (`RepoFile.lfs.sha256`, the `BlobLfsInfo` built from that answer). A
path the commit lacks is left out of the answer, not refused. A file kept in git itself (a small config)
has only its git blob id, a sha1 of a header and the content, so its sha256 comes from its bytes, fetched
from the file's resolve URL (`hf_hub_url`, {endpoint}/{repo}/resolve/{revision}/{filename}).

The endpoint is HF_ENDPOINT, read when called (huggingface_hub reads it once, at import:
constants.ENDPOINT); the token is huggingface_hub's own (HF_TOKEN, else the saved login; utils/_auth.py
get_token). A gated repository answers 401/403 with `X-Error-Code: GatedRepo`, which huggingface_hub
raises as GatedRepoError (utils/_http.py hf_raise_for_status).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from httpx2 import HTTPError  # huggingface_hub's transport (a dependency of it): its errors' base class
from huggingface_hub import HfApi, get_session, hf_hub_url, hf_raise_for_status
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils._headers import build_hf_headers  # public in huggingface_hub.utils, not re-exported for mypy

from campaign.pin.errors import PinError, PinFailed
from core.manifest import Issue

DEFAULT_ENDPOINT = "https://huggingface.co"  # huggingface_hub constants._HF_DEFAULT_ENDPOINT


@dataclass(frozen=True)
class HubRepo:
    """One checkpoint at one commit, as the Hub serves it."""

    repo: str
    commit: str
    endpoint: str
    token: str | None  # None: huggingface_hub's own (HF_TOKEN or the saved login)

    @classmethod
    def from_environment(cls, repo: str, commit: str) -> HubRepo:
        return cls(repo, commit, os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/"), None)

    def _api(self) -> HfApi:
        return HfApi(endpoint=self.endpoint, token=self.token)

    def files(self, names: Sequence[str], field: str) -> dict[str, RepoFile]:
        """Each of `names` at the commit, by name; PinError naming `field`.NAME for one the commit lacks."""
        try:
            found = self._api().get_paths_info(self.repo, list(names), revision=self.commit)
        except HTTPError as exc:
            raise self._access_error(exc) from None
        by_name = {f.path: f for f in found if isinstance(f, RepoFile)}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise PinError(
                [Issue(f"{field}.{n}", f"no such file in {self.repo} at model.commit {self.commit}") for n in missing]
            )
        return by_name

    def exists(self, name: str) -> bool:
        try:
            found = self._api().get_paths_info(self.repo, [name], revision=self.commit)
        except HTTPError as exc:
            raise self._access_error(exc) from None
        return any(isinstance(f, RepoFile) and f.path == name for f in found)

    def download(self, name: str) -> bytes:
        """The file's bytes at the commit (for the small files only: held in memory)."""
        url = hf_hub_url(self.repo, name, revision=self.commit, endpoint=self.endpoint)
        try:
            response = get_session().get(url, headers=build_hf_headers(token=self.token), follow_redirects=True)
            hf_raise_for_status(response)
        except HTTPError as exc:
            raise self._access_error(exc) from None
        return bytes(response.content)

    def _access_error(self, exc: HTTPError) -> PinError | PinFailed:
        where = f"{self.repo} on {self.endpoint}"
        if isinstance(exc, GatedRepoError):
            return PinError(
                [
                    Issue(
                        "model.repo",
                        f"{where} is gated: accept its licence on the Hub and set HF_TOKEN to a read token of that account",
                    )
                ]
            )
        if isinstance(exc, RevisionNotFoundError):
            return PinError([Issue("model.commit", f"{self.commit} is not a revision of {where}")])
        if isinstance(exc, RepositoryNotFoundError):
            return PinError([Issue("model.repo", f"{where} does not exist, or is private and HF_TOKEN cannot read it")])
        return PinFailed(f"the Hub at {self.endpoint} (HF_ENDPOINT) failed: {exc}")


def sha256_of(repo: HubRepo, f: RepoFile) -> str:
    """The file's sha256: the Hub's LFS pointer when it is an LFS file, else its bytes hashed."""
    if f.lfs is not None:
        return str(f.lfs.sha256)
    return hashlib.sha256(repo.download(f.path)).hexdigest()


def weight_hashes(repo: HubRepo, names: Sequence[str]) -> dict[str, str]:
    """model.weight_files' hashes at the commit, from the Hub's metadata (no weight is downloaded)."""
    found = repo.files(names, "model.weight_files")
    return {n: sha256_of(repo, found[n]) for n in names}


def download_tokenizer_files(repo: HubRepo, names: Sequence[str]) -> dict[str, bytes]:
    """The tokenizer files' bytes at the commit. An LFS file's bytes must hash to the Hub's pointer:
    a mismatch is a corrupted transfer."""
    found = repo.files(names, "tokenizer.files")
    contents: dict[str, bytes] = {}
    for n in names:
        data = repo.download(n)
        lfs = found[n].lfs
        if lfs is not None and hashlib.sha256(data).hexdigest() != lfs.sha256:
            raise PinFailed(f"{n}: the bytes downloaded from {repo.endpoint} do not hash to the Hub's LFS sha256")
        contents[n] = data
    return contents


def write_files(contents: dict[str, bytes], into: Path) -> dict[str, str]:
    """Write the files into `into` (pin's staging directory, moved beside tokenizer.path once its
    checks pass: campaign/pin/pin.py); their sha256 by name."""
    into.mkdir(parents=True, exist_ok=True)
    for n, data in contents.items():
        (into / n).write_bytes(data)
    return {n: hashlib.sha256(data).hexdigest() for n, data in contents.items()}
