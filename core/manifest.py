"""The frozen comparability manifest: one YAML file that pins everything a campaign compares.

Loading is two passes: pydantic checks shape and ranges, then `semantic_issues` checks what
needs the catalog (instance types, TP degrees, memory fit, AZs). Both report
`field.path: reason`, so an operator can fix a manifest before any money is spent.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from core import catalog
from core.errors import CampaignError
from core.stats import min_n_bounded_upper

Slug = Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,30}[a-z0-9]$")]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
NonNeg = Annotated[float, Field(ge=0)]
Pos = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Precision = Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Model(_Frozen):
    repo: str = Field(min_length=3, pattern=r"^[\w.-]+/[\w.-]+$")
    commit: str = Field(pattern=r"^[0-9a-f]{40}$", description="full 40-hex revision of the checkpoint")
    weight_files: dict[str, Sha256] = Field(min_length=1)
    license: str = Field(min_length=1)
    params_b: Pos
    layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    attention_heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int | None = Field(default=None, gt=0)
    vocab_size: int = Field(gt=0)
    # A gated checkpoint's hub token lives in Secrets Manager; the manifest only names it.
    # Full ARN with the 6-character suffix Secrets Manager appends: an IAM grant on a partial
    # ARN does not match the secret, and the fleet could not read its token at boot.
    hub_token_secret_arn: str | None = Field(
        default=None, pattern=r"^arn:aws[\w-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:[\w/+=.@-]+-[A-Za-z0-9]{6}$"
    )

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.attention_heads

    @field_validator("commit", mode="before")
    @classmethod
    def _commit_is_full(cls, v: Any) -> Any:
        if isinstance(v, str) and re.fullmatch(r"[0-9a-f]{4,39}", v):
            raise ValueError(f"commit {v!r} is abbreviated ({len(v)} hex digits); pin the full 40-hex hash")
        return v


# Where transformers (and so vLLM and trtllm-serve) finds a checkpoint's chat template: a
# separate chat_template.jinja when the checkpoint ships one, else tokenizer_config.json's
# "chat_template" (huggingface/transformers src/transformers/tokenization_utils_base.py,
# from_pretrained: "If independent chat template file(s) exist, they take priority over template
# entries in the tokenizer config"; read in transformers 5.19.0).
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
# A pinned tokenizer file is named as it sits in the checkpoint's top directory.
TokenizerFileName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")]


class Tokenizer(_Frozen):
    # "emulator": the word-level tokenizer shared by the emulator and loadgen (local campaigns);
    # "huggingface": a tokenizer.json shipped with the checkpoint at the pinned commit.
    kind: Literal["emulator", "huggingface"]
    path: str | None = None
    # huggingface: the checkpoint's tokenizer files at model.commit, each with its sha256, as they
    # sit in the directory of `path` (tokenizer.json, tokenizer_config.json, chat_template.jinja
    # when it has one). A cloud run stages exactly these to its load generators, which check the
    # hashes; the fleets download and check them beside the weights (core/serving.py).
    files: dict[TokenizerFileName, Sha256] = Field(default_factory=dict)
    # Optional for a huggingface tokenizer with pinned files: then the checkpoint's own template
    # (Manifest.chat_template); when given, it must equal it.
    chat_template: str | None = Field(default=None, min_length=1)
    special_tokens: dict[str, str] = Field(default_factory=dict)
    max_length: int = Field(gt=0)

    @model_validator(mode="after")
    def _hf_needs_file(self) -> Tokenizer:
        if self.kind == "huggingface" and not self.path:
            raise ValueError("path: a huggingface tokenizer needs the tokenizer.json path")
        if self.kind == "emulator" and self.files:
            raise ValueError("files: only a huggingface tokenizer has checkpoint files to pin")
        if self.files:
            assert self.path is not None
            needed = [n for n in (PurePosixPath(self.path).name, TOKENIZER_CONFIG) if n not in self.files]
            if needed:
                raise ValueError(
                    f"files: pin {' and '.join(needed)} too (the file tokenizer.path names, and the one the "
                    "server reads the chat template and special tokens from)"
                )
        elif self.chat_template is None:
            raise ValueError(
                "chat_template: required, unless a huggingface tokenizer pins its files "
                f"(tokenizer.files, with {TOKENIZER_CONFIG}) to read it from"
            )
        return self


class Generation(_Frozen):
    temperature: NonNeg
    top_p: Annotated[float, Field(gt=0, le=1)]
    top_k: int = Field(ge=-1)
    seed: int = Field(ge=0)
    max_output_tokens: int = Field(gt=0)
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()


class PrecisionSpec(_Frozen):
    weights: Precision
    activations: Precision
    kv_cache: Precision


class Serving(_Frozen):
    stack: Literal["vllm-neuron", "vllm", "tensorrt-llm", "tgi"]
    image: str = Field(pattern=r"^[\w./:-]+@sha256:[0-9a-f]{64}$", description="image pinned by digest")
    sdk_version: str = Field(min_length=1, description="Neuron SDK or CUDA version")
    driver_version: str = Field(min_length=1)
    framework_versions: dict[str, str] = Field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    # Automatic prefix caching. None: the stack's documented default (core.catalog.PREFIX_CACHING_DEFAULT:
    # on for vLLM on GPU, TGI and TensorRT-LLM; off for vLLM on Neuron, where it also picks the KV
    # layout: block with it, contiguous without). core.serving passes the matching flags and the
    # emulator models the same layout. Left out of the digest at the stack's default.
    prefix_caching: StrictBool | None = Field(
        default=None, description="automatic prefix caching; default: the stack's"
    )

    @property
    def resolved_prefix_caching(self) -> bool:
        """The setting the fleet runs with: the manifest's, else the stack's documented default."""
        return catalog.PREFIX_CACHING_DEFAULT[self.stack] if self.prefix_caching is None else self.prefix_caching


class Asg(_Frozen):
    min: int = Field(ge=0)
    max: int = Field(ge=1)
    desired: int = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> Asg:
        if not self.min <= self.desired <= self.max:
            raise ValueError(f"need min <= desired <= max, got {self.min} <= {self.desired} <= {self.max}")
        return self


class Efficiency(_Frozen):
    """Fraction of the roofline a real stack reaches, and its fixed costs per scheduler step.

    Either `calibration` names a group fitted on published measurements
    (data/calibration/efficiency.json, written by `python -m runtime.emulator.calibrate --fit`), or the numbers
    are given here (assumed: the seed's 60-80% of theoretical), never both.
    """

    calibration: str | None = None
    bandwidth: Annotated[float, Field(gt=0, le=1)] = 0.7
    compute: Annotated[float, Field(gt=0, le=1)] = 0.5
    step_overhead_ms: NonNeg = 0.0  # every forward pass (launch, collectives, sampling)
    # per request, before it reaches the scheduler (HTTP, tokenizing, scheduling): adds to TTFT,
    # does not occupy the accelerator
    request_overhead_ms: NonNeg = 0.0

    @model_validator(mode="after")
    def _either_calibration_or_numbers(self) -> Efficiency:
        numbers = self.model_fields_set - {"calibration"}
        if self.calibration is not None and numbers:
            raise ValueError(
                f"calibration {self.calibration!r} supplies the figures; drop {', '.join(sorted(numbers))}"
            )
        return self

    def resolved(self) -> ResolvedEfficiency:
        if self.calibration is None:
            return ResolvedEfficiency(
                self.bandwidth, self.compute, self.step_overhead_ms, self.request_overhead_ms, "manifest (assumed)"
            )
        c = catalog.calibrated_efficiency(self.calibration)
        return ResolvedEfficiency(c.bandwidth, c.compute, c.step_overhead_ms, c.request_overhead_ms, c.provenance)


@dataclass(frozen=True)
class ResolvedEfficiency:
    bandwidth: float
    compute: float
    step_overhead_ms: float
    request_overhead_ms: float
    provenance: str


class Fleet(_Frozen):
    name: Slug
    instance_type: str
    serving: Serving
    tensor_parallel: int = Field(ge=1)
    # Data parallel: servers of tensor_parallel devices/cores each on one instance, behind one
    # endpoint (e.g. inf2.48xlarge as 3 x TP=8, as optimum-neuron's published benchmarks ran it).
    replicas_per_instance: int = Field(default=1, ge=1)
    sequence_buckets: tuple[int, ...] = ()
    max_concurrency: int = Field(ge=1, description="max sequences batched at once (vLLM max_num_seqs), per replica")
    max_model_len: int = Field(gt=0)
    asg: Asg
    availability_zones: tuple[str, ...] = Field(min_length=1)
    redundancy: int = Field(ge=0, description="instances added above the computed need (N+k)")
    ebs_cache_gib: int = Field(ge=20, le=16384)
    runtime_reserve_gib: NonNeg | None = None
    efficiency: Efficiency = Efficiency()
    # Instances serving while the campaign measures, behind the fleet's one endpoint (cloud: the
    # NLB's targets, each billed for the campaign; local: emulated behind one port). Capacity per
    # instance = the fleet's goodput / this. None: asg.desired (at least 1). Checked <= asg.max.
    measure_instances: int | None = Field(default=None, ge=1)

    @property
    def sequences_per_instance(self) -> int:
        """What one instance can run at once: max_concurrency on each of its replicas."""
        return self.max_concurrency * self.replicas_per_instance

    @property
    def instances_measured(self) -> int:
        """measure_instances, or its default: the ASG's desired size, at least one."""
        return self.measure_instances if self.measure_instances is not None else max(1, self.asg.desired)

    @property
    def instances_deployed(self) -> int:
        """What the fleet's Auto Scaling group runs (stacks/fleet.py): asg.desired, or the instances
        measured when more, so that every measured instance serves behind the NLB."""
        return max(self.asg.desired, self.instances_measured)


class Trace(_Frozen):
    path: str
    format: Literal["azure", "burstgpt", "mooncake", "plain-csv", "plain-jsonl"]
    sha256: Sha256 | None = None
    source: str = ""


class Window(_Frozen):
    start_s: NonNeg = 0.0
    duration_s: Pos


class RequestClass(_Frozen):
    max_input_tokens: int = Field(gt=0)
    max_output_tokens: int = Field(gt=0)
    mode: Literal["clip", "filter"] = "clip"


class Demand(_Frozen):
    """Production demand the fleet must be sized for (not the replayed trace's rate)."""

    peak_requests_per_s: Pos
    hours_per_month: Annotated[float, Field(gt=0, le=744)] = 730.0


class CapacitySweep(_Frozen):
    """After the trace replay, each fleet alone gets the same requests at these multiples of the
    replay's rate, one short step each; the per-instance capacity used for sizing is the best
    SLO-compliant goodput among the steps that met the SLO."""

    multipliers: tuple[Pos, ...] = Field(min_length=1)
    step_s: Pos

    @field_validator("multipliers")
    @classmethod
    def _increasing(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if list(v) != sorted(set(v)):
            raise ValueError("must be strictly increasing")
        return v


# The settle phase's rounds (campaign.stages.settle.MAX_ROUNDS): it runs one segment per fleet a round.
SETTLE_MAX_ROUNDS = 4


class CapacitySearch(_Frozen):
    """The default way capacity is measured: per fleet, raise the replay rate geometrically until
    the fleet SLO fails (or lower it to each miss's own estimate of the boundary until it holds),
    then bisect until the highest holding rate is known within `tolerance`
    (analysis.capacity.search). Each step is sized from the previous step's median request
    lifetime (3 lifetimes of arrivals) and `min_requests`."""

    start_multiplier: Pos = 1.0
    growth: Annotated[float, Field(gt=1)] = 2.0
    tolerance: Annotated[float, Field(gt=0, le=1)] = 0.10
    # Default: the fewest requests whose P95 has a bounded 95% interval (core.stats), so a
    # step that held can carry the capacity's interval; fewer is allowed, and the report then Defers.
    min_requests: int = Field(default=min_n_bounded_upper(), ge=2)
    max_steps: int = Field(default=8, ge=1, le=50)
    # 1,200 s: the searches on every shipped trace converged within it at the example's rate_scale
    # (Mooncake inf2 spent 849 s on 5 steps of 72 requests, 2026-12-04; bench/capacity_search_traces.py, README).
    time_budget_s: Pos = Field(default=1200.0, description="per fleet: arrival spans plus drains of all its steps")
    min_multiplier: Pos = 1 / 64
    max_multiplier: Pos = 64.0
    # The settle phase (campaign.stages.settle): after the searches, more requests at each fleet's
    # sizing step until the decision settles or this budget is spent. Seconds: of arrivals and
    # drains, fleets side by side; 0 turns the phase off. USD: what those seconds cost on the
    # cloud fleets at the report's prices (decision.to_settle.usd); None: no USD cap.
    settle_budget_s: float = Field(
        default=600.0, ge=0, description="settle phase: seconds of extra requests, fleets side by side"
    )
    settle_budget_usd: float | None = Field(
        default=None, ge=0, description="settle phase: USD those seconds may cost on the cloud fleets"
    )
    # Segments per fleet the settle phase runs even when the decision is already settled (each of
    # `min_requests` requests where decision.to_settle asks none), within the budgets and the
    # deadline: a rehearsal sets 1 so its price cannot be met by skipping the phase. One per fleet a
    # round, so at most the phase's rounds (campaign.stages.settle.MAX_ROUNDS).
    settle_min_segments: int = Field(
        default=0,
        ge=0,
        le=SETTLE_MAX_ROUNDS,
        description="settle phase: segments per fleet it runs even when the decision is settled",
    )

    @model_validator(mode="after")
    def _range(self) -> CapacitySearch:
        if not self.min_multiplier <= self.start_multiplier <= self.max_multiplier:
            raise ValueError(
                f"need min_multiplier <= start_multiplier <= max_multiplier, got "
                f"{self.min_multiplier:g} <= {self.start_multiplier:g} <= {self.max_multiplier:g}"
            )
        return self


# CapacitySearch fields added later, left out of the digest at their defaults (Manifest.digest).
_LATER_SEARCH_FIELDS = ("settle_budget_s", "settle_budget_usd", "settle_min_segments")


class Workload(_Frozen):
    """How the trace is replayed.

    time_scale multiplies every arrival offset (0.5 replays twice as fast, burst shape kept);
    rate_scale thins (< 1) or replicates (> 1) arrivals deterministically by sample_seed, so
    load changes without changing the inter-arrival pattern of the requests that remain.
    window is in trace time, before time_scale.
    """

    trace: Trace
    time_scale: Pos = 1.0
    rate_scale: Pos = 1.0
    window: Window
    warmup_s: NonNeg = 0.0
    request_class: RequestClass
    sample_seed: int = 0
    demand: Demand
    # Capacity for sizing: the automatic search (the default, `capacity_search`), or fixed
    # multipliers (`capacity_sweep`), never both.
    capacity_sweep: CapacitySweep | None = None
    capacity_search: CapacitySearch | None = None

    @model_validator(mode="after")
    def _one_capacity_method(self) -> Workload:
        if self.capacity_sweep is not None and self.capacity_search is not None:
            raise ValueError(
                "capacity_sweep (fixed multipliers) and capacity_search (automatic) are alternatives; give one"
            )
        return self

    @property
    def capacity_method(self) -> CapacitySweep | CapacitySearch:
        """What `campaign local` runs after the replay: the explicit sweep when given, else the search."""
        return self.capacity_sweep or self.capacity_search or CapacitySearch()


class Slo(_Frozen):
    ttft_p95_s: Pos
    itl_p95_s: Pos
    max_error_rate: Fraction
    max_retry_rate: Fraction


class QualityFixture(_Frozen):
    id: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    max_tokens: int = Field(gt=0)
    expect_finish_reason: Literal["stop", "length"] | None = None
    expect_regex: str | None = None
    expect_json: bool = False

    @field_validator("expect_regex")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression: {exc}") from None
        return v


class TaskAcceptance(_Frozen):
    """The buyer's own scorer: a command (run in the manifest's directory) that reads each
    fleet's fixture outputs as JSONL on stdin and prints a pass rate in [0, 1] as its last line."""

    command: tuple[str, ...] = Field(min_length=1)
    threshold: Fraction
    timeout_s: Pos = 120.0


class DistributionChecks(_Frozen):
    """Checks over the replayed requests of every fleet (quality layer c)."""

    # Output lengths of a fleet against the baseline's, two-sample KS: a p-value below this fails.
    min_p_value: Fraction = 0.01
    min_samples: int = Field(default=20, ge=2, description="completed requests per fleet before the test is read")
    # Responses that came back unusable (truncated stream, failed quality check) per sent request.
    max_invalid_rate: Fraction = 0.01


class Quality(_Frozen):
    """Three layers (the seed study's quality gate): (a) fixtures, greedy, on every fleet, and
    their cross-fleet equivalence; (b) task acceptance by the buyer's scorer; (c) distribution
    checks over the replayed requests."""

    fixtures: tuple[QualityFixture, ...] = Field(min_length=1)
    min_pass_rate: Fraction = 1.0
    task_acceptance: TaskAcceptance | None = None
    distribution: DistributionChecks = DistributionChecks()


class Commitment(_Frozen):
    fleet: str
    kind: Literal["savings-plan", "reserved-instance"]
    covered_instances: int = Field(ge=0, description="instances the commitment pays for, used or not")
    effective_hourly_usd: NonNeg
    renewal_hourly_usd: NonNeg | None = None
    term_months: int = Field(gt=0)


class Network(_Frozen):
    nlb_cross_zone: bool = False
    inter_az_gb_per_month: NonNeg = 0.0
    nlb_lcu_per_hour: NonNeg = 1.0


class Costs(_Frozen):
    region: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-\d$")
    price_source: Literal["snapshot", "price-list-api"] = "snapshot"
    commitments: tuple[Commitment, ...] = ()
    network: Network = Network()
    observability_monthly_usd: NonNeg = 0.0
    licenses_monthly_usd: NonNeg = 0.0
    utilization_target: Annotated[float, Field(gt=0, le=1)] = 1.0


class Migration(_Frozen):
    activities_hours: dict[str, NonNeg] = Field(min_length=1)
    loaded_rate_usd_per_hour: NonNeg
    testing_usd: NonNeg = 0.0
    tooling_usd: NonNeg = 0.0
    training_usd: NonNeg = 0.0
    dual_run_days: NonNeg = 0.0
    shadow_capacity_fraction: Fraction = 0.0
    canary_capacity_fraction: Fraction = 0.0
    rollback_retention_days: NonNeg = 0.0
    refresh_cadence_months: Pos
    months_to_next_refresh: NonNeg | None = None


class IndifferenceMargin(_Frozen):
    """A monthly saving at or below which a migration is not worth making (docs/design.md: Decision):
    the Go threshold is migration cost / horizon + this margin. Give it in USD per month or as a
    percentage of the baseline fleet's monthly cost, not both; absent, it is 0."""

    usd_per_month: NonNeg = Field(default=0.0, description="margin in USD per month")
    percent_of_baseline: Annotated[float, Field(ge=0, le=100)] = Field(
        default=0.0, description="margin as a percentage of the baseline fleet's monthly cost (at the point estimate)"
    )

    @model_validator(mode="after")
    def _one_unit(self) -> IndifferenceMargin:
        if self.usd_per_month > 0 and self.percent_of_baseline > 0:
            raise ValueError("give usd_per_month or percent_of_baseline, not both")
        return self

    def usd(self, baseline_monthly_usd: float) -> float:
        """The margin in USD per month, against the baseline fleet's monthly cost."""
        return self.usd_per_month + baseline_monthly_usd * self.percent_of_baseline / 100.0


class Comparison(_Frozen):
    baseline: str = Field(description="fleet running today (e.g. the G6 fleet)")
    candidate: str = Field(description="fleet the migration would move to (e.g. the Inf2 fleet)")


# The widest operator range accepted: a /16 (65,536 IPv4 addresses) or a /48 IPv6 site. Only
# the operator's own office or VPN range may open a session to the Locust UI; 0.0.0.0/1 is
# half the internet, and rejecting only /0 would let it through.
OPERATOR_MIN_PREFIX = {4: 16, 6: 48}


class Operator(_Frozen):
    cidr: str

    @field_validator("cidr")
    @classmethod
    def _not_world(cls, v: str) -> str:
        try:
            net = ipaddress.ip_network(v, strict=True)
        except ValueError as exc:
            raise ValueError(f"not a CIDR block: {exc}") from None
        if net.prefixlen == 0:
            raise ValueError(f"{v} opens the Locust UI to the whole internet; give the operator's own range")
        least = OPERATOR_MIN_PREFIX[net.version]
        if net.prefixlen < least:
            raise ValueError(
                f"{v} is a /{net.prefixlen}: wider than the /{least} prefix allowed for the operator's range "
                f"({net.num_addresses:,} addresses); give the office or VPN range that runs the campaign"
            )
        return v


class Loadgen(_Frozen):
    workers: int = Field(ge=1, le=64)
    request_timeout_s: Pos = 120.0
    # A run whose schedule lag p99 exceeds this measured the client, not the server.
    max_schedule_lag_p99_s: Pos = 0.05


class Manifest(_Frozen):
    schema_version: Literal[1] = 1
    campaign: Slug
    description: str = ""
    model: Model
    tokenizer: Tokenizer
    generation: Generation
    precision: PrecisionSpec
    fleets: tuple[Fleet, ...] = Field(min_length=2)
    comparison: Comparison
    workload: Workload
    slo: Slo
    quality: Quality
    costs: Costs
    migration: Migration
    horizon_months: Annotated[float, Field(gt=0, le=120)]
    indifference_margin: IndifferenceMargin = IndifferenceMargin()
    operator: Operator
    loadgen: Loadgen
    # The cloud campaign's deadline, in hours after `deploy`: each fleet's Auto Scaling group gets a
    # scheduled action setting it to 0 then (stacks/fleet.py). Optional so that a manifest written
    # before it loads unchanged; `deploy` refuses without it, and `validate --for cloud` checks that it
    # covers the plan's campaign minutes (campaign.plan.predict.deadline_issues).
    max_campaign_hours: Annotated[float, Field(gt=0, le=24 * 14)] | None = None

    _source: Path | None = PrivateAttr(default=None)
    _checkpoint_template: str | None = PrivateAttr(default=None)

    @property
    def digest(self) -> str:
        """sha256 of the canonical JSON form: stable across key order, whitespace and comments.

        Fields added after the first campaigns are left out while they hold their defaults (a
        zero indifference margin, the default settle budget), so a manifest that does not set
        them hashes as it did before they existed (and its runs' records still match it). A fleet's
        serving.prefix_caching is left out while it is its stack's documented default, given or not,
        and its measure_instances while it is its default (asg.desired), given or not; tokenizer.files
        while none is pinned."""
        data = self.model_dump(mode="json")
        # The deadline bounds what the stack bills, not what is measured: never in the digest, so
        # moving it neither changes the campaign's results prefix nor orphans its runs.
        del data["max_campaign_hours"]
        if self.indifference_margin == IndifferenceMargin():
            del data["indifference_margin"]
        for fleet, dumped in zip(self.fleets, data["fleets"], strict=True):
            if fleet.serving.resolved_prefix_caching == catalog.PREFIX_CACHING_DEFAULT[fleet.serving.stack]:
                dumped["serving"].pop("prefix_caching", None)
            if fleet.instances_measured == max(1, fleet.asg.desired):
                dumped.pop("measure_instances", None)
        # tokenizer.files (added later) is left out while empty; a template the manifest leaves to
        # the checkpoint is covered by the pinned hash of the file it is read from.
        if not self.tokenizer.files:
            del data["tokenizer"]["files"]
        if self.tokenizer.chat_template is None:
            del data["tokenizer"]["chat_template"]
        search = data["workload"].get("capacity_search")
        if search is not None:
            for name in _LATER_SEARCH_FIELDS:
                if search.get(name) == CapacitySearch.model_fields[name].default:
                    search.pop(name, None)
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def short_digest(self) -> str:
        return self.digest[:12]

    @property
    def source(self) -> Path | None:
        return self._source

    def source_file(self) -> Path:
        """The file this manifest was parsed from (absolute): what a child process (Locust, an
        emulator, an engine) is handed, to parse once itself."""
        if self._source is None:
            raise ValueError("manifest: built in memory, not from a file; a child process needs its file")
        return self._source

    def fleet(self, name: str) -> Fleet:
        for f in self.fleets:
            if f.name == name:
                return f
        raise KeyError(f"no fleet named {name!r}; fleets: {', '.join(f.name for f in self.fleets)}")

    def resolve_path(self, rel: str) -> Path:
        """Paths inside the manifest are relative to the manifest file."""
        p = Path(rel)
        if p.is_absolute() or self._source is None:
            return p
        return (self._source.parent / p).resolve()

    @property
    def trace_path(self) -> Path:
        return self.resolve_path(self.workload.trace.path)

    @property
    def tokenizer_dir(self) -> Path | None:
        """The directory of tokenizer.path, where its pinned files sit (None: no tokenizer file)."""
        return self.resolve_path(self.tokenizer.path).parent if self.tokenizer.path else None

    @property
    def chat_template(self) -> str:
        """The template chat prompts are rendered with: the manifest's own, else the one the pinned
        checkpoint files carry (read once). `semantic_issues` checks that the two agree."""
        if self.tokenizer.chat_template is not None:
            return self.tokenizer.chat_template
        if self._checkpoint_template is None:
            found = checkpoint_chat_template(self)
            if isinstance(found, Issue):
                raise ManifestError([found], str(self._source) if self._source else None)
            self._checkpoint_template = found[1]
        return self._checkpoint_template


# --- errors --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Issue:
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


class ManifestError(CampaignError, ValueError):
    def __init__(self, issues: list[Issue], source: str | None = None):
        self.issues = issues
        self.source = source
        head = f"{source}: " if source else ""
        super().__init__(head + "; ".join(str(i) for i in issues))


def _loc_to_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(root)"


def _pydantic_issues(exc: ValidationError) -> list[Issue]:
    issues = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] == "extra_forbidden":
            msg = "unknown field (typo?)"
        issues.append(Issue(_loc_to_path(loc), msg))
    return issues


# --- YAML loading ----------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys: a silently overwritten key loses data."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str, source: str = "<manifest>") -> Any:
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = exc.problem or exc.context or "invalid YAML"
        raise ManifestError([Issue("(yaml)", f"{where}: {problem}")], source) from None
    except yaml.YAMLError as exc:
        raise ManifestError([Issue("(yaml)", str(exc))], source) from None


def load_manifest(path: str | Path, *, check_files: bool = True) -> Manifest:
    """Parse, validate and semantically check a manifest; raise ManifestError with every issue."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ManifestError([Issue("(file)", f"cannot read: {exc.strerror or exc}")], str(p)) from None
    except UnicodeDecodeError as exc:
        raise ManifestError([Issue("(file)", f"not UTF-8: {exc}")], str(p)) from None
    data = parse_yaml(text, str(p))
    m = manifest_from_data(data, source=p)
    issues = semantic_issues(m, check_files=check_files)
    if issues:
        raise ManifestError(issues, str(p))
    return m


def manifest_from_data(data: Any, source: Path | None = None) -> Manifest:
    if not isinstance(data, dict):
        raise ManifestError([Issue("(root)", "the manifest must be a YAML mapping")], str(source) if source else None)
    try:
        m = Manifest.model_validate(data)
    except ValidationError as exc:
        issues = _pydantic_issues(exc)
        seen = {i.path for i in issues}
        issues += [i for i in _raw_fleet_issues(data) if i.path not in seen]
        raise ManifestError(issues, str(source) if source else None) from None
    m._source = source.resolve() if source else None
    return m


# --- semantic checks (need the catalog) ---------------------------------------------------------


def default_reserve_gib(it: catalog.InstanceType, tp: int) -> float:
    # Assumption, not a measurement: CUDA context + activation workspace ~1.5 GiB per GPU;
    # Neuron runtime scratchpad ~0.75 GiB per NeuronCore. Override per fleet when measured.
    per_shard = 0.75 if it.accelerator.vendor == "aws-neuron" else 1.5
    return per_shard * tp


@dataclass(frozen=True)
class Fit:
    weights_gib: float
    kv_cache_gib: float
    reserve_gib: float
    visible_gib: float

    @property
    def needed_gib(self) -> float:
        return self.weights_gib + self.kv_cache_gib + self.reserve_gib

    @property
    def fits(self) -> bool:
        return self.needed_gib <= self.visible_gib


def weight_bytes(m: Manifest) -> float:
    return m.model.params_b * 1e9 * catalog.BYTES_PER_PRECISION[m.precision.weights]


def kv_bytes_per_token(m: Manifest) -> float:
    md = m.model
    return 2 * md.layers * md.kv_heads * md.resolved_head_dim * catalog.BYTES_PER_PRECISION[m.precision.kv_cache]


def fit(m: Manifest, fleet: Fleet) -> Fit:
    it = catalog.instance(fleet.instance_type)
    tp = fleet.tensor_parallel
    kv = kv_bytes_per_token(m) * fleet.max_model_len * fleet.max_concurrency
    reserve = fleet.runtime_reserve_gib if fleet.runtime_reserve_gib is not None else default_reserve_gib(it, tp)
    return Fit(weight_bytes(m) / catalog.GIB, kv / catalog.GIB, reserve, it.visible_gib(tp))


def _catalog_issues(at: str, instance_type: str, tp: int, attention_heads: int | None) -> list[Issue]:
    """Instance type known, TP degree allowed on it and dividing the heads."""
    try:
        it = catalog.instance(instance_type)
    except catalog.UnknownInstanceType as exc:
        return [Issue(f"{at}.instance_type", str(exc.args[0]))]
    if tp not in it.tp_degrees:
        unit = "NeuronCores" if it.accelerator.vendor == "aws-neuron" else "GPUs"
        allowed = "{1, 2, 4, 8, 24}" if it.accelerator.vendor == "aws-neuron" else "{1, 2, 4, 8}"
        return [
            Issue(
                f"{at}.tensor_parallel",
                f"degree {tp} not supported on {it.name}: must be one of {allowed} "
                f"and at most the {it.shards} {unit} it has (allowed here: {list(it.tp_degrees)})",
            )
        ]
    if attention_heads and attention_heads % tp:
        return [
            Issue(f"{at}.tensor_parallel", f"degree {tp} does not divide the model's {attention_heads} attention heads")
        ]
    return []


def _raw_fleet_issues(data: dict[str, Any]) -> list[Issue]:
    """Catalog checks on raw fleet entries, so a shape error elsewhere doesn't hide them."""
    issues: list[Issue] = []
    fleets = data.get("fleets")
    model = data.get("model")
    heads = model.get("attention_heads") if isinstance(model, dict) else None
    heads = heads if isinstance(heads, int) else None
    if not isinstance(fleets, list):
        return issues
    for i, f in enumerate(fleets):
        if (
            isinstance(f, dict)
            and isinstance(f.get("instance_type"), str)
            and isinstance(f.get("tensor_parallel"), int)
        ):
            issues += _catalog_issues(f"fleets[{i}]", f["instance_type"], f["tensor_parallel"], heads)
    return issues


def semantic_issues(m: Manifest, *, check_files: bool = True) -> list[Issue]:
    issues = _fleet_reference_issues(m) + _request_length_issues(m)
    for i, f in enumerate(m.fleets):
        issues += _fleet_issues(m, f"fleets[{i}]", f)
    if check_files:
        issues += _file_issues(m)
    return issues


def _fleet_reference_issues(m: Manifest) -> list[Issue]:
    """Fleet names unique, and every name the comparison and the commitments use defined."""
    issues: list[Issue] = []
    names = [f.name for f in m.fleets]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        issues.append(Issue("fleets", f"fleet name {dup!r} is used more than once"))
    for role in ("baseline", "candidate"):
        if getattr(m.comparison, role) not in names:
            issues.append(Issue(f"comparison.{role}", f"no fleet named {getattr(m.comparison, role)!r}"))
    if m.comparison.baseline == m.comparison.candidate:
        issues.append(Issue("comparison", "baseline and candidate must be different fleets"))
    for i, c in enumerate(m.costs.commitments):
        if c.fleet not in names:
            issues.append(Issue(f"costs.commitments[{i}].fleet", f"no fleet named {c.fleet!r}"))
    return issues


def _request_max_tokens(m: Manifest) -> int:
    """The longest sequence the request class makes: its input plus its output bound."""
    return m.workload.request_class.max_input_tokens + m.workload.request_class.max_output_tokens


def _request_length_issues(m: Manifest) -> list[Issue]:
    issues: list[Issue] = []
    max_seq = _request_max_tokens(m)
    if m.generation.max_output_tokens < m.workload.request_class.max_output_tokens:
        issues.append(Issue("generation.max_output_tokens", "smaller than workload.request_class.max_output_tokens"))
    if max_seq > m.tokenizer.max_length:
        issues.append(
            Issue(
                "workload.request_class",
                f"input + output = {max_seq} exceeds tokenizer.max_length {m.tokenizer.max_length}",
            )
        )
    return issues


def _fleet_issues(m: Manifest, at: str, f: Fleet) -> list[Issue]:
    """One fleet's checks, in the order they are reported; past an instance or TP the catalog
    refuses, only that is said (the rest need the catalog's row)."""
    issues: list[Issue] = []
    if f.instances_measured > f.asg.max:
        issues.append(
            Issue(
                f"{at}.measure_instances",
                f"{f.instances_measured} instances measured, more than asg.max {f.asg.max}",
            )
        )
    cat_issues = _catalog_issues(at, f.instance_type, f.tensor_parallel, m.model.attention_heads)
    if cat_issues:
        return issues + cat_issues
    it = catalog.instance(f.instance_type)
    return (
        issues
        + _replica_issues(at, f, it)
        + _serving_stack_issues(at, f, it)
        + _sequence_length_issues(at, f, it, _request_max_tokens(m))
        + _calibration_issues(at, f, it)
        + _fit_issues(m, at, f, it)
        + _availability_zone_issues(m, at, f)
    )


def _replica_issues(at: str, f: Fleet, it: catalog.InstanceType) -> list[Issue]:
    tp = f.tensor_parallel
    if f.replicas_per_instance * tp <= it.shards:
        return []
    unit = "NeuronCores" if it.accelerator.vendor == "aws-neuron" else "GPUs"
    return [
        Issue(
            f"{at}.replicas_per_instance",
            f"{f.replicas_per_instance} replicas x tensor_parallel {tp} need "
            f"{f.replicas_per_instance * tp} {unit}; {it.name} has {it.shards}",
        )
    ]


def _serving_stack_issues(at: str, f: Fleet, it: catalog.InstanceType) -> list[Issue]:
    """The stack runs on the accelerator, sets prefix caching only where it can, and its SDK,
    driver and image agree (catalog.host_stack_issues)."""
    issues: list[Issue] = []
    stack_ok = {"aws-neuron": {"vllm-neuron"}, "nvidia": {"vllm", "tensorrt-llm", "tgi"}}[it.accelerator.vendor]
    if f.serving.stack not in stack_ok:
        issues.append(
            Issue(
                f"{at}.serving.stack",
                f"{f.serving.stack} does not run on {it.accelerator.name}; use one of {sorted(stack_ok)}",
            )
        )
    pc = f.serving.prefix_caching
    if (
        pc is not None
        and f.serving.stack not in ("vllm", "vllm-neuron")
        and pc != catalog.PREFIX_CACHING_DEFAULT[f.serving.stack]
    ):
        issues.append(
            Issue(
                f"{at}.serving.prefix_caching",
                f"{f.serving.stack} is deployed with its default (prefix caching "
                f"{'on' if catalog.PREFIX_CACHING_DEFAULT[f.serving.stack] else 'off'}); only vLLM fleets can set it",
            )
        )
    for field, reason in catalog.host_stack_issues(
        it.accelerator.vendor, f.serving.sdk_version, f.serving.driver_version, f.serving.image
    ):
        issues.append(Issue(f"{at}.serving.{field}", reason))
    return issues


def _sequence_length_issues(at: str, f: Fleet, it: catalog.InstanceType, max_seq: int) -> list[Issue]:
    """max_model_len holds the request class; the buckets (Neuron needs them) reach max_model_len."""
    issues: list[Issue] = []
    if f.max_model_len < max_seq:
        issues.append(
            Issue(f"{at}.max_model_len", f"{f.max_model_len} is shorter than the request class ({max_seq} tokens)")
        )
    if f.sequence_buckets:
        if list(f.sequence_buckets) != sorted(set(f.sequence_buckets)):
            issues.append(Issue(f"{at}.sequence_buckets", "must be strictly increasing"))
        elif f.sequence_buckets[-1] < f.max_model_len:
            issues.append(
                Issue(
                    f"{at}.sequence_buckets",
                    f"largest bucket {f.sequence_buckets[-1]} < max_model_len {f.max_model_len}",
                )
            )
    elif it.accelerator.vendor == "aws-neuron":
        issues.append(Issue(f"{at}.sequence_buckets", "Neuron compiles per sequence bucket; list them"))
    return issues


def _calibration_issues(at: str, f: Fleet, it: catalog.InstanceType) -> list[Issue]:
    cal = f.efficiency.calibration
    if cal is None:
        return []
    try:
        group = catalog.calibrated_efficiency(cal)
    except KeyError as exc:
        return [Issue(f"{at}.efficiency.calibration", str(exc.args[0]))]
    if group.vendor != it.accelerator.vendor:
        return [
            Issue(
                f"{at}.efficiency.calibration",
                f"{cal!r} was fitted on {group.vendor} rows, not {it.accelerator.name}",
            )
        ]
    return []


def _fit_issues(m: Manifest, at: str, f: Fleet, it: catalog.InstanceType) -> list[Issue]:
    ft = fit(m, f)
    if ft.fits:
        return []
    return [
        Issue(
            at,
            f"model does not fit {it.name} at tensor_parallel={f.tensor_parallel}: weights {ft.weights_gib:.1f} GiB + "
            f"KV cache {ft.kv_cache_gib:.1f} GiB ({f.max_concurrency} seqs x {f.max_model_len} tokens) + "
            f"reserve {ft.reserve_gib:.1f} GiB = {ft.needed_gib:.1f} GiB > {ft.visible_gib:.1f} GiB visible",
        )
    ]


def _availability_zone_issues(m: Manifest, at: str, f: Fleet) -> list[Issue]:
    issues: list[Issue] = []
    azs = f.availability_zones
    if len(set(azs)) != len(azs):
        issues.append(Issue(f"{at}.availability_zones", "listed twice"))
    if f.redundancy > 0 and len(set(azs)) < 2:
        issues.append(
            Issue(
                f"{at}.availability_zones",
                f"redundancy {f.redundancy} asks for at least two AZs, got {len(set(azs))}",
            )
        )
    for j, az in enumerate(azs):
        if not re.fullmatch(re.escape(m.costs.region) + r"[a-z]", az):
            issues.append(Issue(f"{at}.availability_zones[{j}]", f"{az!r} is not an AZ of region {m.costs.region}"))
    return issues


def _file_issues(m: Manifest) -> list[Issue]:
    """The trace exists and matches its pinned hash; the tokenizer's files likewise."""
    issues: list[Issue] = []
    tp_path = m.trace_path
    if not tp_path.is_file():
        issues.append(Issue("workload.trace.path", f"no such file: {tp_path}"))
    elif m.workload.trace.sha256:
        got = file_sha256(tp_path)
        if got != m.workload.trace.sha256:
            issues.append(
                Issue("workload.trace.sha256", f"file hash {got} does not match the pinned {m.workload.trace.sha256}")
            )
    return issues + tokenizer_file_issues(m)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tokenizer_file_issues(m: Manifest) -> list[Issue]:
    """The tokenizer's files are there with their pinned hashes, and the manifest's chat template
    (when it gives one) is the checkpoint's."""
    t, d = m.tokenizer, m.tokenizer_dir
    if d is None:
        return []
    if not t.files:
        path = m.resolve_path(t.path or "")
        return [] if path.is_file() else [Issue("tokenizer.path", f"no such file: {path}")]
    issues = [i for name, want in sorted(t.files.items()) if (i := _pinned_file_issue(d / name, name, want))]
    if issues:
        return issues
    if CHAT_TEMPLATE_FILE not in t.files and (d / CHAT_TEMPLATE_FILE).is_file():
        return [
            Issue(
                "tokenizer.files",
                f"{d / CHAT_TEMPLATE_FILE} is not pinned: the server reads its chat template from that file "
                f"before {TOKENIZER_CONFIG}; pin it",
            )
        ]
    found = checkpoint_chat_template(m)
    if isinstance(found, Issue):
        return [found]
    source, template = found
    if t.chat_template is not None and t.chat_template != template:
        return [
            Issue(
                "tokenizer.chat_template",
                f"differs from the checkpoint's template in {source} (the one the server renders with); "
                "leave chat_template out to use the checkpoint's, or pin the files it comes from",
            )
        ]
    return []


def _pinned_file_issue(path: Path, name: str, want: str) -> Issue | None:
    if not path.is_file():
        return Issue(f"tokenizer.files.{name}", f"no such file: {path}")
    got = file_sha256(path)
    if got != want:
        return Issue(f"tokenizer.files.{name}", f"{path} has sha256 {got}, the manifest pins {want}")
    return None


def checkpoint_chat_template(m: Manifest) -> tuple[str, str] | Issue:
    """(the pinned file it comes from, the template) as the server loads it: chat_template.jinja
    when pinned, else tokenizer_config.json's "chat_template" (a string, or named templates of
    which transformers renders "default" when no tools are given)."""
    d = m.tokenizer_dir
    if d is None or not m.tokenizer.files:
        return Issue(
            "tokenizer.chat_template", "not given, and no pinned checkpoint files (tokenizer.files) to read it from"
        )
    if CHAT_TEMPLATE_FILE in m.tokenizer.files:
        try:
            return CHAT_TEMPLATE_FILE, (d / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            return Issue(f"tokenizer.files.{CHAT_TEMPLATE_FILE}", f"cannot read {d / CHAT_TEMPLATE_FILE}: {exc}")
    where = f"tokenizer.files.{TOKENIZER_CONFIG}"
    try:
        config = json.loads((d / TOKENIZER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return Issue(where, f"cannot read {d / TOKENIZER_CONFIG} as JSON: {exc}")
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):
        named = {e.get("name"): e.get("template") for e in template if isinstance(e, dict)}
        template = named.get("default")
    if not isinstance(template, str) or not template:
        return Issue(
            "tokenizer.chat_template",
            f'the checkpoint has no chat template ({d / TOKENIZER_CONFIG} has no "chat_template" string, '
            f"and no {CHAT_TEMPLATE_FILE} is pinned): the server could not render a chat prompt",
        )
    return TOKENIZER_CONFIG, template
