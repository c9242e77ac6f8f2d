"""One pinned serving definition per stack: what a fleet instance runs, and how.

The CDK fleet construct renders `render_docker_run(definition_for(manifest, fleet))` plus
`weights_staging` into user data, and the observability stack scrapes `metrics_path` for
the names in `metric_names`. Everything comes from the frozen manifest (image digest, model
commit, TP degree, lengths, buckets), so two fleets differ only where the manifest says so.

Sources (checked while writing; re-check on every version bump):
- vLLM CLI (`vllm serve`): --revision, --tokenizer-revision, --tensor-parallel-size,
  --max-model-len, --max-num-seqs, --served-model-name, --download-dir, --seed, --dtype,
  --additional-config, --enable-prefix-caching / --no-enable-prefix-caching (V1 turns it on when
  neither is given, so every vLLM fleet passes one: the fleet's serving.prefix_caching).
  https://docs.vllm.ai/en/latest/cli/serve.html
- vLLM metrics (v1 engine, vllm/v1/metrics/loggers.py): vllm:time_to_first_token_seconds,
  vllm:inter_token_latency_seconds (replaces vllm:time_per_output_token_seconds, deprecated
  in 0.11), vllm:e2e_request_latency_seconds, vllm:request_queue_time_seconds,
  vllm:prompt_tokens_total, vllm:generation_tokens_total,
  vllm:request_success_total{finished_reason}, vllm:num_requests_running,
  vllm:num_requests_waiting, vllm:kv_cache_usage_perc (was vllm:gpu_cache_usage_perc),
  vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total (tokens).
  https://docs.vllm.ai/en/latest/design/metrics.html
- vLLM on Neuron, SDK 2.28.0 (aws-neuron/aws-neuron-sdk@86a9286833dc2a1cd23b674f7081061924aa587a, tag v2.28.0):
  libraries/nxd-inference/developer_guides/vllm-user-guide-v1.rst: Neuron options go through
  --additional-config '{"override_neuron_config": {...}}'. The KV layout follows prefix caching
  (Known Issues 2; core.catalog.PREFIX_CACHING_SOURCES quotes it):
  * off (--no-enable-prefix-caching): "With neither chunked prefill nor prefix caching: NxDI will
    internally use contiguous kv cache layout, and overwrite block_size to max_model_len. Set
    num_gpu_blocks_override to exactly max_num_seqs". No --block-size is passed: the plugin sets
    it (vllm-neuron platform.py), and vLLM's --block-size only takes 1..256 (vllm/config/cache.py
    BlockSize, a Literal that vllm/engine/arg_utils.py turns into argparse choices), so
    max_model_len there would be refused before the plugin runs.
  * on (--enable-prefix-caching): "With either chunked prefill or prefix caching: NxDI will
    internally use blockwise kv cache layout. Set num_gpu_blocks_override to at least
    ceil(max_model_len / block_size) * max_num_seqs"; Feature Configuration, Prefix Caching:
    override_neuron_config "is_prefix_caching": true, "is_block_kv_layout": true ("Both arguments
    need to be enabled"), "pa_block_size" 32 or 16 (32 here, as the guide's examples), and
    "num_gpu_blocks_override to the same value as pa_num_blocks". Chunked prefill: "not supported
    on Neuron" (Known Issues 1), so prefix caching alone picks the layout.
  containers/get-started/quickstart-configure-deploy-dlc.rst: image
  public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04,
  run with one --device=/dev/neuronN per chip plus `--cap-add SYS_ADMIN --cap-add IPC_LOCK`.
  Compiled NEFFs are saved to / loaded from NEURON_COMPILED_ARTIFACTS.
- TGI launcher: --model-id, --revision, --num-shard, --max-input-tokens, --max-total-tokens,
  --max-concurrent-requests, --max-batch-size, --port, --huggingface-hub-cache; metrics
  tgi_request_duration, tgi_request_queue_duration, tgi_request_mean_time_per_token_duration,
  tgi_request_input_length, tgi_request_generated_tokens, tgi_request_success,
  tgi_batch_current_size, tgi_queue_size; no time-to-first-token series.
  https://huggingface.co/docs/text-generation-inference/reference/launcher and
  .../reference/metrics
- trtllm-serve (PyTorch backend): --host, --port, --backend pytorch, --tp_size,
  --max_batch_size, --max_seq_len, --extra_llm_api_options YAML. Prometheus text only at
  /prometheus/metrics (/metrics is JSON), and only when the options YAML sets
  `return_perf_metrics: true` (request histograms) and `enable_iter_perf_stats: true`
  (iteration gauges such as trtllm_kv_cache_utilization).
  https://nvidia.github.io/TensorRT-LLM/commands/trtllm-serve/trtllm-serve.html,
  NVIDIA/TensorRT-LLM examples/serve/prometheus_metrics.py and tensorrt_llm/metrics/collector.py
  (MetricsCollector.log_metrics_dict: "Needs to include `return_perf_metrics: true` in LLM args").
- AMIs: no unpinned `latest` parameter. Each fleet's AMI is a deploy-time template parameter
  that `deploy` fills from campaign.aws.dlami (the host stack row of core.catalog.HOST_STACKS:
  DLAMI name + SDK-version description filter), and the boot script refuses to start the
  server when the host driver is not the manifest's serving.driver_version.
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from types import MappingProxyType

from core import catalog
from core.manifest import Fleet, Manifest

CACHE_MOUNT = "/opt/cache"  # the fleet's EBS cache volume, mounted by the launch template
SERVING_PORT = 8000

# What the vLLM-Neuron container needs beyond its devices (SDK 2.28 DLC quickstart, see above).
NEURON_CAPABILITIES = ("--cap-add", "SYS_ADMIN", "--cap-add", "IPC_LOCK")
TRTLLM_OPTIONS = {"return_perf_metrics": True, "enable_iter_perf_stats": True}

VLLM_METRICS: Mapping[str, str] = MappingProxyType(
    {
        "ttft": "vllm:time_to_first_token_seconds",
        "itl": "vllm:inter_token_latency_seconds",
        "e2e": "vllm:e2e_request_latency_seconds",
        "queue_time": "vllm:request_queue_time_seconds",
        "prompt_tokens": "vllm:prompt_tokens_total",
        "generation_tokens": "vllm:generation_tokens_total",
        "request_success": "vllm:request_success_total",
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
        "kv_cache_usage": "vllm:kv_cache_usage_perc",
        # Counters in prompt tokens (V1 engine, vllm/v1/metrics/loggers.py); hit rate = hits / queries.
        "prefix_cache_queries": "vllm:prefix_cache_queries_total",
        "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    }
)

# TGI has no TTFT or per-token histogram in Prometheus; TTFT comes from the load generator's
# records there, and `itl` maps to the closest series (mean time per token of each request).
TGI_METRICS: Mapping[str, str] = MappingProxyType(
    {
        "itl": "tgi_request_mean_time_per_token_duration",
        "e2e": "tgi_request_duration",
        "queue_time": "tgi_request_queue_duration",
        "prompt_tokens": "tgi_request_input_length",
        "generation_tokens": "tgi_request_generated_tokens",
        "request_success": "tgi_request_success",
        "running": "tgi_batch_current_size",
        "waiting": "tgi_queue_size",
    }
)

TRTLLM_METRICS: Mapping[str, str] = MappingProxyType(
    {
        "ttft": "trtllm_time_to_first_token_seconds",
        "itl": "trtllm_time_per_output_token_seconds",
        "e2e": "trtllm_e2e_request_latency_seconds",
        "queue_time": "trtllm_request_queue_time_seconds",
        "request_success": "trtllm_request_success_total",
        "kv_cache_usage": "trtllm_kv_cache_utilization",
    }
)


# Each stack's own series: the Prometheus scrape path and the analysis read these, never vLLM's
# names for every fleet.
METRICS_BY_STACK: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {"vllm-neuron": VLLM_METRICS, "vllm": VLLM_METRICS, "tgi": TGI_METRICS, "tensorrt-llm": TRTLLM_METRICS}
)


@dataclass(frozen=True)
class ServingDefinition:
    stack: str
    image: str
    command: tuple[str, ...]  # full argv; rendered with --entrypoint so image defaults never matter
    environment: Mapping[str, str]
    device_args: tuple[str, ...]  # docker run flags: --device=/dev/neuron0 ... or --gpus all
    port: int
    health_path: str
    metrics_path: str
    metric_names: Mapping[str, str]
    weights_dir: str
    cache_dir: str
    weights_staging: tuple[str, ...]
    host: catalog.HostStack  # driver / DLAMI the container needs (core.catalog.HOST_STACKS)
    # Files the boot script writes on the host before `docker run` (path -> content); they sit
    # under CACHE_MOUNT, which the container sees at the same path.
    config_files: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # What the server compiles once and every later instance may fetch instead (Neuron NEFFs):
    # a key naming everything that shapes the compiled graphs, and the local directory holding them.
    compiled: CompiledArtifacts | None = None


@dataclass(frozen=True)
class CompiledArtifacts:
    """A fleet's compiled artifacts, shared between its instances through the results bucket.

    NxD Inference's vLLM integration loads a compiled model from NEURON_COMPILED_ARTIFACTS when
    the directory holds one, and compiles and saves it there otherwise ("vLLM User Guide for NxD
    Inference", section "Loading pre-compiled models / Serialization Support",
    https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/developer_guides/vllm-user-guide.html;
    its example: a 15 GB model compiles in about 15 minutes). The key is a digest of the instance
    type, the image, the server's argv and environment (model commit, TP, buckets, lengths, KV
    layout, batch size): a different value of any of them is a different compiled model, never a
    stale one. The instance type is in it because a compiled model targets its chip (Inferentia2 or
    Trainium generation), which nothing in the argv names (it names the TP degree only).
    """

    key: str
    directory: str

    @staticmethod
    def for_server(
        instance_type: str, image: str, command: tuple[str, ...], environment: Mapping[str, str], root: str
    ) -> CompiledArtifacts:
        """Keyed by the server as it runs, before the cache's own paths (named by the key) are added."""
        body = json.dumps(
            {
                "instance_type": instance_type,
                "image": image,
                "command": list(command),
                "environment": dict(environment),
            },
            sort_keys=True,
        )
        key = hashlib.sha256(body.encode()).hexdigest()[:20]
        return CompiledArtifacts(key, f"{root}/{key}")


def weights_dir_for(manifest: Manifest) -> str:
    # Commit in the path: a new checkpoint revision never reuses stale weights or NEFFs.
    return f"{CACHE_MOUNT}/weights/{manifest.model.repo}/{manifest.model.commit}"


def served_model_id(manifest: Manifest, fleet: Fleet) -> str:
    """The model id a fleet's server lists at /v1/models, and so the one the readiness wait looks
    for and every request of the gate and the replays names:
    - vLLM (GPU and Neuron): its `--served-model-name`, which the fleets are started with
      (`_vllm_common`): model.repo;
    - trtllm-serve has no such option: it lists the model directory's name
      (NVIDIA/TensorRT-LLM@00057725 tensorrt_llm/serve/openai_server.py, OpenAIServer.__init__: `model_dir =
      Path(model)` ... `self.model = model_dir.name`; get_model answers `ModelCard(id=self.model)`),
      here the weights directory, named by the commit. Its openai_chat / openai_completion never
      compare the request's `model` with it (the field is required by ChatCompletionRequest,
      tensorrt_llm/serve/openai_protocol.py, but unchecked), and its own examples send the
      directory's name (examples/serve/openai_completion_client.py: model="TinyLlama-1.1B-Chat-v1.0");
    - TGI lists its `--model-id` as given, here the weights directory's path
      (huggingface/text-generation-inference: launcher/src/main.rs starts the router with
      `--tokenizer-name args.model_id`; router/src/server.rs names a local model by it,
      `HubModelInfo { model_id: tokenizer_name ... }`, and openai_get_model_info lists that id).
    """
    stack = fleet.serving.stack
    if stack in ("vllm", "vllm-neuron"):
        return manifest.model.repo
    if stack == "tensorrt-llm":
        return PurePosixPath(weights_dir_for(manifest)).name
    if stack == "tgi":
        return weights_dir_for(manifest)
    raise ValueError(f"unknown serving stack {stack!r}")


# The server reads these small files of the checkpoint besides the weights (model config,
# tokenizer, generation defaults), at the same pinned commit. Nothing else of the repository is
# fetched: the weights are exactly the files model.weight_files pins, so a repository that also
# carries another copy of them (Meta's original/consolidated.*.pth, 16 GB for an 8B model) or
# another format costs no download, disk or time to ready.
CHECKPOINT_METADATA = (
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
)


def checkpoint_files(manifest: Manifest) -> list[str]:
    """What a fleet fetches: the pinned weight and tokenizer files, then the metadata the server reads."""
    pinned = sorted(pinned_checkpoint_files(manifest))
    return pinned + [f for f in CHECKPOINT_METADATA if f not in pinned]


def pinned_checkpoint_files(manifest: Manifest) -> dict[str, str]:
    """Every checkpoint file the manifest pins, with its sha256: the weights and, for a huggingface
    tokenizer, its files, so the server tokenizes with the very bytes the load generators count with."""
    return {**manifest.model.weight_files, **manifest.tokenizer.files}


def _staging(manifest: Manifest, image: str, weights_dir: str, weights_s3_uri: str | None) -> tuple[str, ...]:
    """Shell lines that put the pinned checkpoint files (and only those) on the cache volume and verify their hashes."""
    return _fetch_and_check(
        manifest, image, weights_dir, weights_s3_uri, checkpoint_files(manifest), pinned_checkpoint_files(manifest)
    )


def tokenizer_staging(manifest: Manifest, image: str, weights_s3_uri: str | None) -> tuple[str, ...]:
    """A rehearsal fleet's staging (issue 51): the pinned tokenizer files alone, fetched from where
    and checked as a fleet fetches and checks its checkpoint (`_staging`), into the same weights
    directory; `image` runs the Hub download (it must ship huggingface_hub). None for the emulator's
    word tokenizer, which has no files."""
    files = manifest.tokenizer.files
    if not files:
        return ()
    return _fetch_and_check(manifest, image, weights_dir_for(manifest), weights_s3_uri, sorted(files), dict(files))


def _fetch_and_check(
    manifest: Manifest,
    image: str,
    weights_dir: str,
    weights_s3_uri: str | None,
    files: list[str],
    pinned: Mapping[str, str],
) -> tuple[str, ...]:
    """`files` of the checkpoint at model.commit onto `weights_dir`, from S3 or the Hub, then the
    sha256 of each of `pinned` checked."""
    m = manifest.model
    q = shlex.quote
    steps: list[str] = [f"mkdir -p {q(weights_dir)}"]
    if weights_s3_uri:
        includes = " ".join(f"--include {q(f)}" for f in files)
        # The campaign's region, as every other aws line at boot names one (an instance has no
        # default); a bucket in another region answers with a redirect the CLI follows
        # (botocore's S3 region redirector, aws/aws-cli#2149).
        steps.append(
            f"aws s3 sync --region {q(manifest.costs.region)} {q(weights_s3_uri.rstrip('/') + '/' + m.commit + '/')} "
            f"{q(weights_dir)} --only-show-errors --exclude '*' {includes}"
        )
    else:
        if m.hub_token_secret_arn:
            # Token read at boot into the environment, never written into the template.
            # The ARN names the secret's region; the instance's default region may differ. Assigned
            # before the export: `export X="$(cmd)"` would hide a failed read from `set -e` (SC2155).
            steps.append(
                f'HF_TOKEN="$(aws secretsmanager get-secret-value --region {q(m.hub_token_secret_arn.split(":")[3])} '
                f'--secret-id {q(m.hub_token_secret_arn)} --query SecretString --output text)"'
            )
            steps.append("export HF_TOKEN")
        # allow_patterns are fnmatch patterns; a plain file name matches that path only.
        py = (
            "from huggingface_hub import snapshot_download; "
            f"snapshot_download(repo_id={json.dumps(m.repo)}, revision={json.dumps(m.commit)}, local_dir={json.dumps(weights_dir)}, "
            f"allow_patterns={json.dumps(files)})"
        )
        token_env = " -e HF_TOKEN" if m.hub_token_secret_arn else ""
        # The serving image already ships huggingface_hub; the host DLAMI may not.
        steps.append(
            f"docker run --rm --entrypoint python3 -v {CACHE_MOUNT}:{CACHE_MOUNT}{token_env} {q(image)} -c {q(py)}"
        )
    checks = "\\n".join(f"{digest}  {name}" for name, digest in sorted(pinned.items()))
    steps.append(f"(cd {q(weights_dir)} && printf '{checks}\\n' | sha256sum --check --strict -)")
    if m.hub_token_secret_arn and not weights_s3_uri:
        steps.append("unset HF_TOKEN")
    return tuple(steps)


def _vllm_common(manifest: Manifest, fleet: Fleet, weights_dir: str) -> list[str]:
    return [
        "vllm",
        "serve",
        weights_dir,
        "--served-model-name",
        served_model_id(manifest, fleet),
        "--revision",
        manifest.model.commit,
        "--tokenizer-revision",
        manifest.model.commit,
        "--tensor-parallel-size",
        str(fleet.tensor_parallel),
        "--max-model-len",
        str(fleet.max_model_len),
        "--max-num-seqs",
        str(fleet.max_concurrency),
        "--dtype",
        "bfloat16" if manifest.precision.activations == "bf16" else "float16",
        "--seed",
        str(manifest.generation.seed),
        # Explicit either way: vLLM V1 turns prefix caching on when neither flag is given, and on
        # Neuron the setting picks the KV layout (SDK 2.28 vLLM user guide, Known Issues 2).
        "--enable-prefix-caching" if fleet.serving.resolved_prefix_caching else "--no-enable-prefix-caching",
        "--host",
        "0.0.0.0",
        "--port",
        str(SERVING_PORT),
    ]


@dataclass(frozen=True)
class NeuronKvLayout:
    """The KV cache vLLM on Neuron is started with (SDK 2.28 vLLM user guide, Known Issues 2)."""

    block_tokens: int | None  # None: contiguous, one max_model_len block per sequence slot
    num_blocks: int  # --num-gpu-blocks-override (and pa_num_blocks in the block layout)

    @property
    def name(self) -> str:
        return "contiguous" if self.block_tokens is None else "block"


def neuron_kv_layout(fleet: Fleet) -> NeuronKvLayout:
    """Contiguous without prefix caching (exactly max_num_seqs blocks); with it, the block layout
    of catalog.NEURON_PREFIX_BLOCK_TOKENS-token blocks, ceil(max_model_len / block) per sequence."""
    if not fleet.serving.resolved_prefix_caching:
        return NeuronKvLayout(None, fleet.max_concurrency)
    block = catalog.NEURON_PREFIX_BLOCK_TOKENS
    return NeuronKvLayout(block, math.ceil(fleet.max_model_len / block) * fleet.max_concurrency)


def _neuron_devices(fleet: Fleet) -> tuple[str, ...]:
    it = catalog.instance(fleet.instance_type)
    chips = math.ceil(fleet.tensor_parallel / it.accelerator.shards_per_device)
    return tuple(f"--device=/dev/neuron{i}" for i in range(chips))


def host_stack_for(fleet: Fleet) -> catalog.HostStack:
    vendor = catalog.instance(fleet.instance_type).accelerator.vendor
    row = catalog.HOST_STACKS.get((vendor, fleet.serving.sdk_version))
    if row is None:  # `validate` refuses this manifest first; this guards direct callers
        raise ValueError(f"no host stack for {vendor} SDK {fleet.serving.sdk_version!r} in core.catalog.HOST_STACKS")
    return row


GPU_DEVICE_ARGS = ("--gpus", "all")  # docker run: every NVIDIA GPU of the instance


@dataclass(frozen=True)
class _Container:
    """What a fleet's container has whatever its stack: image, weights, cache, staging, host."""

    stack: str
    image: str  # the reference the host pulls (a registry cache's, or the manifest's)
    weights_dir: str
    cache_dir: str  # the stack's own cache under CACHE_MOUNT (Neuron: replaced by the compiled key's)
    staging: tuple[str, ...]
    host: catalog.HostStack
    extra_args: tuple[str, ...]  # the fleet's serving.extra_args, after our flags

    def definition(
        self,
        command: Sequence[str],
        env: dict[str, str],
        device_args: tuple[str, ...],
        metrics_path: str,
        *,
        cache_dir: str | None = None,
        config_files: Mapping[str, str] | None = None,
        compiled: CompiledArtifacts | None = None,
    ) -> ServingDefinition:
        return ServingDefinition(
            self.stack,
            self.image,
            (*command, *self.extra_args),
            MappingProxyType(env),
            device_args,
            SERVING_PORT,
            "/health",
            metrics_path,
            METRICS_BY_STACK[self.stack],
            self.weights_dir,
            cache_dir or self.cache_dir,
            self.staging,
            self.host,
            MappingProxyType(dict(config_files or {})),
            compiled,
        )


def _container(manifest: Manifest, fleet: Fleet, weights_s3_uri: str | None, pull_image: str | None) -> _Container:
    stack = fleet.serving.stack
    host = host_stack_for(fleet)
    image = pull_image or fleet.serving.image
    wdir = weights_dir_for(manifest)
    cache = f"{CACHE_MOUNT}/compile/{stack}/{manifest.model.commit}/{fleet.instance_type}-tp{fleet.tensor_parallel}"
    staging = _staging(manifest, image, wdir, weights_s3_uri)
    return _Container(stack, image, wdir, cache, staging, host, tuple(fleet.serving.extra_args))


def definition_for(
    manifest: Manifest, fleet: Fleet, *, weights_s3_uri: str | None = None, pull_image: str | None = None
) -> ServingDefinition:
    """The serving container for `fleet`; `weights_s3_uri` stages from S3 instead of the Hub;
    `pull_image`: the reference a host pulls and runs `fleet.serving.image` by (the same image
    through a registry cache, core.images). The compiled key stays the manifest's image."""
    container = _container(manifest, fleet, weights_s3_uri, pull_image)
    build = _DEFINITION_BY_STACK.get(container.stack)
    if build is None:
        raise ValueError(f"unknown serving stack {container.stack!r}")
    return build(manifest, fleet, container)


def _neuron_kv_settings(fleet: Fleet) -> tuple[list[str], dict[str, object]]:
    """The KV flags for `vllm serve` and the override_neuron_config entries of the fleet's layout."""
    layout = neuron_kv_layout(fleet)
    if layout.block_tokens is None:
        # Contiguous (SDK 2.28 vLLM user guide, Known Issues 2): NxDI overwrites block_size
        # with max_model_len; num_gpu_blocks_override exactly max_num_seqs.
        return ["--num-gpu-blocks-override", str(layout.num_blocks)], {}
    # Block layout (same guide, Known Issues 2 and Feature Configuration / Prefix Caching):
    # is_prefix_caching + is_block_kv_layout, pa_block_size 32, and pa_num_blocks equal to
    # num_gpu_blocks_override, at least ceil(max_model_len / block_size) * max_num_seqs.
    flags = ["--block-size", str(layout.block_tokens), "--num-gpu-blocks-override", str(layout.num_blocks)]
    override: dict[str, object] = {
        "is_prefix_caching": True,
        "is_block_kv_layout": True,
        "pa_block_size": layout.block_tokens,
        "pa_num_blocks": layout.num_blocks,
    }
    return flags, override


def _vllm_neuron_definition(manifest: Manifest, fleet: Fleet, c: _Container) -> ServingDefinition:
    buckets = list(fleet.sequence_buckets)
    kv_flags, kv_override = _neuron_kv_settings(fleet)
    override: dict[str, object] = {
        "enable_bucketing": True,
        "context_encoding_buckets": buckets,
        "token_generation_buckets": buckets,
        # Pre-sharded weights (NxD Inference Weights Sharding Guide, "Shard on compile (Pre-shard)").
        # At compile, aws-neuron/neuronx-distributed-inference@4bcdc54
        # src/neuronx_distributed_inference/models/application_base.py NeuronApplicationBase.shard_weights
        # writes each rank's weights to <compiled dir>/weights/tp<rank>_sharded_checkpoint.safetensors
        # (ModelBuilder.shard_checkpoint(serialize_path=...)), inside NEURON_COMPILED_ARTIFACTS, so the
        # compiled set published and fetched whole carries them. At load, vllm-project/vllm-neuron@a5ef7c8
        # vllm_neuron/worker/neuronx_distributed_model_loader.py _load_compiled_model builds the model
        # from the compiled directory (its saved config: this option included) and calls model.load;
        # NeuronApplicationBase.load_weights then reads those files (safetensors load_file, one per
        # local rank) instead of ModelBuilder.shard_checkpoint, which loads the whole checkpoint and
        # then builds every rank's shard from it (aws-neuron/neuronx-distributed Release 2.29,
        # src/neuronx_distributed/trace/model_builder.py). Host memory at load: about the weights
        # once (weights / TP per rank, every local rank's shard held until nxd_model.initialize)
        # instead of about twice; for Llama 3 8B bf16 at TP 2, about 7.5 GiB a rank and 15 GiB for
        # both, still close to inf2.xlarge's 16 GiB: pre-sharding halves the peak, it does not make
        # the fit certain (docs/cloud.md, the compile phase).
        "save_sharded_checkpoint": True,
        **kv_override,
    }
    command = [
        *_vllm_common(manifest, fleet, c.weights_dir),
        *kv_flags,
        "--additional-config",
        json.dumps({"override_neuron_config": override}, separators=(",", ":")),
    ]
    env = {
        "NEURON_RT_NUM_CORES": str(fleet.tensor_parallel),
        "VLLM_NEURON_FRAMEWORK": "neuronx-distributed-inference",
    }
    # A loaded compiled model ignores differing settings (the guide cited at CompiledArtifacts), so
    # the directory is named by everything that shapes it: changed buckets compile anew.
    compiled = CompiledArtifacts.for_server(
        fleet.instance_type, fleet.serving.image, (*command, *c.extra_args), env, f"{CACHE_MOUNT}/compile"
    )
    cache = compiled.directory
    # compiled once, then loaded: from EBS, or fetched from S3 (vllm-project/vllm-neuron
    # vllm_neuron/worker/neuronx_distributed_model_loader.py reads NEURON_COMPILED_ARTIFACTS).
    # No NEURON_CC_FLAGS="--cache_dir=...": NxD's ModelBuilder compiles through libneuronxla's
    # neuron_xla_compile with cache_dir=None (aws-neuron/neuronx-distributed, Release 2.29,
    # src/neuronx_distributed/trace/model_builder.py, submit_compilation_job_with_cache), and how
    # libneuronxla resolves None is in no public source (optimum-neuron's cache_utils reads the flag
    # as the compiler's cache location, default /var/tmp/neuron-compile-cache). Unread, the flag was
    # dead weight in the serving definition's digest; read, it put the compiler's own cache inside
    # this directory, which is published and fetched whole. NEURON_COMPILED_ARTIFACTS alone is what
    # the loader reuses.
    env |= {"NEURON_COMPILED_ARTIFACTS": cache}
    devices = (*_neuron_devices(fleet), *NEURON_CAPABILITIES)
    return c.definition(command, env, devices, "/metrics", cache_dir=cache, compiled=compiled)


def _vllm_definition(manifest: Manifest, fleet: Fleet, c: _Container) -> ServingDefinition:
    env = {"VLLM_CACHE_ROOT": c.cache_dir, "HF_HUB_OFFLINE": "1"}
    return c.definition(_vllm_common(manifest, fleet, c.weights_dir), env, GPU_DEVICE_ARGS, "/metrics")


def _tgi_definition(manifest: Manifest, fleet: Fleet, c: _Container) -> ServingDefinition:
    command = [
        "text-generation-launcher",
        "--model-id",
        c.weights_dir,
        "--revision",
        manifest.model.commit,
        "--num-shard",
        str(fleet.tensor_parallel),
        "--max-input-tokens",
        str(manifest.workload.request_class.max_input_tokens),
        "--max-total-tokens",
        str(fleet.max_model_len),
        "--max-batch-size",
        str(fleet.max_concurrency),
        "--max-concurrent-requests",
        str(max(128, 8 * fleet.max_concurrency)),
        "--dtype",
        "bfloat16" if manifest.precision.activations == "bf16" else "float16",
        "--huggingface-hub-cache",
        c.cache_dir,
        "--hostname",
        "0.0.0.0",
        "--port",
        str(SERVING_PORT),
    ]
    return c.definition(command, {"HF_HUB_OFFLINE": "1"}, GPU_DEVICE_ARGS, "/metrics")


def _tensorrt_llm_definition(manifest: Manifest, fleet: Fleet, c: _Container) -> ServingDefinition:
    options_path = f"{c.cache_dir}/trtllm-options.yaml"
    command = [
        "trtllm-serve",
        c.weights_dir,
        "--backend",
        "pytorch",
        "--tp_size",
        str(fleet.tensor_parallel),
        "--max_batch_size",
        str(fleet.max_concurrency),
        "--max_seq_len",
        str(fleet.max_model_len),
        "--extra_llm_api_options",
        options_path,
        "--host",
        "0.0.0.0",
        "--port",
        str(SERVING_PORT),
    ]
    env = {"HF_HUB_OFFLINE": "1", "TRTLLM_CACHE_DIR": c.cache_dir}
    # YAML is a superset of JSON: one dependency-free rendering of the options file.
    options = {options_path: json.dumps(TRTLLM_OPTIONS, sort_keys=True) + "\n"}
    return c.definition(command, env, GPU_DEVICE_ARGS, "/prometheus/metrics", config_files=options)


_DEFINITION_BY_STACK: dict[str, Callable[[Manifest, Fleet, _Container], ServingDefinition]] = {
    "vllm-neuron": _vllm_neuron_definition,
    "vllm": _vllm_definition,
    "tgi": _tgi_definition,
    "tensorrt-llm": _tensorrt_llm_definition,
}


def render_docker_run(defn: ServingDefinition, name: str = "llm") -> str:
    """One shell line for user data: detached, restart on failure, cache volume mounted."""
    q = shlex.quote
    parts = [
        "docker",
        "run",
        "-d",
        "--name",
        q(name),
        "--restart",
        "unless-stopped",
        "--shm-size",
        "16g",
        "--ipc",
        "host",
        "-p",
        f"{defn.port}:{defn.port}",
        "-v",
        f"{CACHE_MOUNT}:{CACHE_MOUNT}",
        *defn.device_args,
    ]
    for key, value in sorted(defn.environment.items()):
        parts += ["-e", q(f"{key}={value}")]
    parts += ["--entrypoint", q(defn.command[0]), q(defn.image), *(q(a) for a in defn.command[1:])]
    return " ".join(parts)


def definition_digest(defn: ServingDefinition) -> str:
    """sha256 of everything a fleet instance is booted with to serve: the image, the server's argv
    and environment, devices, ports and paths, the weight staging lines, the config files, the host
    stack and the compiled-artifacts key. The fleet's boot script is keyed by this, not by the
    manifest's digest: an edit that changes none of it (an SLO, `loadgen.workers`) leaves every
    launch template as it is, so a redeploy replaces no instance (stacks/fleet.py)."""
    body = {
        "stack": defn.stack,
        "image": defn.image,
        "command": list(defn.command),
        "environment": dict(defn.environment),
        "device_args": list(defn.device_args),
        "port": defn.port,
        "health_path": defn.health_path,
        "metrics_path": defn.metrics_path,
        "weights_dir": defn.weights_dir,
        "cache_dir": defn.cache_dir,
        "weights_staging": list(defn.weights_staging),
        "host": [defn.host.vendor, defn.host.sdk_version, defn.host.driver, defn.host.ami_name_filter],
        "config_files": dict(defn.config_files),
        "compiled_key": defn.compiled.key if defn.compiled is not None else None,
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
