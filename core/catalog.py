"""Instance and accelerator facts, each with the source it came from.

The fit check, the roofline plan and the emulator calibration all read these numbers,
so a wrong figure here moves every downstream result: keep the source next to it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from core.errors import CampaignError
from core.shipped import shipped_path

GIB = 1024**3
# Root EBS volume of every fleet instance: the stacks deploy it and the cost model bills it (one
# figure for both). DLAMI root + container images (the vLLM images are 10-20 GB each).
ROOT_VOLUME_GIB = 150
GB = 10**9


@dataclass(frozen=True)
class Accelerator:
    """One accelerator device as the serving runtime shards over it.

    `shard_*` describe the unit a tensor-parallel rank is placed on: a GPU, or a
    NeuronCore-v2 on Inferentia2 (two per chip, each owning half the chip's HBM and bandwidth).
    """

    name: str
    vendor: str  # "aws-neuron" or "nvidia"
    board_memory_gb: float  # per device, as marketed (GB = 1e9 bytes)
    shard_visible_gib: float  # what the runtime can allocate on one shard
    shard_bandwidth_gbs: float  # GB/s per shard
    shard_bf16_tflops: float  # dense BF16 per shard
    shards_per_device: int
    tdp_watts: float | None
    sources: tuple[str, ...]


INFERENTIA2 = Accelerator(
    name="Inferentia2",
    vendor="aws-neuron",
    # The Neuron architecture page states binary units: 32 GiB HBM and 820 GiB/s per chip
    # (earlier doc versions, e.g. v2.9.1, wrote "32GB" and "820 GB/sec").
    board_memory_gb=32 * GIB / GB,
    # Split over 2 NeuronCores-v2: 16 GiB and 410 GiB/s each.
    shard_visible_gib=32.0 / 2,
    shard_bandwidth_gbs=820 * GIB / GB / 2,
    # 190 TFLOPS FP16/BF16 per chip (inf2.48xlarge: 12 chips, 2.3 PFLOPS).
    shard_bf16_tflops=190.0 / 2,
    shards_per_device=2,
    tdp_watts=None,
    sources=(
        "AWS Neuron docs, Inferentia2 architecture: 'Two NeuronCore-v2 cores, delivering ... 190 FP16/BF16/cFP8/TF32 TFLOPS', "
        "'32GiB of high-bandwidth device memory (HBM) ... with 820 GiB/sec of bandwidth' per chip: "
        "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/inferentia2.html "
        "(same figures at en/v1.12.0; en/v2.9.1 wrote '32GB' and '820 GB/sec'; retrieved 2026-12-04)",
        "AWS EC2 Inf2 product page: up to 2.3 PFLOPS FP16/BF16 on inf2.48xlarge (12 chips)",
    ),
)

NVIDIA_L4 = Accelerator(
    name="NVIDIA L4",
    vendor="nvidia",
    board_memory_gb=24.0,
    # nvidia-smi on g6.xlarge reports ~22.5 GiB usable; the seed pins 22 GiB.
    shard_visible_gib=22.0,
    shard_bandwidth_gbs=300.0,
    shard_bf16_tflops=121.0,  # dense; the datasheet's 242 is with 2:4 sparsity
    shards_per_device=1,
    tdp_watts=72.0,
    sources=(
        "NVIDIA L4 datasheet and product page https://www.nvidia.com/en-us/data-center/l4/: 24 GB GDDR6, 300 GB/s, 72 W, "
        "FP16/BF16 Tensor Core 242 TFLOPS 'with sparsity', so 121 dense (the page itself was not in the stored corpus on "
        "2026-12-04; the same figures: https://grokipedia.com/page/NVIDIA_L4_vs_L40S '242 TFLOPS in FP16 Tensor Core "
        "operations (with sparsity)', '24 GB GDDR6 memory at 300 GB/s'; https://hmc-tech.com/gpu/nvidia-l4-vs-nvidia-l40 "
        "BF16 125.34 TFLOPS Tensor dense at the 2,040 MHz boost clock; both retrieved 2026-12-04)",
        "the 72 W power cap: sustained tensor throughput may sit well below the boost-clock peak; no published L4 "
        "measurement of Llama-3-8B serving was found to check the fraction carried over from the A10G rows",
        "seed: L4 on g6.xlarge shows 22 GiB visible, not 24 GB",
    ),
)

NVIDIA_A10G = Accelerator(
    name="NVIDIA A10G",
    vendor="nvidia",
    board_memory_gb=24.0,
    shard_visible_gib=22.0,
    shard_bandwidth_gbs=600.0,
    # NVIDIA publishes no A10G datasheet and AWS no tensor figure for it; 70 TFLOPS dense FP16/BF16
    # is the figure quoted for the AWS variant (the A10's datasheet says 125). The published A10G
    # rows bound it from below: vLLM's 137 ms to the first token for ~480 prompt tokens at one
    # user needs >= 57 TFLOPS delivered, so the fit's compute fraction sits at its upper bound.
    shard_bf16_tflops=70.0,
    shards_per_device=1,
    tdp_watts=300.0,
    sources=(
        "AWS EC2 G5 product page: A10G, 24 GB GDDR6 per GPU",
        "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/ (retrieved 2026-12-04): the A10 and A10G "
        "'share the same GPU memory and bandwidth', '24 gigabytes of GDDR6 VRAM with a memory bandwidth of 600 gigabytes per "
        "second', and differ 'most notably around tensor compute'; its spec table (an image, not in the stored text) is "
        "the usual source of the A10G's 70 TFLOPS dense FP16 tensor figure. Treat 70 as a lower-confidence figure",
        "runtime/emulator/calibrate.py: the A10G rows need >= 57 TFLOPS delivered at one user (0.81 of 70), above the 0.76 "
        "upper bound on a prefill's compute fraction (data/calibration/SOURCES.md)",
    ),
)


@dataclass(frozen=True)
class InstanceType:
    name: str
    accelerator: Accelerator
    devices: int
    vcpus: int
    memory_gib: int
    tp_degrees: tuple[int, ...]  # tensor-parallel degrees the serving stack supports here
    source: str

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def shards(self) -> int:
        return self.devices * self.accelerator.shards_per_device

    def visible_gib(self, tp: int) -> float:
        return self.accelerator.shard_visible_gib * tp

    def bandwidth_gbs(self, tp: int) -> float:
        return self.accelerator.shard_bandwidth_gbs * tp

    def bf16_tflops(self, tp: int) -> float:
        return self.accelerator.shard_bf16_tflops * tp


_INF2_SRC = "AWS EC2 Inf2 instance types page (chips, vCPU, memory)"
_G6_SRC = "AWS EC2 G6 instance types page (GPUs, vCPU, memory)"
_G5_SRC = "AWS EC2 G5 instance types page (GPUs, vCPU, memory)"
# Neuron: TP over NeuronCores, one of {1, 2, 4, 8, 24} that fits the cores on the instance.
_NEURON_TP = (1, 2, 4, 8, 24)


def _inf2(size: str, chips: int, vcpus: int, mem: int) -> InstanceType:
    cores = chips * INFERENTIA2.shards_per_device
    return InstanceType(
        f"inf2.{size}", INFERENTIA2, chips, vcpus, mem, tuple(t for t in _NEURON_TP if t <= cores), _INF2_SRC
    )


def _gpu(family: str, size: str, acc: Accelerator, gpus: int, vcpus: int, mem: int, src: str) -> InstanceType:
    return InstanceType(f"{family}.{size}", acc, gpus, vcpus, mem, tuple(t for t in (1, 2, 4, 8) if t <= gpus), src)


_GPU_SIZES = (
    ("xlarge", 1, 4, 16),
    ("2xlarge", 1, 8, 32),
    ("4xlarge", 1, 16, 64),
    ("8xlarge", 1, 32, 128),
    ("16xlarge", 1, 64, 256),
    ("12xlarge", 4, 48, 192),
    ("24xlarge", 4, 96, 384),
    ("48xlarge", 8, 192, 768),
)

CATALOG: dict[str, InstanceType] = {
    it.name: it
    for it in (
        _inf2("xlarge", 1, 4, 16),
        _inf2("8xlarge", 1, 32, 128),
        _inf2("24xlarge", 6, 96, 384),
        _inf2("48xlarge", 12, 192, 768),
        *(_gpu("g6", s, NVIDIA_L4, g, v, m, _G6_SRC) for s, g, v, m in _GPU_SIZES),
        *(_gpu("g5", s, NVIDIA_A10G, g, v, m, _G5_SRC) for s, g, v, m in _GPU_SIZES),
    )
}


class UnknownInstanceType(CampaignError, KeyError):
    pass


def instance(name: str) -> InstanceType:
    try:
        return CATALOG[name]
    except KeyError:
        raise UnknownInstanceType(f"unknown instance type {name!r}; known: {', '.join(sorted(CATALOG))}") from None


BYTES_PER_PRECISION: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}


# --- Host software stacks: driver / SDK / runtime compatibility ---------------------------------
# Owned by the fleet boot recipes (stacks/fleet*.py, core/serving.py); `validate` checks every
# fleet's serving.sdk_version / driver_version / image against this table, and `deploy` finds the
# DLAMI by the name and description filters below (never an unpinned `latest` parameter).
NEURON_SDK_2_28_CONTENT = "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.28.1/release-notes/releasecontent.html"
NEURON_DOCS_2_28 = "aws-neuron/aws-neuron-sdk@86a9286833dc2a1cd23b674f7081061924aa587a (tag v2.28.0)"
NEURON_DLAMI_BY_VERSION = (
    "aws-neuron/aws-neuron-sdk@81ce03ae261e12925e53437a0f690478e6366155 deploy/environments/dlami.rst "
    "('Finding a DLAMI for a specific Neuron SDK version': describe-images, description filter '*Neuron SDK X.Y.Z*')"
)
CUDA_DRIVER_TABLE = (
    "https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html "
    "(Table 3, CUDA Toolkit and Corresponding Driver Versions: CUDA 12.8 GA needs Linux driver >= 570.26)"
)
NVIDIA_DLAMI_NAMES = (
    "https://docs.aws.amazon.com/dlami/latest/devguide/find-dlami-id.html (describe-images by DLAMI name)"
)
# Both fleets' hosts run one Ubuntu release, the Neuron DLAMI's 24.04; the NVIDIA DLAMI is the Base AMI
# with Single CUDA (Ubuntu 24.04), whose release notes list G4dn/G5/G6, x86_64, NVIDIA driver 595.71.05
# (>= 570.26, CUDA 12.8's minimum) and the docker-ce / containerd.io versions the boot script installs on a
# Neuron host (stacks/fleet_boot.py DOCKER_VERSION). The container brings its own CUDA; the host's 13.2
# toolkit is unused.
# The driver a fleet on that DLAMI has: the examples pin it (serving.driver_version), since the boot
# script refuses a host driver other than the pinned one (stacks/fleet_boot.py _driver_check).
NVIDIA_DLAMI_DRIVER = "595.71.05"
NVIDIA_DLAMI_RELEASE_NOTES = (
    "https://docs.aws.amazon.com/dlami/latest/devguide/aws-deep-learning-ami-gpubasesinglecuda-ul2404-2026-07-17.html "
    "(Deep Learning Base AMI with Single CUDA (Ubuntu 24.04) 20260717: Ubuntu 24.04.4 LTS, x86_64, nvidia_driver "
    f"{NVIDIA_DLAMI_DRIVER}, docker-ce-cli 29.6.2-1~ubuntu.24.04~noble, containerd v2.2.6)"
)


@dataclass(frozen=True)
class HostStack:
    """What one accelerator SDK release needs from the host: driver, AMI, and what it ships."""

    vendor: str
    sdk_version: str  # Neuron SDK release, or the CUDA version the serving image is built on
    driver: str  # Neuron: the exact aws-neuronx-dkms the SDK ships; NVIDIA: the minimum driver
    driver_is_minimum: bool
    runtime: str | None  # Neuron runtime library in that release (the container's libnrt)
    image_tag_marker: str | None  # substring every image tag for this SDK carries
    documented_image: str | None
    ami_name_filter: str
    ami_description_filter: str | None  # None: the DLAMI description does not name the version
    sources: tuple[str, ...]


HOST_STACKS: dict[tuple[str, str], HostStack] = {
    ("aws-neuron", "2.28.0"): HostStack(
        vendor="aws-neuron",
        sdk_version="2.28.0",
        driver="2.26.5.0",
        driver_is_minimum=False,
        runtime="2.30.51.0",
        image_tag_marker="sdk2.28.0",
        documented_image="public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04",
        ami_name_filter="Deep Learning Base Neuron AMI (Ubuntu 24.04) *",
        ami_description_filter="*Neuron SDK 2.28.0*",
        sources=(
            f"{NEURON_SDK_2_28_CONTENT}: Neuron 2.28.0 ships aws-neuronx-dkms-2.26.5.0 and aws-neuronx-runtime-lib-2.30.51.0",
            f"{NEURON_DOCS_2_28} containers/get-started/quickstart-configure-deploy-dlc.rst: "
            "image tag 0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04 of public.ecr.aws/neuron/pytorch-inference-vllm-neuronx",
            NEURON_DLAMI_BY_VERSION,
        ),
    ),
    ("nvidia", "12.8"): HostStack(
        vendor="nvidia",
        sdk_version="12.8",
        driver="570.26",
        driver_is_minimum=True,
        runtime=None,
        image_tag_marker=None,
        documented_image=None,
        ami_name_filter="Deep Learning Base AMI with Single CUDA (Ubuntu 24.04) *",
        ami_description_filter=None,
        sources=(CUDA_DRIVER_TABLE, NVIDIA_DLAMI_NAMES, NVIDIA_DLAMI_RELEASE_NOTES),
    ),
}


# --- prefix caching: each serving stack's documented default ------------------------------------
# A fleet's `serving.prefix_caching` (core.manifest) defaults to its stack's row here. On vLLM on
# Neuron the setting also picks the KV layout, so it is never left to the engine's own default.
NEURON_VLLM_GUIDE_2_28 = (
    f"{NEURON_DOCS_2_28} libraries/nxd-inference/developer_guides/vllm-user-guide-v1.rst "
    "(https://awsdocs-neuron.readthedocs-hosted.com/en/v2.28.0/libraries/nxd-inference/developer_guides/vllm-user-guide-v1.html)"
)
PREFIX_CACHING_DEFAULT: dict[str, bool] = {
    # vLLM V1 (>= 0.8) turns automatic prefix caching on unless --no-enable-prefix-caching.
    "vllm": True,
    # Off: the 2.28 guide describes NxD Inference's integration as the contiguous KV layout
    # ("Scheduling and K/V Cache"), presents prefix caching as a feature to enable (Feature
    # Configuration: "to enable prefix caching", is_prefix_caching + is_block_kv_layout, "Both
    # arguments need to be enabled"), and the calibration rows and the emulator's Neuron model are
    # contiguous. vLLM's own default (on) would switch the plugin to the block layout unasked.
    "vllm-neuron": False,
    # TGI v3 and TensorRT-LLM (KV block reuse) cache prefixes by default; core.serving passes no
    # flag for them, so a manifest may not turn it off there (core.manifest.semantic_issues).
    "tgi": True,
    "tensorrt-llm": True,
}
PREFIX_CACHING_SOURCES: dict[str, tuple[str, ...]] = {
    "vllm": (
        "https://docs.vllm.ai/en/latest/design/prefix_caching.html and https://docs.vllm.ai/en/latest/cli/serve.html "
        "(--enable-prefix-caching, --no-enable-prefix-caching; V1 enables it by default)",
    ),
    "vllm-neuron": (
        f"{NEURON_VLLM_GUIDE_2_28}, Known Issues 2: 'With either chunked prefill or prefix caching: NxDI will internally "
        "use blockwise kv cache layout. Set num_gpu_blocks_override to at least ceil(max_model_len / block_size) * "
        "max_num_seqs'; 'With neither chunked prefill nor prefix caching: NxDI will internally use contiguous kv cache "
        "layout, and overwrite block_size to max_model_len. Set num_gpu_blocks_override to exactly max_num_seqs'",
        f"{NEURON_VLLM_GUIDE_2_28}, Feature Configuration, Prefix Caching row: 'is_prefix_caching and is_block_kv_layout "
        "enable prefix caching and block KV Cache layout respectively. Both arguments need to be enabled for automatic "
        "prefix caching. For optimal performance with Neuron, it's recommended to set pa_block_size=32 or 16. Also set "
        "num_gpu_blocks_override to the same value as pa_num_blocks.'",
        "vllm-project/vllm-neuron@a5ef7c88c3e4e44bea9af9051d8fb113588c0a21 vllm_neuron/worker/"
        "neuronx_distributed_model_loader.py _get_default_neuron_config: is_block_kv_layout = chunked_prefill_enabled "
        "or enable_prefix_caching, is_prefix_caching = enable_prefix_caching; vllm_neuron/platform.py: block_size = "
        "max_model_len only 'if not vllm_config.cache_config.enable_prefix_caching'",
    ),
    "tgi": (
        "https://huggingface.co/docs/text-generation-inference/conceptual/chunking (prefix caching on by default in v3)",
    ),
    "tensorrt-llm": ("core/scheduling.py: trtllm-serve's KV cache block reuse is on by default",),
}
# pa_block_size when prefix caching is on (the guide recommends 32 or 16; its examples use 32).
NEURON_PREFIX_BLOCK_TOKENS = 32


def _version_tuple(v: str) -> tuple[int, ...] | None:
    parts = v.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


def host_stack_issues(vendor: str, sdk_version: str, driver_version: str, image: str) -> list[tuple[str, str]]:
    """(serving field, reason) for every way a fleet's pinned versions disagree with the table."""
    row = HOST_STACKS.get((vendor, sdk_version))
    if row is None:
        known = sorted(v for (ven, v) in HOST_STACKS if ven == vendor)
        return [
            (
                "sdk_version",
                f"no compatibility row for {vendor} SDK {sdk_version!r} (known: {known}); "
                "add one to core/catalog.py HOST_STACKS with its source",
            )
        ]
    out: list[tuple[str, str]] = []
    got, want = _version_tuple(driver_version), _version_tuple(row.driver)
    if got is None or want is None:
        out.append(("driver_version", f"{driver_version!r} is not a dotted version number"))
    elif row.driver_is_minimum:
        if got + (0,) * (len(want) - len(got)) < want:
            out.append(
                (
                    "driver_version",
                    f"{driver_version} is older than the {row.driver} that {vendor} SDK {sdk_version} needs",
                )
            )
    elif len(got) < 2 or want[: len(got)] != got:
        out.append(
            (
                "driver_version",
                f"{driver_version} is not the driver Neuron SDK {sdk_version} ships ({row.driver}); "
                "the DLAMI of that release carries it",
            )
        )
    tag = image.split("@", 1)[0].rsplit("/", 1)[-1].partition(":")[2]
    if row.image_tag_marker and tag and row.image_tag_marker not in tag:
        out.append(("image", f"tag {tag!r} is not an SDK {sdk_version} image (documented: {row.documented_image})"))
    return out


# --- efficiencies fitted on published measurements --------------------------------------------

CALIBRATION_FILE = shipped_path("calibration/efficiency.json")


@dataclass(frozen=True)
class CalibratedEfficiency:
    """One group's fitted efficiencies and the published rows they were fitted on."""

    name: str
    vendor: str
    stacks: tuple[str, ...]
    bandwidth: float
    compute: float
    step_overhead_ms: float
    request_overhead_ms: float
    rows: tuple[str, ...]  # ids in data/calibration/published.csv
    method: str
    # runtime/emulator/calibrate.py --loso over the group's vendor family, as --fit stored it: holdout,
    # rows, median_abs_rel_error and max_abs_rel_error per metric (output_tok_s, ttft_ms, itl_ms)
    out_of_sample: dict[str, Any] | None = None
    accelerators: tuple[str, ...] = ()  # of the rows it was fitted on

    @property
    def error_band(self) -> str | None:
        """The out-of-sample error in one line: median and worst absolute error per metric."""
        o = self.out_of_sample
        if not o:
            return None
        med, worst = o["median_abs_rel_error"], o["max_abs_rel_error"]
        metrics = (("TTFT", "ttft_ms"), ("ITL", "itl_ms"), ("tok/s", "output_tok_s"))
        figures = ", ".join(f"{label} {med[k]:.0%} (worst {worst[k]:.0%})" for label, k in metrics if k in med)
        return f"out of sample (each {o['holdout']} left out of the fit in turn, {o['rows']} {self.vendor} rows): median error {figures}"

    @property
    def provenance(self) -> str:
        shown = ", ".join(self.rows[:2]) + (
            f" and {len(self.rows) - 2} more {self.vendor} rows" if len(self.rows) > 2 else ""
        )
        band = self.error_band
        on = f"{' and '.join(self.accelerators)} rows, " if self.accelerators else ""
        return f"calibration {self.name!r}: fitted on {shown} ({on}data/calibration/published.csv)" + (
            f"; {band}" if band else ""
        )


def calibrated_efficiency(name: str, path: Path = CALIBRATION_FILE) -> CalibratedEfficiency:
    groups = _calibration_groups(path)
    try:
        return groups[name]
    except KeyError:
        raise KeyError(
            f"no calibration group {name!r} in {path.name}; known: {', '.join(sorted(groups)) or 'none'}"
        ) from None


def calibration_groups(path: Path = CALIBRATION_FILE) -> dict[str, CalibratedEfficiency]:
    """Every fitted group, by name (empty when the file is absent)."""
    return dict(_calibration_groups(path))


@lru_cache(maxsize=4)
def _calibration_groups(path: Path) -> dict[str, CalibratedEfficiency]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    out: dict[str, CalibratedEfficiency] = {}
    for name, g in data["groups"].items():
        out[name] = CalibratedEfficiency(
            name=name,
            vendor=g["vendor"],
            stacks=tuple(g["stacks"]),
            bandwidth=float(g["bandwidth"]),
            compute=float(g["compute"]),
            step_overhead_ms=float(g["step_overhead_ms"]),
            request_overhead_ms=float(g["request_overhead_ms"]),
            rows=tuple(g["rows"]),
            method=g["method"],
            out_of_sample=g.get("out_of_sample"),
            accelerators=tuple(g.get("accelerators", ())),
        )
    return out
