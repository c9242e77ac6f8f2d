"""The top layer: the `python -m campaign` / `inf2-vs-g6` CLI and the orchestration that runs the stages in order."""
