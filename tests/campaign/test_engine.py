"""campaign.backends.local.engine without starting vLLM: what it refuses, and the command it would run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from campaign.backends.local import engine as engines
from campaign.cli.main import main
from core.manifest import load_manifest
from runtime import tiny_model
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    tiny_model.generate(d)
    return d


def _manifest(tmp_path: Path, checkpoint: Path, **model: Any) -> Path:
    data = yaml.safe_load((ROOT / "manifests" / "tiny-llama-real-engine.yaml").read_text())
    data["tokenizer"]["path"] = str(checkpoint / "tokenizer.json")
    data["workload"]["trace"]["path"] = str(ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv")
    data["model"].update(model)
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def test_a_checkpoint_with_other_weights_is_refused_naming_the_field(tmp_path: Path, checkpoint: Path) -> None:
    m = load_manifest(_manifest(tmp_path, checkpoint, weight_files={"model.safetensors": "0" * 64}))
    with pytest.raises(
        engines.EngineUnavailable, match=r"model\.weight_files\.model\.safetensors: sha256 .* does not match"
    ):
        engines.checkpoint_dir(m)


def test_a_tokenizer_without_its_checkpoint_is_refused(tmp_path: Path, checkpoint: Path) -> None:
    lone = tmp_path / "lone"
    lone.mkdir()
    for name in tiny_model.TOKENIZER_FILES:  # the pinned tokenizer files, without the model's
        (lone / name).write_bytes((checkpoint / name).read_bytes())
    p = _manifest(tmp_path, checkpoint)
    data = yaml.safe_load(p.read_text())
    data["tokenizer"]["path"] = str(lone / "tokenizer.json")
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(engines.EngineUnavailable, match=r"tokenizer\.path: no config\.json"):
        engines.checkpoint_dir(load_manifest(p))


def test_cli_without_the_engine_environment_exits_2_before_starting_anything(
    tmp_path: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(engines, "ENGINE_VENV", tmp_path / "no-venv")
    out = tmp_path / "out"
    assert main(["local", str(_manifest(tmp_path, checkpoint)), "--engine", "vllm-cpu", "--out", str(out)]) == 2
    assert "make engine" in capsys.readouterr().err
    assert not out.exists()


def test_the_engine_serves_the_manifest_model_name_with_the_fleet_limits(tmp_path: Path, checkpoint: Path) -> None:
    m = load_manifest(_manifest(tmp_path, checkpoint))
    argv = engines.vllm_argv(Path("/x/python"), m, "inf2", checkpoint, 1234)
    f = m.fleet("inf2")
    pairs = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert argv[:3] == ["/x/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert pairs["--served-model-name"] == m.model.repo and pairs["--model"] == str(checkpoint)
    assert (pairs["--host"], pairs["--port"]) == ("127.0.0.1", "1234")
    assert (pairs["--max-model-len"], pairs["--max-num-seqs"]) == (str(f.max_model_len), str(f.max_concurrency))
    env = engines.vllm_env(engines.EngineSettings(core=1))
    assert (
        env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    )
