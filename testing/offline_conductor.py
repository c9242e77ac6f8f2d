"""The conductor task in the offline cloud run: what the conductor definition's command runs
(`python -m campaign conduct RUN_ID [--resume]`, parsed by the CLI's own parser and run by its own
handler), with one substitution: its tasks are started by a testing.offline_tasks launcher over
the shared state directory, as moto's ECS starts no container.

    python -m testing.offline_conductor STATE_DIR conduct RUN_ID [--resume]
"""

from __future__ import annotations

import sys
from pathlib import Path

from campaign.cli.aws_cmds import cmd_conduct
from campaign.cli.main import build_parser
from core.errors import CampaignError
from testing.offline_tasks import LocalTaskLauncher

POLL_S = 1.0  # as testing.cloud_offline.run_once: the offline tasks start in a second, not a minute


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    state, command = Path(argv[0]), argv[1:]
    args = build_parser().parse_args(command)
    launcher = LocalTaskLauncher.from_state(state)
    try:
        return cmd_conduct(
            args, launcher=launcher, concurrent=launcher.concurrent, poll_s=POLL_S, stand_in=launcher.stand_in
        )
    except CampaignError as exc:  # as campaign.cli.main prints it: the run record says the rest
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        launcher.close()


if __name__ == "__main__":
    sys.exit(main())
