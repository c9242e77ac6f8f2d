"""A huggingface tokenizer's pinned files (tokenizer.files): hashes checked, the chat template
read from them as the server reads it, and the manifest's own template held to it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from core.manifest import ManifestError, load_manifest
from tests.conftest import write_manifest

TEMPLATE = "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _checkpoint(d: Path, config: dict[str, Any], jinja: str | None = None) -> dict[str, str]:
    """A checkpoint's tokenizer files in `d`; returns {name: sha256}."""
    d.mkdir(parents=True, exist_ok=True)
    files = {"tokenizer.json": b'{"model": "synthetic"}', "tokenizer_config.json": json.dumps(config).encode()}
    if jinja is not None:
        files["chat_template.jinja"] = jinja.encode()
    for name, data in files.items():
        (d / name).write_bytes(data)
    return {name: _sha(data) for name, data in files.items()}


def _huggingface(data: dict[str, Any], d: Path, files: dict[str, str], **extra: Any) -> dict[str, Any]:
    data["tokenizer"] = {
        "kind": "huggingface",
        "path": str(d / "tokenizer.json"),
        "files": files,
        "special_tokens": {"bos_token": "<|begin_of_text|>"},
        "max_length": 8192,
        **extra,
    }
    return data


def _issues(path: Path) -> dict[str, str]:
    with pytest.raises(ManifestError) as exc:
        load_manifest(path)
    return {i.path: i.reason for i in exc.value.issues}


def test_the_template_comes_from_the_pinned_tokenizer_config(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    files = _checkpoint(tmp_path / "ckpt", {"chat_template": TEMPLATE})
    m = load_manifest(write_manifest(tmp_path, _huggingface(manifest_data, tmp_path / "ckpt", files)))
    assert m.tokenizer.chat_template is None and m.chat_template == TEMPLATE
    # The same template written into the manifest agrees with the file.
    same = _huggingface(manifest_data, tmp_path / "ckpt", files, chat_template=TEMPLATE)
    assert load_manifest(write_manifest(tmp_path, same, "same.yaml")).chat_template == TEMPLATE


def test_a_manifest_template_other_than_the_checkpoints_is_an_error_naming_the_field(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    files = _checkpoint(tmp_path / "ckpt", {"chat_template": TEMPLATE})
    other = _huggingface(manifest_data, tmp_path / "ckpt", files, chat_template=TEMPLATE + " ")
    issues = _issues(write_manifest(tmp_path, other))
    assert list(issues) == ["tokenizer.chat_template"]
    assert "differs from the checkpoint's template in tokenizer_config.json" in issues["tokenizer.chat_template"]


def test_a_pinned_chat_template_jinja_wins_over_tokenizer_config(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    """transformers reads chat_template.jinja before tokenizer_config.json's template."""
    files = _checkpoint(tmp_path / "ckpt", {"chat_template": "old"}, jinja=TEMPLATE)
    m = load_manifest(write_manifest(tmp_path, _huggingface(manifest_data, tmp_path / "ckpt", files)))
    assert m.chat_template == TEMPLATE
    # Left unpinned beside the pinned files, the server would still render with it: refused.
    del files["chat_template.jinja"]
    issues = _issues(write_manifest(tmp_path, _huggingface(manifest_data, tmp_path / "ckpt", files), "b.yaml"))
    assert list(issues) == ["tokenizer.files"] and "chat_template.jinja" in issues["tokenizer.files"]


def test_named_templates_render_the_default_one(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    config = {"chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": TEMPLATE}]}
    files = _checkpoint(tmp_path / "ckpt", config)
    m = load_manifest(write_manifest(tmp_path, _huggingface(manifest_data, tmp_path / "ckpt", files)))
    assert m.chat_template == TEMPLATE


def test_a_checkpoint_without_a_template_is_refused(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    files = _checkpoint(tmp_path / "ckpt", {"bos_token": "<s>"})
    issues = _issues(write_manifest(tmp_path, _huggingface(manifest_data, tmp_path / "ckpt", files)))
    assert list(issues) == ["tokenizer.chat_template"] and "has no chat template" in issues["tokenizer.chat_template"]


def test_a_file_whose_hash_differs_names_the_file_and_both_hashes(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    files = _checkpoint(tmp_path / "ckpt", {"chat_template": TEMPLATE})
    path = write_manifest(tmp_path, _huggingface(manifest_data, tmp_path / "ckpt", files))
    (tmp_path / "ckpt" / "tokenizer.json").write_bytes(b"another tokenizer")
    issues = _issues(path)
    assert list(issues) == ["tokenizer.files.tokenizer.json"]
    reason = issues["tokenizer.files.tokenizer.json"]
    assert _sha(b"another tokenizer") in reason and files["tokenizer.json"] in reason
    (tmp_path / "ckpt" / "tokenizer_config.json").unlink()
    assert "no such file" in _issues(path)["tokenizer.files.tokenizer_config.json"]


@pytest.mark.parametrize(
    ("tokenizer", "message"),
    [
        ({"files": {"tokenizer.json": "0" * 64}}, "pin tokenizer_config.json too"),
        ({"files": {"tokenizer_config.json": "0" * 64}}, "pin tokenizer.json too"),
        ({"kind": "emulator", "files": {"tokenizer_config.json": "0" * 64}}, "only a huggingface tokenizer"),
        ({"files": {}}, "chat_template: required"),
        ({"files": {"../tokenizer.json": "0" * 64}}, "should match pattern"),
    ],
)
def test_pinned_files_must_be_complete_and_plain_names(
    tmp_path: Path, manifest_data: dict[str, Any], tokenizer: dict[str, Any], message: str
) -> None:
    data = _huggingface(manifest_data, tmp_path, {})
    data["tokenizer"].update(tokenizer)
    with pytest.raises(ManifestError, match="tokenizer") as exc:
        load_manifest(write_manifest(tmp_path, data), check_files=False)
    assert message in str(exc.value)


def test_the_digest_covers_the_pinned_hashes_and_no_pin_keeps_the_old_digest(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    example = load_manifest(write_manifest(tmp_path, manifest_data, "example.yaml"))
    manifest_data["tokenizer"]["files"] = {}  # written out empty: the same comparison, the same digest
    assert load_manifest(write_manifest(tmp_path, manifest_data, "empty.yaml")).digest == example.digest
    files = _checkpoint(tmp_path / "ckpt", {"chat_template": TEMPLATE})
    a = load_manifest(write_manifest(tmp_path, _huggingface(manifest_data, tmp_path / "ckpt", files), "a.yaml"))
    (tmp_path / "ckpt" / "tokenizer.json").write_bytes(b"retrained")
    files["tokenizer.json"] = _sha(b"retrained")
    b = load_manifest(write_manifest(tmp_path, _huggingface(manifest_data, tmp_path / "ckpt", files), "b.yaml"))
    assert a.digest != b.digest
