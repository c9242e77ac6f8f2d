"""A campaign's stages, written once for every backend: `run.run_stages` (gate, replay,
distribution checks, capacity, settle, report), the run directory, and the seams a backend
implements (`run.Fleets`, `capacity.StepRunner`).
"""
