"""The one console script, `homelab-autoscaler`; subcommands are wired here as their parts land."""

from __future__ import annotations

import argparse
import sys

MISSING = {
    "run": "worker + provider + watchers in one process (issue 7)",
    "worker": "the Temporal worker (issue 4)",
    "provider": "the externalgrpc CloudProvider server (issue 6)",
    "watch": "the watchers and report writer (issue 5)",
    "dev": "embedded Temporal dev server plus `run` (issue 7)",
}


def main(argv: list[str] | None = None) -> int:
    """Parse the subcommand; until a role exists, say plainly that it is missing and fail."""
    parser = argparse.ArgumentParser(prog="homelab-autoscaler")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, what in MISSING.items():
        p = sub.add_parser(name, help=what)
        p.add_argument("--simulate", action="store_true", help="use the simulated homelab")
    args = parser.parse_args(argv)
    print(
        f"homelab-autoscaler {args.command}: not built yet — {MISSING[args.command]}. "
        "See the open issues for what is missing.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
