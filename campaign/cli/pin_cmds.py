"""CLI subcommand `pin`: resolve a manifest's weight and tokenizer hashes and image digests, and write them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from campaign.cli.help import MANIFEST_HELP
from core.errors import EXIT_OK, BadArgument


def cmd_pin(args: argparse.Namespace) -> int:
    from campaign.pin.pin import pin_manifest

    source = Path(args.manifest)
    out = Path(args.out) if args.out else source
    if out.resolve().parent != source.resolve().parent:
        # The manifest's paths (trace, tokenizer) are relative to its own directory.
        raise BadArgument(f"--out {out}: write it beside {source} (its paths are relative to its directory)")
    pinned = pin_manifest(source, out, update=args.update)
    for note in pinned.notes:
        print(note)
    if pinned.diff:
        sys.stdout.write(pinned.diff)
    else:
        print(f"{out}: already pinned; nothing changed")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "pin",
        help="resolve at model.commit what a cloud deploy needs pinned: weight and tokenizer file hashes from the "
        "Hugging Face Hub (HF_ENDPOINT, HF_TOKEN; no weight is downloaded), the tokenizer files themselves and the "
        "chat template, each image tag's digest from its registry; write them and print the diff",
    )
    p.add_argument("manifest", help=MANIFEST_HELP)
    p.add_argument(
        "--out",
        metavar="FILE",
        help="write the pinned manifest here, beside MANIFEST (default: MANIFEST itself, edited in place)",
    )
    p.add_argument(
        "--update",
        action="store_true",
        help="pin an image tag's current digest even where a different real digest is pinned (without it, refused)",
    )
    p.set_defaults(handler=cmd_pin)
