"""The one console script, `homelab-autoscaler`: each subcommand is a role of the operator or a tool for people.

Every setting is a flag (`--temporal-address`), an environment variable (`HOMELAB_AUTOSCALER_TEMPORAL_ADDRESS`)
or a key of the optional YAML file (`--config`), in that order of precedence; a bad one stops the process with
one clear line.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from homelab_autoscaler.settings import Settings, load_settings


def _is_bool(annotation: Any) -> bool:
    return annotation is bool or (
        isinstance(annotation, types.UnionType | typing._UnionGenericAlias)  # type: ignore[attr-defined]
        and bool in typing.get_args(annotation)
    )


def add_setting_flags(parser: argparse.ArgumentParser, model: type[Settings]) -> None:
    """One flag per setting, named after it; values are validated by the settings model, not by argparse."""
    group = parser.add_argument_group("settings (also HOMELAB_AUTOSCALER_<NAME> or keys of --config)")
    group.add_argument("--config", type=Path, default=None, help="YAML file of settings (lowest precedence)")
    for name, field in model.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = field.description or name.replace("_", " ")
        if _is_bool(field.annotation):
            group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            group.add_argument(flag, dest=name, default=None, metavar=name.upper(), help=help_text)


def settings_from(args: argparse.Namespace, model: type[Settings]) -> Settings:
    flags = {k: v for k, v in vars(args).items() if k in model.model_fields and v is not None}
    config = args.config or (
        Path(os.environ["HOMELAB_AUTOSCALER_CONFIG"]) if os.environ.get("HOMELAB_AUTOSCALER_CONFIG") else None
    )
    return load_settings(model, flags, config)


def _models() -> dict[str, type[Settings]]:
    from homelab_autoscaler.roles import DevSettings, RunSettings
    from provider.settings import ProviderSettings
    from watchers.settings import WatchSettings

    return {
        "run": RunSettings,
        "worker": Settings,
        "provider": ProviderSettings,
        "watch": WatchSettings,
        "dev": DevSettings,
        "claims": Settings,
    }


ROLES = {
    "run": "worker + provider + watchers in one process (the homelab default)",
    "worker": "the Temporal worker: every workflow and activity on one task queue",
    "provider": "the externalgrpc CloudProvider server cluster-autoscaler calls",
    "watch": "the watchers (observations become signals) and the slot/group report writer",
    "dev": "an embedded Temporal server with its Web UI, then `run` (--simulate: no cluster needed)",
}


def build_parser() -> argparse.ArgumentParser:
    from homelab_autoscaler import autoscaler

    parser = argparse.ArgumentParser(prog="homelab-autoscaler", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    models = _models()
    for name, what in ROLES.items():
        add_setting_flags(sub.add_parser(name, help=what, description=what), models[name])
    claims = sub.add_parser("claims", help="claims from the terminal: list, show, reset-shutdown-streak")
    claims_sub = claims.add_subparsers(dest="claims_command", required=True)
    listing = claims_sub.add_parser("list", help="claims from Temporal visibility")
    listing.add_argument("--group")
    listing.add_argument("--slot")
    listing.add_argument("--phase", choices=["pending", "booting", "ready", "failed", "completed"])
    show = claims_sub.add_parser("show", help="a claim's timeline from its workflow history")
    show.add_argument("name")
    reset = claims_sub.add_parser("reset-shutdown-streak", help="let a paused scale-down fire again now")
    reset.add_argument("name")
    for p in (listing, show, reset):
        p.add_argument("--namespace", default="homelab-autoscaler-system", help="the claims' Kubernetes namespace")
        add_setting_flags(p, Settings)
    auto = sub.add_parser("autoscaler", help="call the provider exactly as cluster-autoscaler would")
    autoscaler.add_arguments(auto)
    return parser


async def _claims(args: argparse.Namespace, settings: Settings) -> int:
    from api import contracts as c
    from homelab_autoscaler import claims
    from homelab_autoscaler.temporal import connect

    client = await connect(settings)
    if args.claims_command == "list":
        rows = await claims.list_claims(client, group=args.group, slot=args.slot, phase=args.phase)
        print(claims.format_rows(rows))
        return 0
    handle = client.get_workflow_handle(c.claim_workflow_id(args.namespace, args.name))
    if args.claims_command == "show":
        print("\n".join(claims.timeline(await handle.fetch_history())))
        return 0
    before = await handle.execute_update("reset_shutdown_streak", result_type=int)
    print(f"claim {args.name}: shutdown streak reset (it had {before} attempts); the scale-down fires again now")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse, validate the settings, run the chosen role or tool."""
    args = build_parser().parse_args(argv)
    if args.command == "autoscaler":
        from homelab_autoscaler import autoscaler

        return autoscaler.main(args)
    try:
        settings = settings_from(args, _models()[args.command])
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        print(f"homelab-autoscaler: bad setting {where}: {first['msg']}", file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"homelab-autoscaler: {err}", file=sys.stderr)
        return 2
    from homelab_autoscaler import roles

    roles.setup_logging(settings)
    try:
        rc = _run(args, settings)
    except KeyboardInterrupt:
        rc = 130
    except (OSError, RuntimeError, TimeoutError) as err:
        print(f"homelab-autoscaler {args.command}: {err}", file=sys.stderr)
        rc = 1
    # A process that used a Temporal client can abort in interpreter teardown while the SDK's Rust threads still
    # run (PyGILState_Release, temporalio/sdk-python#300). Everything is stopped and flushed by now: skip it.
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(rc)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from homelab_autoscaler import roles

    if args.command == "claims":
        return asyncio.run(_claims(args, settings))
    if args.command in roles.ROLES:
        return asyncio.run(roles.run_command(args.command, settings))
    return asyncio.run(roles.dev_role(settings))  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main())
