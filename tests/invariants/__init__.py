"""Invariants the figures must keep whatever the inputs: splitting a step, money, a plan's parts.

Property tests here run under INVARIANT, one of two profiles: `ci` (the default, what `make test`
runs: derandomized, the same examples on every run so a failure reproduces, and few, so each test
adds seconds) and `long` (INVARIANTS_PROFILE=long: many random examples; docs/testing.md says how
to run it). Set per test rather than loaded globally, so the other property tests keep theirs."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# each example writes and reads record files; the manifest fixture is read-only across examples
_SLOW = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
PROFILES = {
    "ci": settings(derandomize=True, max_examples=25, deadline=None, database=None, suppress_health_check=_SLOW),
    "long": settings(max_examples=400, deadline=None, database=None, suppress_health_check=_SLOW),
}
INVARIANT = PROFILES[os.environ.get("INVARIANTS_PROFILE", "ci")]
