from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from core.manifest import Fleet, Manifest, load_manifest
from core.serving import (
    TRTLLM_METRICS,
    VLLM_METRICS,
    checkpoint_files,
    definition_for,
    render_docker_run,
    served_model_id,
)


@pytest.fixture(scope="module")
def manifest(example_manifest_path: Path) -> Manifest:
    return load_manifest(example_manifest_path, check_files=False)


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _argv(line: str) -> list[str]:
    return shlex.split(line)


def test_inf2_vllm_neuron_command_follows_manifest(manifest: Manifest) -> None:
    fleet = manifest.fleet("inf2")
    defn = definition_for(manifest, fleet)
    argv = _argv(render_docker_run(defn))
    assert argv[:3] == ["docker", "run", "-d"]
    assert fleet.serving.image in argv and "@sha256:" in fleet.serving.image
    assert _flag(argv, "--entrypoint") == "vllm"
    assert _flag(argv, "--tensor-parallel-size") == str(fleet.tensor_parallel) == "2"
    assert _flag(argv, "--max-model-len") == str(fleet.max_model_len)
    assert _flag(argv, "--max-num-seqs") == str(fleet.max_concurrency)
    assert _flag(argv, "--revision") == manifest.model.commit
    assert _flag(argv, "--served-model-name") == manifest.model.repo
    cfg = json.loads(_flag(argv, "--additional-config"))["override_neuron_config"]
    assert cfg["context_encoding_buckets"] == list(fleet.sequence_buckets)
    assert cfg["token_generation_buckets"] == list(fleet.sequence_buckets)
    # inf2.xlarge: TP2 spans both NeuronCores of its one chip.
    assert [a for a in argv if a.startswith("--device=")] == ["--device=/dev/neuron0"]
    assert "--gpus" not in argv
    # Named by the compile key, a digest of the argv above (the commit's --revision included).
    assert defn.compiled is not None and defn.cache_dir == f"/opt/cache/compile/{defn.compiled.key}"
    assert f"NEURON_COMPILED_ARTIFACTS={defn.cache_dir}" in argv
    assert (defn.host.vendor, defn.host.sdk_version, defn.host.driver) == ("aws-neuron", "2.28.0", "2.26.5.0")
    # SDK 2.28 vLLM user guide v1, Known Issues 2: contiguous KV layout -> exactly max_num_seqs blocks,
    # and only without prefix caching (vLLM V1 turns it on unless told not to).
    assert fleet.serving.prefix_caching is False
    assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
    assert _flag(argv, "--num-gpu-blocks-override") == str(fleet.max_concurrency)
    assert "--block-size" not in argv  # the plugin sets max_model_len itself; vLLM's CLI takes 1..256 only
    assert not {"is_prefix_caching", "is_block_kv_layout", "pa_block_size", "pa_num_blocks"} & set(cfg)
    # SDK 2.28 DLC quickstart: both capabilities, next to the devices.
    assert argv[argv.index("--cap-add") + 1] == "SYS_ADMIN" and argv[argv.index("IPC_LOCK") - 1] == "--cap-add"
    assert defn.metric_names["ttft"] == "vllm:time_to_first_token_seconds"


def test_neuron_devices_scale_with_tp(manifest: Manifest) -> None:
    fleet = manifest.fleet("inf2").model_copy(update={"instance_type": "inf2.48xlarge", "tensor_parallel": 8})
    defn = definition_for(manifest, fleet)
    assert defn.device_args[:4] == tuple(f"--device=/dev/neuron{i}" for i in range(4))
    assert defn.device_args[4:] == ("--cap-add", "SYS_ADMIN", "--cap-add", "IPC_LOCK")
    assert "--tensor-parallel-size 8" in " ".join(defn.command)


def test_g6_vllm_command_follows_manifest(manifest: Manifest) -> None:
    fleet = manifest.fleet("g6")
    defn = definition_for(manifest, fleet)
    argv = _argv(render_docker_run(defn))
    assert argv[argv.index("--gpus") + 1] == "all"
    assert not any(a.startswith("--device=/dev/neuron") for a in argv)
    assert fleet.serving.image in argv
    assert _flag(argv, "--tensor-parallel-size") == "1"
    assert _flag(argv, "--max-model-len") == "2560"
    assert _flag(argv, "--max-num-seqs") == "16"
    assert "--additional-config" not in argv
    assert defn.host.vendor == "nvidia" and "--cap-add" not in argv
    assert dict(defn.metric_names) == dict(VLLM_METRICS)
    assert set(defn.metric_names) == {
        "ttft",
        "itl",
        "e2e",
        "queue_time",
        "prompt_tokens",
        "generation_tokens",
        "request_success",
        "running",
        "waiting",
        "kv_cache_usage",
        "prefix_cache_queries",
        "prefix_cache_hits",
    }


@pytest.mark.parametrize("stack", ["vllm", "tgi", "tensorrt-llm"])
def test_the_served_model_id_is_the_one_the_stacks_command_line_makes_it_list(manifest: Manifest, stack: str) -> None:
    """vLLM lists --served-model-name; trtllm-serve the model directory's name (openai_server.py
    `self.model = model_dir.name`); TGI its --model-id as given (core.serving.served_model_id)."""
    g6 = manifest.fleet("g6")
    fleet = g6.model_copy(update={"serving": g6.serving.model_copy(update={"stack": stack})})
    argv = list(definition_for(manifest, fleet).command)
    listed = {
        "vllm": lambda: _flag(argv, "--served-model-name"),
        "tensorrt-llm": lambda: Path(argv[1]).name,  # `trtllm-serve <model dir> ...`
        "tgi": lambda: _flag(argv, "--model-id"),
    }[stack]()
    assert served_model_id(manifest, fleet) == listed
    assert (listed == manifest.model.repo) == (stack == "vllm")
    assert served_model_id(manifest, manifest.fleet("inf2")) == manifest.model.repo  # vLLM on Neuron


@pytest.mark.parametrize("stack", ["tgi", "tensorrt-llm"])
def test_other_gpu_stacks(manifest: Manifest, stack: str) -> None:
    g6 = manifest.fleet("g6")
    fleet = g6.model_copy(update={"serving": g6.serving.model_copy(update={"stack": stack})})
    defn = definition_for(manifest, fleet)
    argv = _argv(render_docker_run(defn))
    if stack == "tgi":
        assert _flag(argv, "--entrypoint") == "text-generation-launcher"
        assert _flag(argv, "--num-shard") == "1"
        assert _flag(argv, "--max-total-tokens") == "2560"
        assert _flag(argv, "--max-batch-size") == "16"
        assert _flag(argv, "--revision") == manifest.model.commit
        assert defn.metric_names["e2e"] == "tgi_request_duration"
        assert "ttft" not in defn.metric_names  # TGI exports no time-to-first-token series
    else:
        assert _flag(argv, "--entrypoint") == "trtllm-serve"
        assert _flag(argv, "--tp_size") == "1"
        assert _flag(argv, "--max_seq_len") == "2560"
        assert _flag(argv, "--max_batch_size") == "16"
        # Prometheus text only at /prometheus/metrics, and only with return_perf_metrics in the options YAML.
        options = _flag(argv, "--extra_llm_api_options")
        assert json.loads(defn.config_files[options]) == {"return_perf_metrics": True, "enable_iter_perf_stats": True}
        assert options.startswith(defn.cache_dir) and defn.metrics_path == "/prometheus/metrics"
        assert dict(defn.metric_names) == dict(TRTLLM_METRICS)
    assert "--gpus" in argv


def test_staging_pins_commit_and_verifies_hashes(manifest: Manifest) -> None:
    defn = definition_for(manifest, manifest.fleet("g6"))
    script = "\n".join(defn.weights_staging)
    assert f'revision="{manifest.model.commit}"' in script
    assert defn.weights_dir.endswith(manifest.model.commit) and defn.weights_dir.startswith("/opt/cache/")
    for name, digest in manifest.model.weight_files.items():
        assert f"{digest}  {name}" in script
    assert "sha256sum --check" in script
    assert "secretsmanager" not in script  # no secret named in this manifest

    s3 = definition_for(manifest, manifest.fleet("g6"), weights_s3_uri="s3://bucket/llama/")
    assert f"s3://bucket/llama/{manifest.model.commit}/" in s3.weights_staging[1]


def test_hub_token_comes_from_secrets_manager_never_inline(manifest: Manifest) -> None:
    arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:hf-token-AbCdEf"
    gated = manifest.model_copy(update={"model": manifest.model.model_copy(update={"hub_token_secret_arn": arn})})
    defn = definition_for(gated, gated.fleet("g6"))
    script = "\n".join(defn.weights_staging)
    assert f"--region us-east-1 --secret-id {arn}" in script
    assert " -e HF_TOKEN " in script  # passed by name from the environment
    assert "HF_TOKEN=hf_" not in script and "HF_TOKEN" not in render_docker_run(defn)


def _with_prefix_caching(manifest: Manifest, name: str, on: bool) -> Fleet:
    f = manifest.fleet(name)
    return f.model_copy(update={"serving": f.serving.model_copy(update={"prefix_caching": on})})


def test_inf2_with_prefix_caching_gets_the_guides_block_layout(manifest: Manifest) -> None:
    fleet = _with_prefix_caching(manifest, "inf2", True)
    argv = _argv(render_docker_run(definition_for(manifest, fleet)))
    assert "--enable-prefix-caching" in argv and "--no-enable-prefix-caching" not in argv
    # SDK 2.28 vLLM user guide, Feature Configuration (Prefix Caching) and Known Issues 2: both
    # overrides on, pa_block_size 32, pa_num_blocks = num_gpu_blocks_override >= ceil(len / block) x seqs.
    blocks = -(-fleet.max_model_len // 32) * fleet.max_concurrency
    assert _flag(argv, "--block-size") == "32"
    assert _flag(argv, "--num-gpu-blocks-override") == str(blocks) == "1280"
    cfg = json.loads(_flag(argv, "--additional-config"))["override_neuron_config"]
    assert cfg["is_prefix_caching"] is True and cfg["is_block_kv_layout"] is True
    assert (cfg["pa_block_size"], cfg["pa_num_blocks"]) == (32, blocks)
    assert cfg["context_encoding_buckets"] == list(fleet.sequence_buckets)


@pytest.mark.parametrize("on", [True, False])
def test_gpu_vllm_passes_prefix_caching_explicitly(manifest: Manifest, on: bool) -> None:
    argv = _argv(render_docker_run(definition_for(manifest, _with_prefix_caching(manifest, "g6", on))))
    flags = [a for a in argv if a.endswith("enable-prefix-caching")]
    assert flags == ["--enable-prefix-caching" if on else "--no-enable-prefix-caching"]
    assert "--block-size" not in argv and "--num-gpu-blocks-override" not in argv


def test_a_fleet_fetches_and_checks_the_pinned_tokenizer_files(example_manifest_path: Path) -> None:
    """The server tokenizes with the bytes the load generators count with: a huggingface tokenizer's
    pinned files (chat_template.jinja included, which the metadata list lacks) are fetched at
    model.commit and sha256-checked with the weights."""
    tiny = load_manifest(example_manifest_path.parent / "tiny-llama-real-engine.yaml", check_files=False)
    assert "chat_template.jinja" in tiny.tokenizer.files
    assert set(tiny.tokenizer.files) | set(tiny.model.weight_files) <= set(checkpoint_files(tiny))
    for s3 in (None, "s3://bucket/tiny/"):
        script = "\n".join(definition_for(tiny, tiny.fleet("g6"), weights_s3_uri=s3).weights_staging)
        for name, digest in {**tiny.model.weight_files, **tiny.tokenizer.files}.items():
            assert f"{digest}  {name}" in script
        assert "--include chat_template.jinja" in script if s3 else '"chat_template.jinja"' in script


def test_the_neuron_server_sets_no_compiler_cache_dir(manifest: Manifest) -> None:
    """Issue 50, item 5: NEURON_CC_FLAGS=--cache_dir=<compiled dir>/neuronx-cc was in the server's
    environment (not in the compiled key, computed before it), and NxD's ModelBuilder passes
    cache_dir=None to libneuronxla (core/serving.py cites where): either unread,
    or the compiler's cache inside the published set. NEURON_COMPILED_ARTIFACTS stays."""
    defn = definition_for(manifest, manifest.fleet("inf2"))
    assert defn.compiled is not None
    flags = {k: v for k, v in defn.environment.items() if k.startswith("NEURON_CC")}
    assert flags == {}
    assert defn.environment["NEURON_COMPILED_ARTIFACTS"] == defn.compiled.directory
    assert "--cache_dir" not in render_docker_run(defn)


def test_the_neuron_server_compiles_pre_sharded_weights(manifest: Manifest) -> None:
    """Issue 50, item 1: without save_sharded_checkpoint every inf2.xlarge instance shards the full
    checkpoint at load (about twice the weights in host memory); with it, NxD Inference writes each
    rank's weights into the compiled directory at compile and loads them from there."""
    defn = definition_for(manifest, manifest.fleet("inf2"))
    cfg = json.loads(_flag(_argv(render_docker_run(defn)), "--additional-config"))["override_neuron_config"]
    assert cfg.get("save_sharded_checkpoint") is True
