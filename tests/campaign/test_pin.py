"""`pin MANIFEST` against a stub Hugging Face Hub and a stub OCI registry, both on loopback.

The stub Hub answers the two routes huggingface_hub 2.4.0 calls: POST /api/models/{repo}/paths-info/{rev}
(hf_api.py get_paths_info; form fields `paths`, one per path; a path the revision lacks is left out)
and GET /{repo}/resolve/{rev}/{file} (file_download.py hf_hub_url), refusing a gated repo without a
token with `X-Error-Code: GatedRepo` (utils/_http.py hf_raise_for_status). The stub registry wants a
Bearer token (401 + WWW-Authenticate) that its token route hands out anonymously.
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from campaign.aws.cloud_checks import ILLUSTRATIVE_VALUES, cloud_issues
from campaign.cli.main import main
from campaign.pin.errors import PinFailed
from campaign.pin.registry import MANIFEST_MEDIA_TYPES, ImageTag, image_tag, resolve_digest
from core.errors import EXIT_BAD_INPUT, EXIT_FAILED_STEP, EXIT_OK
from core.manifest import load_manifest
from tests.conftest import write_manifest

REPO = "acme/tiny-chat"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
WEIGHTS = {"model-00001-of-00002.safetensors": "a" * 64, "model-00002-of-00002.safetensors": "b" * 64}
TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
TOKENIZER_FILES = {
    "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}',
    "tokenizer_config.json": json.dumps({"chat_template": "config's template, shadowed by the jinja file"}).encode(),
    "chat_template.jinja": TEMPLATE.encode(),
}
ILLUSTRATIVE = sorted(ILLUSTRATIVE_VALUES)
REGISTRY_TOKEN = "anonymous-pull-token"
NEURON_TAG = "0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04"  # the documented tag core/serving.py checks


@dataclass
class StubHub:
    gated_token: str | None = None  # set: the repo is gated, and only this token reads it
    gate_metadata: bool = True  # False: file metadata is public, only downloads need the token
    files: dict[str, bytes] = field(default_factory=lambda: dict(TOKENIZER_FILES))
    lfs: dict[str, str] = field(default_factory=lambda: dict(WEIGHTS))  # LFS files: name -> sha256
    lfs_too: frozenset[str] = frozenset({"tokenizer.json"})  # git-stored files the Hub also keeps in LFS
    downloads: list[str] = field(default_factory=list)

    def entry(self, name: str) -> dict[str, Any] | None:
        if name in self.lfs:
            return {"type": "file", "path": name, "size": 5 << 30, "oid": "1" * 40, "lfs": _lfs(self.lfs[name])}
        if name in self.files:
            data = self.files[name]
            lfs = _lfs(hashlib.sha256(data).hexdigest()) if name in self.lfs_too else None
            return {"type": "file", "path": name, "size": len(data), "oid": "2" * 40, "lfs": lfs}
        return None


def _lfs(sha256: str) -> dict[str, Any]:
    return {"oid": sha256, "size": 1, "pointerSize": 134}


@dataclass
class StubRegistry:
    digests: dict[str, str] = field(default_factory=dict)  # "repository:tag" -> digest
    heads: list[dict[str, str]] = field(default_factory=list)  # each HEAD's headers
    token_queries: list[dict[str, list[str]]] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    hub: StubHub
    registry: StubRegistry
    base: str

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _hub_refuses(self, *, metadata: bool = False) -> bool:
        want = self.hub.gated_token if self.hub.gate_metadata or not metadata else None
        if want is not None and self.headers.get("Authorization") != f"Bearer {want}":
            self._send(401, b"gated", {"X-Error-Code": "GatedRepo", "X-Error-Message": "Access to model is restricted"})
            return True
        return False

    def do_POST(self) -> None:
        prefix = f"/api/models/{REPO}/paths-info/"
        if not self.path.startswith(prefix):
            return self._send(404, b"", {"X-Error-Code": "RepoNotFound"})
        if self.path.removeprefix(prefix) != COMMIT:
            return self._send(404, b"", {"X-Error-Code": "RevisionNotFound"})
        if self._hub_refuses(metadata=True):
            return None
        form = urllib.parse.parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
        found = [e for p in form.get("paths", []) if (e := self.hub.entry(p)) is not None]
        return self._send(200, json.dumps(found).encode(), {"Content-Type": "application/json"})

    def do_GET(self) -> None:
        if self.path.startswith("/token?"):
            self.registry.token_queries.append(urllib.parse.parse_qs(self.path.partition("?")[2]))
            return self._send(200, json.dumps({"token": REGISTRY_TOKEN}).encode())
        prefix = f"/{REPO}/resolve/{COMMIT}/"
        if not self.path.startswith(prefix):
            return self._send(404, b"", {"X-Error-Code": "EntryNotFound"})
        if self._hub_refuses():
            return None
        name = self.path.removeprefix(prefix)
        self.hub.downloads.append(name)
        if name not in self.hub.files:
            return self._send(404, b"", {"X-Error-Code": "EntryNotFound"})
        return self._send(200, self.hub.files[name])

    def do_HEAD(self) -> None:
        path = self.path.removeprefix("/v2/")
        repository, _, tag = path.partition("/manifests/")
        self.registry.heads.append(dict(self.headers))
        if self.headers.get("Authorization") != f"Bearer {REGISTRY_TOKEN}":
            challenge = f'Bearer realm="{self.base}/token",service="stub-registry",scope="repository:{repository}:pull"'
            return self._send(401, b"", {"WWW-Authenticate": challenge})
        digest = self.registry.digests.get(f"{repository}:{tag}")
        if digest is None:
            return self._send(404)
        return self._send(200, b"", {"Docker-Content-Digest": digest})


@dataclass
class Stubs:
    hub: StubHub
    registry: StubRegistry
    host: str  # 127.0.0.1:PORT: the Hub's endpoint and the registry's host


@pytest.fixture
def stubs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Stubs]:
    hub, registry = StubHub(), StubRegistry()
    handler = type("Handler", (_Handler,), {"hub": hub, "registry": registry})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    host = f"127.0.0.1:{server.server_address[1]}"
    handler.base = f"http://{host}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://{host}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no saved login of the machine's user
    monkeypatch.delenv("HF_TOKEN", raising=False)
    try:
        yield Stubs(hub, registry, host)
    finally:
        server.shutdown()
        server.server_close()


def _manifest(tmp_path: Path, manifest_data: dict[str, Any], host: str, *, digests: tuple[str, str]) -> Path:
    data = manifest_data
    data["model"].update(repo=REPO, commit=COMMIT, weight_files=dict.fromkeys(WEIGHTS, ILLUSTRATIVE[0]))
    data["tokenizer"].update(
        kind="huggingface",
        path="tok/tokenizer.json",
        files={"tokenizer.json": ILLUSTRATIVE[1], "tokenizer_config.json": ILLUSTRATIVE[2]},
        chat_template="the example's template",
    )
    data["fleets"][0]["serving"]["image"] = f"{host}/neuron/vllm-neuronx:{NEURON_TAG}@{digests[0]}"
    data["fleets"][1]["serving"]["image"] = f"{host}/vllm/vllm-openai:v0.9.0@{digests[1]}"
    path = write_manifest(tmp_path, data)
    path.write_text("# my campaign, my comments\n" + path.read_text())
    return path


DIGEST_INF2 = "sha256:" + "c" * 64
DIGEST_G6 = "sha256:" + "d" * 64


def _serve_images(stubs: Stubs) -> None:
    stubs.registry.digests.update(
        {f"neuron/vllm-neuronx:{NEURON_TAG}": DIGEST_INF2, "vllm/vllm-openai:v0.9.0": DIGEST_G6}
    )


def test_pin_writes_hub_hashes_tokenizer_files_template_and_digests(
    stubs: Stubs, tmp_path: Path, manifest_data: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    _serve_images(stubs)
    path = _manifest(
        tmp_path, manifest_data, stubs.host, digests=(f"sha256:{ILLUSTRATIVE[3]}", f"sha256:{ILLUSTRATIVE[4]}")
    )

    assert main(["pin", str(path)]) == EXIT_OK

    out = capsys.readouterr().out
    text = path.read_text()
    assert text.startswith("# my campaign, my comments\n")  # edited in place, the user's comment kept
    m = load_manifest(path)  # the tokenizer files are there with the hashes written
    assert m.model.weight_files == WEIGHTS  # the Hub's LFS sha256 ...
    assert not set(stubs.hub.downloads) & set(WEIGHTS)  # ... without downloading a weight
    assert m.tokenizer.files == {n: hashlib.sha256(b).hexdigest() for n, b in TOKENIZER_FILES.items()}
    assert (tmp_path / "tok" / "chat_template.jinja").read_bytes() == TOKENIZER_FILES["chat_template.jinja"]
    assert m.tokenizer.chat_template == TEMPLATE  # the checkpoint's (the jinja file before the config's)
    assert m.fleets[0].serving.image == f"{stubs.host}/neuron/vllm-neuronx:{NEURON_TAG}@{DIGEST_INF2}"
    assert m.fleets[1].serving.image == f"{stubs.host}/vllm/vllm-openai:v0.9.0@{DIGEST_G6}"
    diff = {line[0] + line[1:].strip() for line in out.splitlines() if line[:1] in "+-"}  # the unified diff's lines
    assert f"-image: {stubs.host}/neuron/vllm-neuronx:{NEURON_TAG}@sha256:{ILLUSTRATIVE[3]}" in diff
    assert f"+image: {stubs.host}/neuron/vllm-neuronx:{NEURON_TAG}@{DIGEST_INF2}" in diff
    assert f"+chat_template.jinja: {hashlib.sha256(TEMPLATE.encode()).hexdigest()}" in diff
    # Nothing illustrative left for `validate --for cloud` to refuse in what pin resolves.
    fields = {i.path for i in cloud_issues(m, docker_hub_credential_arn=None)}
    assert not any(f.startswith(("model.weight_files", "tokenizer", "fleets[")) for f in fields), fields

    assert main(["pin", str(path)]) == EXIT_OK  # a second run finds nothing to change
    assert "already pinned" in capsys.readouterr().out
    assert path.read_text() == text


def test_registry_401_then_anonymous_token(stubs: Stubs) -> None:
    _serve_images(stubs)
    ref = image_tag(f"{stubs.host}/vllm/vllm-openai:v0.9.0@sha256:{'0' * 64}")
    assert ref is not None

    assert resolve_digest(ref) == DIGEST_G6

    first, second = stubs.registry.heads
    assert "Authorization" not in first and second["Authorization"] == f"Bearer {REGISTRY_TOKEN}"
    assert first["Accept"].split(", ")[0] == MANIFEST_MEDIA_TYPES[0]  # the index's digest, for a multi-arch tag
    assert stubs.registry.token_queries == [
        {"service": ["stub-registry"], "scope": ["repository:vllm/vllm-openai:pull"]}
    ]


# huggingface/huggingface_hub#2457: a gated repository's metadata answered without a token (closed);
# either way, the files are refused without one.
@pytest.mark.parametrize("gate_metadata", [True, False], ids=["metadata-gated", "downloads-gated"])
def test_gated_repo_without_token_is_refused_and_with_it_pinned(
    gate_metadata: bool,
    stubs: Stubs,
    tmp_path: Path,
    manifest_data: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _serve_images(stubs)
    stubs.hub.gated_token, stubs.hub.gate_metadata = "hf_reader", gate_metadata
    path = _manifest(
        tmp_path, manifest_data, stubs.host, digests=(f"sha256:{ILLUSTRATIVE[3]}", f"sha256:{ILLUSTRATIVE[4]}")
    )
    before = path.read_text()

    assert main(["pin", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "model.repo:" in err and "gated" in err and "HF_TOKEN" in err
    assert path.read_text() == before
    assert not (tmp_path / "tok").exists()

    monkeypatch.setenv("HF_TOKEN", "hf_reader")  # huggingface_hub's own token variable, honoured
    assert main(["pin", str(path)]) == EXIT_OK
    assert load_manifest(path).model.weight_files == WEIGHTS


def test_a_file_the_commit_lacks_is_named(
    stubs: Stubs, tmp_path: Path, manifest_data: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    _serve_images(stubs)
    del stubs.hub.lfs["model-00002-of-00002.safetensors"]
    path = _manifest(
        tmp_path, manifest_data, stubs.host, digests=(f"sha256:{ILLUSTRATIVE[3]}", f"sha256:{ILLUSTRATIVE[4]}")
    )
    before = path.read_text()

    assert main(["pin", str(path)]) == EXIT_BAD_INPUT

    err = capsys.readouterr().err
    assert (
        f"model.weight_files.model-00002-of-00002.safetensors: no such file in {REPO} at model.commit {COMMIT}" in err
    )
    assert path.read_text() == before


def test_a_moved_tag_is_refused_unless_update(
    stubs: Stubs, tmp_path: Path, manifest_data: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    _serve_images(stubs)
    pinned_before = "sha256:" + "e" * 64  # a real pin, not an example's: the tag has moved since
    path = _manifest(tmp_path, manifest_data, stubs.host, digests=(pinned_before, f"sha256:{ILLUSTRATIVE[4]}"))
    before = path.read_text()

    assert main(["pin", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"fleets[0].serving.image: tag {NEURON_TAG} is now {DIGEST_INF2}, not the pinned {pinned_before}" in err
    assert "--update" in err
    assert path.read_text() == before  # nothing written, the tokenizer files neither
    assert not (tmp_path / "tok").exists()

    out = tmp_path / "pinned.yaml"
    assert main(["pin", str(path), "--update", "--out", str(out)]) == EXIT_OK
    assert load_manifest(out).fleets[0].serving.image.endswith(DIGEST_INF2)
    assert path.read_text() == before  # --out leaves the manifest as it was


def test_an_image_without_a_tag_is_named(
    stubs: Stubs, tmp_path: Path, manifest_data: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    _serve_images(stubs)
    path = _manifest(
        tmp_path, manifest_data, stubs.host, digests=(f"sha256:{ILLUSTRATIVE[3]}", f"sha256:{ILLUSTRATIVE[4]}")
    )
    untagged = f"{stubs.host}/vllm/vllm-openai@sha256:{ILLUSTRATIVE[4]}"
    path.write_text(
        path.read_text().replace(f"{stubs.host}/vllm/vllm-openai:v0.9.0@sha256:{ILLUSTRATIVE[4]}", untagged)
    )

    assert main(["pin", str(path)]) == EXIT_BAD_INPUT

    assert (
        f"fleets[1].serving.image: no tag to resolve: write the tag the image is pinned from ({stubs.host}/vllm/vllm-openai:TAG@"
        in (capsys.readouterr().err)
    )


def test_an_unknown_tag_fails_the_step(
    stubs: Stubs, tmp_path: Path, manifest_data: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    stubs.registry.digests[f"neuron/vllm-neuronx:{NEURON_TAG}"] = DIGEST_INF2  # the g6 tag is not there
    path = _manifest(
        tmp_path, manifest_data, stubs.host, digests=(f"sha256:{ILLUSTRATIVE[3]}", f"sha256:{ILLUSTRATIVE[4]}")
    )

    assert main(["pin", str(path)]) == EXIT_FAILED_STEP

    assert f"{stubs.host}/vllm/vllm-openai: no tag 'v0.9.0' (HTTP 404)" in capsys.readouterr().err


def test_docker_hub_images_resolve_on_its_registry() -> None:
    assert image_tag(f"vllm/vllm-openai:v0.9.0@sha256:{'0' * 64}") == image_tag("docker.io/vllm/vllm-openai:v0.9.0")
    ref = image_tag("nginx:1.27")
    assert ref is not None and (ref.registry, ref.repository, ref.tag) == (
        "registry-1.docker.io",
        "library/nginx",
        "1.27",
    )
    assert ref.base_url == "https://registry-1.docker.io"
    ecr = image_tag(f"public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:{NEURON_TAG}@sha256:" + "0" * 64)
    assert ecr is not None and (ecr.registry, ecr.repository, ecr.tag) == (
        "public.ecr.aws",
        "neuron/pytorch-inference-vllm-neuronx",
        NEURON_TAG,
    )
    assert image_tag(f"localhost:5000/app@sha256:{'0' * 64}") is None  # a port, not a tag


def test_validate_for_cloud_points_at_pin(manifest_data: dict[str, Any], tmp_path: Path) -> None:
    m = load_manifest(write_manifest(tmp_path, manifest_data))
    advice = {i.path: i.reason for i in cloud_issues(m, docker_hub_credential_arn=None)}
    assert "inf2-vs-g6 pin" in advice["model.weight_files.model-00001-of-00004.safetensors"]
    assert "inf2-vs-g6 pin" in advice["fleets[0].serving.image"]


def test_yaml_edits_keep_the_rest_of_the_text() -> None:
    from campaign.pin.yaml_edit import AddEntry, SetValue, apply_edits

    text = "a:  # why a\n  files:\n    x.json: old  # pinned by hand\n  template: >-\n    folded\n    text\nb: [1, 2]\n"
    new = apply_edits(
        text,
        [
            SetValue(("a", "files", "x.json"), "1" + "0" * 62 + "5"),  # reads as a number unquoted
            AddEntry(("a", "files"), "y.jinja", "f" * 64),
            SetValue(("a", "template"), "{{ a }}: b"),
        ],
    )
    assert new == (
        "a:  # why a\n"
        "  files:\n"
        f'    x.json: "1{"0" * 62}5"  # pinned by hand\n'
        f"    y.jinja: {'f' * 64}\n"
        '  template: "{{ a }}: b"\n'
        "b: [1, 2]\n"
    )
    assert yaml.safe_load(new)["a"]["files"]["x.json"] == "1" + "0" * 62 + "5"


def test_an_unreachable_hub_or_registry_fails_the_step_by_name(
    stubs: Stubs,
    tmp_path: Path,
    manifest_data: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = _manifest(
        tmp_path, manifest_data, stubs.host, digests=(f"sha256:{ILLUSTRATIVE[3]}", f"sha256:{ILLUSTRATIVE[4]}")
    )
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard: nothing listens

    assert main(["pin", str(path)]) == EXIT_FAILED_STEP
    assert "pin: the Hub at http://127.0.0.1:9 (HF_ENDPOINT) failed" in capsys.readouterr().err

    with pytest.raises(PinFailed, match=r"127\.0\.0\.1:9: cannot reach the registry"):
        resolve_digest(ImageTag("127.0.0.1:9", "app", "v1"))


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("refusal", ["no-chat-template", "unpinned-chat-template-file"])
def test_a_refusal_at_the_tokenizer_checks_writes_nothing(
    refusal: str,
    stubs: Stubs,
    tmp_path: Path,
    manifest_data: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 46, finding 9: pin wrote the tokenizer files, and the manifest, before the checks that
    refused them: the checkpoint's chat template (no-chat-template: its tokenizer_config.json has
    none, and no chat_template.jinja), and the pinned manifest's file checks (a chat_template.jinja
    in the tokenizer directory the commit does not have, which the server would read unpinned)."""
    _serve_images(stubs)
    del stubs.hub.files["chat_template.jinja"]
    if refusal == "no-chat-template":
        stubs.hub.files["tokenizer_config.json"] = json.dumps({"model_max_length": 4096}).encode()
        expected = "tokenizer.chat_template: the checkpoint has no chat template"
    else:
        expected = "tokenizer.files: "
    path = _manifest(
        tmp_path, manifest_data, stubs.host, digests=(f"sha256:{ILLUSTRATIVE[3]}", f"sha256:{ILLUSTRATIVE[4]}")
    )
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_bytes(b'{"an older": "download"}')
    if refusal == "unpinned-chat-template-file":
        (tok / "chat_template.jinja").write_text("a template left from another checkpoint")
    before, files_before = path.read_bytes(), _tree(tok)

    assert main(["pin", str(path)]) == EXIT_BAD_INPUT

    err = capsys.readouterr().err
    assert expected in err, err
    assert path.read_bytes() == before
    assert _tree(tok) == files_before  # old code: the Hub's tokenizer.json and tokenizer_config.json written
