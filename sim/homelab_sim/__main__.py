"""``python -m homelab_sim [--homelab FILE]``: a simulated homelab over HTTP.

Serves the Kubernetes API emulator with the homelab seeded and its machines answering lifecycle Jobs, so the
operator (or kubectl) can be pointed at it with no cluster at all. Runs until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
from pathlib import Path

from homelab_sim.chaos import Chaos, ChaosSettings
from homelab_sim.emulator import UserInfo
from homelab_sim.homelab import HomelabServer
from homelab_sim.homelab_spec import HomelabSpecError, load_homelab_spec

DEFAULT_HOMELAB = Path(__file__).with_name("homelab.yaml")  # deploy/examples/homelab.yaml, as package data


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, serve the homelab, block until told to stop; the exit code says whether it started."""
    parser = argparse.ArgumentParser(prog="python -m homelab_sim", description=__doc__.splitlines()[0])
    parser.add_argument("--homelab", type=Path, default=DEFAULT_HOMELAB, help="homelab YAML file")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="multiply every delay of the file (0: all synchronous)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what every machine does")
    parser.add_argument("--check", action="store_true", help="only read the homelab file: exit 2 and say what is wrong")
    parser.add_argument(
        "--user",
        action="append",
        default=[],
        metavar="TOKEN=NAME",
        help="a bearer token and the user it names (webhooks see it); repeatable. No token: system:anonymous",
    )
    chaos = parser.add_argument_group("chaos (the chaos suite's knobs; all off by default)")
    chaos.add_argument("--chaos-seed", type=int, default=0, help="seed of the random faults")
    chaos.add_argument("--fault-rate", type=float, default=0.0, help="fraction of API requests that fail")
    chaos.add_argument("--slow-seconds", type=float, default=12.0, help="how slow a 'timeout' answer is")
    chaos.add_argument("--drop-watches-every", type=float, default=0.0, help="seconds between ends of every watch")
    chaos.add_argument("--compact-every", type=float, default=0.0, help="seconds between history compactions")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    if args.verbose:
        logging.getLogger("homelab_sim.homelab").setLevel(logging.INFO)
    try:
        spec = load_homelab_spec(args.homelab)
    except HomelabSpecError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    if args.check:
        return 0
    users: dict[str, UserInfo] = {}
    for given in args.user:
        token, _, name = str(given).partition("=")
        if not token or not name:
            print(f"error: --user {given}: expected TOKEN=NAME", file=sys.stderr)
            return 2
        users[token] = UserInfo(name)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    settings = ChaosSettings(
        seed=args.chaos_seed,
        fault_rate=args.fault_rate,
        slow_seconds=args.slow_seconds,
        drop_watches_every=args.drop_watches_every,
        compact_every=args.compact_every,
    )
    with HomelabServer(spec, port=args.port, host=args.host, time_scale=args.time_scale, users=users) as lab:
        lab.call(lambda homelab: Chaos(homelab.emulator, homelab, settings).install())
        slots = ", ".join(f"{slot.name} ({slot.group})" for slot in spec.slots)
        print(f"Simulated homelab serving the Kubernetes API on {lab.url}", flush=True)
        print(f"  namespace {spec.namespace}; slots: {slots}", flush=True)
        print(f"  KUBECONFIG=/dev/null kubectl --server {lab.url} get nodes.infra.homecluster.dev -A", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while not done.wait(0.5):
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
