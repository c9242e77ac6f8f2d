"""The top layer: the `python -m campaign` / `inf2-vs-g6` CLI (cli), the plan (plan), the
backends the stages run on (backends), the stages themselves (stages) and the AWS helpers (aws);
docs/layout.md draws the layers."""
