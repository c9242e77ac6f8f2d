"""The options of one replay, defined once.

The launcher (`loadgen.launch.start_fleet`) takes a `ReplayOptions`, writes it onto Locust's
command line (`to_argv`); the locustfile declares the same flags, each also read from its
`LOADGEN_*` environment variable (what a cloud task sets: `add_arguments`), parses them back
(`from_namespace`) and hands the result to the replayer (`loadgen.replay.ReplayConfig.options`).
One table (`_FLAGS`) names each option's flag, environment variable and help.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

from core import cloud_contract as cc
from loadgen.prompts import Api
from loadgen.resolver import RESOLVER_ENV, check_resolver_url


@dataclass(frozen=True)
class ReplayOptions:
    api: Api = "chat"  # endpoint family
    served_model: str | None = (
        None  # the model name sent; None: the id the fleet's stack serves (core.serving.served_model_id)
    )
    duration_s: float | None = None  # stop sending after this many replay seconds; None: the whole schedule
    # Capacity steps: the same requests at rate x k (offsets / k), and each request abandoned once
    # it can no longer meet the per-request SLO (TTFT + output tokens x ITL after its scheduled
    # time), so an overloaded step ends within the SLO's own bound instead of draining a queue.
    rate_multiplier: float = 1.0
    slo_deadline: bool = False
    window_s: float | None = (
        None  # trace seconds replayed from the window's start (a capacity-search step); None: the manifest's
    )
    skip_s: float = (
        0.0  # trace seconds skipped at the window's start first (a settle segment: the requests after its step's)
    )
    warmup: bool = True  # False: no request is a warmup one (a capacity step on an already-warm server)
    tokenizer_check: bool = True  # ask the server's /tokenize to count sample prompts first
    # Where the host name's addresses come from: None, the system resolver (AWS: the NLB's DNS);
    # else an answer source on loopback standing in for it offline (loadgen/resolver.py).
    resolver: str | None = None

    def __post_init__(self) -> None:
        if self.api not in get_args(Api):
            raise ValueError(f"api: {self.api!r} is not one of {', '.join(get_args(Api))}")
        if not self.rate_multiplier > 0:
            raise ValueError(f"rate_multiplier must be > 0, got {self.rate_multiplier}")
        if self.skip_s < 0:
            raise ValueError(f"skip_s must be >= 0, got {self.skip_s}")
        if self.resolver is not None:
            check_resolver_url(self.resolver)


@dataclass(frozen=True)
class _Flag:
    field: str  # ReplayOptions field, also the argparse dest
    flag: str  # a boolean whose default is True is set False by its `--no-...` flag
    env: str
    help: str


_FLAGS = (
    _Flag("api", "--api", "LOADGEN_API", "endpoint family"),
    _Flag(
        "served_model",
        "--served-model",
        "LOADGEN_SERVED_MODEL",
        "model name sent (default: the id the fleet's serving stack lists at /v1/models)",
    ),
    _Flag(
        "duration_s",
        "--replay-duration",
        cc.ENV_REPLAY_DURATION,
        "stop sending after N replay seconds (0 = whole schedule)",
    ),
    _Flag(
        "rate_multiplier",
        "--rate-multiplier",
        "LOADGEN_RATE_MULTIPLIER",
        "capacity step: replay the same requests at rate x k (offsets / k)",
    ),
    _Flag(
        "slo_deadline",
        "--slo-deadline",
        "LOADGEN_SLO_DEADLINE",
        "capacity step: abandon a request once it can no longer meet the per-request SLO",
    ),
    _Flag(
        "window_s",
        "--window-s",
        "LOADGEN_WINDOW_S",
        "capacity-search step: replay this many trace seconds from the window's start (0 = the manifest's window)",
    ),
    _Flag(
        "skip_s",
        "--skip-s",
        "LOADGEN_SKIP_S",
        "settle segment: skip this many trace seconds at the window's start (the requests its step already replayed)",
    ),
    _Flag(
        "warmup",
        "--no-warmup",
        "LOADGEN_NO_WARMUP",
        "count every request (the server is already warm, e.g. a capacity step after the replay)",
    ),
    _Flag(
        "tokenizer_check",
        "--no-tokenizer-check",
        "LOADGEN_NO_TOKENIZER_CHECK",
        "do not ask the server's /tokenize to count sample prompts before the run",
    ),
    _Flag(
        "resolver",
        "--resolver",
        RESOLVER_ENV,
        "look the host name up at this loopback answer source (http://127.0.0.1:PORT/PATH, e.g. testing/nlb_dns.py) "
        "instead of the system resolver",
    ),
)
_TEXT = ("served_model", "resolver")  # optional strings: "" on the command line when unset
_DEFAULTS = ReplayOptions()


def add_arguments(group: Any) -> None:
    """Declare every option on Locust's (configargparse) parser group, with its environment variable.
    Unset optional numbers are 0 and an unset model name or resolver is "" on the command line:
    Locust's environment variables cannot carry "none"."""
    for f in _FLAGS:
        default = getattr(_DEFAULTS, f.field)
        kw: dict[str, Any] = {"dest": f.field, "env_var": f.env, "help": f.help}
        if isinstance(default, bool):
            group.add_argument(f.flag, action="store_true", default=False, **kw)
        elif f.field == "api":
            group.add_argument(f.flag, type=str, default=default, choices=list(get_args(Api)), **kw)
        elif f.field in _TEXT:
            group.add_argument(f.flag, type=str, default="", **kw)
        else:
            group.add_argument(f.flag, type=float, default=0.0 if default is None else default, **kw)


def to_argv(options: ReplayOptions) -> list[str]:
    """The command-line flags for `options`: only what differs from the defaults."""
    argv: list[str] = []
    for f in _FLAGS:
        value = getattr(options, f.field)
        if value == getattr(_DEFAULTS, f.field):
            continue
        if isinstance(value, bool):
            argv.append(f.flag)  # store_true: --slo-deadline sets True, --no-warmup sets warmup False
        else:
            argv += [f.flag, repr(value) if isinstance(value, float) else str(value)]
    return argv


def to_env(options: ReplayOptions) -> dict[str, str]:
    """The same options as environment variables (a cloud task's RunTask overrides): only what
    differs from the defaults; a boolean flag is set by "true" (configargparse's store_true)."""
    env: dict[str, str] = {}
    for f in _FLAGS:
        value = getattr(options, f.field)
        if value == getattr(_DEFAULTS, f.field):
            continue
        env[f.env] = "true" if isinstance(value, bool) else repr(value) if isinstance(value, float) else str(value)
    return env


def from_namespace(ns: Any) -> ReplayOptions:
    """The options Locust parsed (command line or environment); ValueError names a bad one."""
    values: dict[str, Any] = {}
    for f in _FLAGS:
        got = getattr(ns, f.field)
        default = getattr(_DEFAULTS, f.field)
        if isinstance(default, bool):
            values[f.field] = (not got) if default else bool(got)
        elif default is None:
            values[f.field] = got or None  # 0 / "": unset
        else:
            values[f.field] = got
    return ReplayOptions(**values)
