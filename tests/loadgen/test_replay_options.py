"""One ReplayOptions, written onto Locust's command line by the launcher and parsed back by the
locustfile: every option survives the round trip, from flags and from the LOADGEN_* environment."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, fields

import configargparse
import pytest

from loadgen.replay_options import _FLAGS, ReplayOptions, add_arguments, from_namespace, to_argv
from tests.conftest import ROOT

CASES = [
    ReplayOptions(),
    ReplayOptions(api="completions", served_model="local/tiny", duration_s=2.5),
    ReplayOptions(rate_multiplier=0.354, slo_deadline=True, warmup=False, window_s=123.456789, tokenizer_check=False),
    ReplayOptions(rate_multiplier=0.5, slo_deadline=True, warmup=False, window_s=60.0, skip_s=240.5),
    ReplayOptions(resolver="http://127.0.0.1:8053/nlb"),
]


def _parse(argv: list[str]) -> ReplayOptions:
    parser = configargparse.ArgumentParser()
    add_arguments(parser.add_argument_group("loadgen"))
    return from_namespace(parser.parse_args(argv))


def test_every_option_has_one_flag() -> None:
    assert sorted(f.field for f in _FLAGS) == sorted(f.name for f in fields(ReplayOptions))
    assert len({f.flag for f in _FLAGS}) == len({f.env for f in _FLAGS}) == len(_FLAGS)


@pytest.mark.parametrize("options", CASES)
def test_round_trip_through_the_command_line(options: ReplayOptions) -> None:
    assert _parse(to_argv(options)) == options


def test_defaults_write_no_flag_and_non_defaults_only_theirs() -> None:
    assert to_argv(ReplayOptions()) == []
    assert to_argv(ReplayOptions(warmup=False, duration_s=3.0)) == ["--replay-duration", "3.0", "--no-warmup"]


def test_options_come_from_the_environment_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # What a cloud task sets (campaign run: LOADGEN_REPLAY_DURATION), read by the same declarations.
    monkeypatch.setenv("LOADGEN_REPLAY_DURATION", "30")
    monkeypatch.setenv("LOADGEN_NO_WARMUP", "true")
    monkeypatch.setenv("LOADGEN_API", "completions")
    monkeypatch.setenv("LOADGEN_RESOLVER", "http://127.0.0.1:8053/")  # an offline task's NLB DNS stand-in
    assert _parse([]) == ReplayOptions(
        api="completions", duration_s=30.0, warmup=False, resolver="http://127.0.0.1:8053/"
    )


def test_bad_values_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="rate_multiplier must be > 0"):
        ReplayOptions(rate_multiplier=0.0)
    with pytest.raises(ValueError, match="api: 'grpc'"):
        ReplayOptions(api="grpc")  # type: ignore[arg-type]


def test_the_locustfile_parses_what_the_launcher_writes() -> None:
    """Through Locust's own parser with the locustfile's options, in a fresh process (the
    locustfile registers event listeners on import)."""
    options = CASES[2]
    probe = (
        "import json, sys, dataclasses, loadgen.locustfile\n"
        "from locust.argument_parser import get_parser\n"
        "from loadgen.replay_options import from_namespace\n"
        "print(json.dumps(dataclasses.asdict(from_namespace(get_parser().parse_args(sys.argv[1:])))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, *to_argv(options)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == asdict(options)
