"""The quality gate: the manifest's fixture prompts, greedy, against each fleet's endpoint.

A fleet that is cheaper but answers differently is not a migration target, so a failed gate
makes the decision Reject whatever the cost says. Each fixture is sent twice: greedy decoding
with a fixed seed must give the same text both times (API semantics), the token count must
match what was asked for, the finish reason and stop behaviour must be the expected ones, and
the text must satisfy the fixture's regex / JSON rule.

It lives with the load generator because a cloud campaign runs it inside the VPC, in a task of
the load-generator image (loadgen/gate_task.py): the fleets' NLB is internal.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from core.manifest import Manifest, QualityFixture
from core.serving import served_model_id

if TYPE_CHECKING:
    from openai import OpenAI


@dataclass
class FixtureResult:
    id: str
    passed: bool
    problems: list[str]
    finish_reason: str | None
    completion_tokens: int | None
    output: str = ""  # the first answer's text: the buyer's scorer reads it
    schema_ok: bool | None = None  # the fixture's regex / JSON rule held (None: the fixture has none)


@dataclass
class GateResult:
    fleet: str
    passed: bool
    pass_rate: float
    min_pass_rate: float
    fixtures: list[FixtureResult] = field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        return [f"{f.id}: {'; '.join(f.problems)}" for f in self.fixtures if not f.passed]

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["failures"] = self.failures
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GateResult:
        """The inverse of `as_dict` (a gate task's result, read back from S3)."""
        fixtures = [FixtureResult(**{k: v for k, v in f.items()}) for f in d["fixtures"]]
        return cls(str(d["fleet"]), bool(d["passed"]), float(d["pass_rate"]), float(d["min_pass_rate"]), fixtures)


def _ask(client: OpenAI, m: Manifest, model: str, fx: QualityFixture) -> tuple[str, str | None, int | None]:
    g = m.generation
    resp = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": fx.prompt}],
        max_tokens=fx.max_tokens,
        temperature=g.temperature,
        top_p=g.top_p,
        seed=g.seed,
        stop=list(g.stop) or None,
    )
    choice = resp.choices[0]
    tokens = resp.usage.completion_tokens if resp.usage else None
    return choice.message.content or "", choice.finish_reason, tokens


def check_fixture(client: OpenAI, m: Manifest, model: str, fx: QualityFixture) -> FixtureResult:
    """`model`: the id the fleet serves (core.serving.served_model_id)."""
    from openai import OpenAIError  # imported here: `openai` costs the CLI ~1 s at startup

    problems: list[str] = []
    try:
        text, finish, tokens = _ask(client, m, model, fx)
        again, _, _ = _ask(client, m, model, fx)
    except OpenAIError as exc:
        return FixtureResult(fx.id, False, [f"request failed: {exc}"], None, None)
    if text != again:
        problems.append("greedy decoding with a fixed seed gave two different answers")
    if tokens is None:
        problems.append("server reported no usage")
    elif finish == "length" and tokens != fx.max_tokens:
        problems.append(f"finish_reason length but {tokens} tokens for max_tokens {fx.max_tokens}")
    elif tokens > fx.max_tokens:
        problems.append(f"{tokens} tokens exceeds max_tokens {fx.max_tokens}")
    if fx.expect_finish_reason and finish != fx.expect_finish_reason:
        problems.append(f"finish_reason {finish!r}, expected {fx.expect_finish_reason!r}")
    for s in m.generation.stop:
        if s in text:
            problems.append(f"stop string {s!r} appears in the output")
    schema: list[str] = []
    if fx.expect_regex and not re.search(fx.expect_regex, text):
        schema.append(f"output does not match {fx.expect_regex!r}")
    if fx.expect_json:
        try:
            json.loads(text)
        except ValueError as exc:
            schema.append(f"output is not valid JSON: {exc}")
    problems += schema
    has_rule = bool(fx.expect_regex or fx.expect_json)
    return FixtureResult(fx.id, not problems, problems, finish, tokens, text, not schema if has_rule else None)


def run_gate(m: Manifest, fleet: str, base_url: str, timeout_s: float = 60.0) -> GateResult:
    from openai import OpenAI  # imported here: `openai` costs the CLI ~1 s at startup

    client = OpenAI(
        base_url=base_url.rstrip("/") + "/v1", api_key="not-needed-locally", timeout=timeout_s, max_retries=0
    )
    model = served_model_id(m, m.fleet(fleet))
    results = [check_fixture(client, m, model, fx) for fx in m.quality.fixtures]
    rate = sum(r.passed for r in results) / len(results)
    return GateResult(fleet, rate >= m.quality.min_pass_rate, rate, m.quality.min_pass_rate, results)
