"""`python -m provider`: the provider alone, with the flags `homelab-autoscaler provider` takes."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from pydantic import ValidationError

from provider.cli import add_arguments, settings_from_args
from provider.server import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="homelab-autoscaler provider", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(map(str, first["loc"])) or "settings"
        print(f"homelab-autoscaler provider: bad setting {where}: {first['msg']}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
