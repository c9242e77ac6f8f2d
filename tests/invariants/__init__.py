"""Invariants the figures must keep whatever the inputs: money adds up, a plan is the sum of its parts.

Property tests here run under INVARIANT: derandomized (the same examples on every run, so a
failure reproduces) and few, so that each test adds seconds, not minutes."""

from __future__ import annotations

from hypothesis import settings

INVARIANT = settings(derandomize=True, max_examples=25, deadline=None, database=None)
