"""The command line: `main` builds the parser from each command group's `register` (local_cmds,
report_cmds, aws_cmds); help texts shared by several groups live in `help`.
"""
