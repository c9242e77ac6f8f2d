#!/usr/bin/env python3
"""CDK entry: `npx cdk synth -c manifest=manifests/<file>.yaml` (default: the example manifest)."""

from __future__ import annotations

import sys

from stacks.app_builder import build_app
from stacks.settings import SynthInputError


def main() -> int:
    try:
        app, _ = build_app()
    except SynthInputError as exc:
        print(f"cdk synth: {exc}", file=sys.stderr)
        return 2
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
