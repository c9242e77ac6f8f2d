"""Campaign: the frozen manifest, the catalog, the pinned prices and the `python -m campaign` CLI."""
