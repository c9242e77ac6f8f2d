"""The generated checkpoint the real engine serves agrees with the manifest that describes it."""

from __future__ import annotations

import copy
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.manifest import file_sha256, load_manifest
from core.tokenizer import HuggingFaceTokenizer, apply_chat_template
from runtime import tiny_model
from tests.conftest import ROOT

REAL_MANIFEST = ROOT / "manifests" / "tiny-llama-real-engine.yaml"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    d = tmp_path_factory.mktemp("tiny")
    return d, tiny_model.generate(d)


@pytest.fixture(scope="module")
def manifest_data() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(REAL_MANIFEST.read_text())
    return data


def test_weights_are_the_bytes_the_manifest_pins(
    generated: tuple[Path, dict[str, str]], manifest_data: dict[str, Any]
) -> None:
    _, digests = generated
    pinned = manifest_data["model"]["weight_files"]
    assert {k: digests[k] for k in pinned} == pinned
    assert manifest_data["model"]["commit"] == pinned["model.safetensors"][:40]


def test_generation_is_deterministic(generated: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    _, first = generated
    assert tiny_model.generate(tmp_path) == first


def test_config_matches_the_manifest_model_section(
    generated: tuple[Path, dict[str, str]], manifest_data: dict[str, Any]
) -> None:
    d, _ = generated
    cfg = json.loads((d / "config.json").read_text())
    mm = manifest_data["model"]
    pairs = {
        "num_hidden_layers": "layers",
        "hidden_size": "hidden_size",
        "num_attention_heads": "attention_heads",
        "num_key_value_heads": "kv_heads",
        "head_dim": "head_dim",
        "vocab_size": "vocab_size",
    }
    assert {k: cfg[k] for k in pairs} == {k: mm[v] for k, v in pairs.items()}


def test_safetensors_header_covers_every_byte(generated: tuple[Path, dict[str, str]]) -> None:
    d, _ = generated
    raw = (d / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__")
    spans = sorted(v["data_offsets"] for v in header.values())
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    assert 8 + n + spans[-1][1] == len(raw)
    for v in header.values():
        count = 1
        for dim in v["shape"]:
            count *= dim
        assert v["data_offsets"][1] - v["data_offsets"][0] == 4 * count  # F32


def _loadable(manifest_data: dict[str, Any], checkpoint: Path, tmp_path: Path) -> Path:
    """The real-engine manifest pointed at a generated checkpoint (and at the trace) from tmp_path."""
    data = copy.deepcopy(manifest_data)
    data["tokenizer"]["path"] = str(checkpoint / "tokenizer.json")
    data["workload"]["trace"]["path"] = str(ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv")
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def test_tokenizer_files_are_the_bytes_the_manifest_pins(
    generated: tuple[Path, dict[str, str]], manifest_data: dict[str, Any]
) -> None:
    _, digests = generated
    pinned = manifest_data["tokenizer"]["files"]
    assert set(pinned) == set(tiny_model.TOKENIZER_FILES)
    assert {k: digests[k] for k in pinned} == pinned


def test_tokenizer_files_are_the_same_bytes_from_another_process(
    generated: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """Another interpreter, hash seed and tokenizers thread count write the same files."""
    _, digests = generated
    code = "import sys; from pathlib import Path; from runtime.tiny_model import write_tokenizer; write_tokenizer(Path(sys.argv[1]))"
    env = {**os.environ, "PYTHONHASHSEED": "12345", "RAYON_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, env=env, cwd=ROOT, timeout=120)
    assert {p.name: file_sha256(p) for p in tmp_path.iterdir()} == {n: digests[n] for n in tiny_model.TOKENIZER_FILES}


def test_manifest_template_renders_what_the_checkpoint_renders(
    generated: tuple[Path, dict[str, str]], manifest_data: dict[str, Any], tmp_path: Path
) -> None:
    """The manifest reads its chat template from the pinned chat_template.jinja, the server's."""
    d, _ = generated
    assert "chat_template" not in manifest_data["tokenizer"]
    m = load_manifest(_loadable(manifest_data, d, tmp_path))
    assert m.chat_template == (d / "chat_template.jinja").read_text() == tiny_model.CHAT_TEMPLATE
    messages = [{"role": "user", "content": "the model latency"}]
    text = apply_chat_template(m.chat_template, messages, m.tokenizer.special_tokens)
    assert text.startswith(tiny_model.BOS) and text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    tok = HuggingFaceTokenizer(d / "tokenizer.json")
    # BOS and the header markers are single special tokens; a raw prompt gets BOS prepended.
    assert tok.count(tiny_model.BOS + tiny_model.HEADER_START) == 2
    assert tok.count("the", add_special_tokens=True) == tok.count("the") + 1


def test_real_engine_manifest_validates_once_the_checkpoint_exists(
    generated: tuple[Path, dict[str, str]], manifest_data: dict[str, Any], tmp_path: Path
) -> None:
    d, _ = generated
    m = load_manifest(_loadable(manifest_data, d, tmp_path))
    from campaign.backends.local.engine import checkpoint_dir

    assert checkpoint_dir(m) == d
