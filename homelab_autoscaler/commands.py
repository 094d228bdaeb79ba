"""The commands that run roles, as the command line sees them: names, help and the settings sections each reads.

Apart from `roles` (which imports every role, the Temporal SDK and the Kubernetes client) so that `--help`, a bad
flag or `--version` answers without loading the operator: a second, not three, on the small boards it runs on.
"""

from __future__ import annotations

from dataclasses import dataclass

from homelab_autoscaler.settings import Settings

# The settings sections each role reads besides the process's own.
ROLE_SECTIONS: dict[str, tuple[str, ...]] = {
    "worker": ("queue", "worker"),
    "provider": ("queue", "namespaces", "provider"),
    "watch": ("queue", "namespaces", "watch"),
    "webhook": ("webhook",),
}

# What every process that runs roles reads: Temporal and the API server, its health and metrics, its logging.
PROCESS_SECTIONS = ("temporal", "kube", "health", "metrics", "logging")


@dataclass(frozen=True)
class CommandSpec:
    """A subcommand that runs roles in one process; it takes exactly the settings sections they read."""

    help: str
    roles: tuple[str, ...]

    @property
    def sections(self) -> tuple[str, ...]:
        wanted = {*PROCESS_SECTIONS, *(s for role in self.roles for s in ROLE_SECTIONS[role])}
        return tuple(name for name in Settings.model_fields if name in wanted)


# The commands that run roles, each in one process (run is the homelab default: all three on one client). The
# command line, its settings and docs/configuration.md are built from this table. The two servers the cluster
# calls go together: cluster-autoscaler calls the provider, the API server the webhook.
COMMANDS: dict[str, CommandSpec] = {
    "run": CommandSpec(
        "worker + provider + watchers (+ the admission webhook) in one process (the homelab default)",
        ("worker", "provider", "watch", "webhook"),
    ),
    "worker": CommandSpec("the Temporal worker: every workflow and activity on one task queue", ("worker",)),
    "provider": CommandSpec(
        "the externalgrpc CloudProvider server cluster-autoscaler calls (+ the NodeClaim admission webhook)",
        ("provider", "webhook"),
    ),
    "watch": CommandSpec("the watchers (observations become signals) and the slot/group report writer", ("watch",)),
}

# `dev` runs `run` on an embedded Temporal server of its own: no Temporal client settings, the dev section.
DEV_HELP = "an embedded Temporal server with its Web UI, then `run` (--simulate: no cluster needed)"
DEV_SECTIONS = tuple(
    name for name in Settings.model_fields if name == "dev" or (name in COMMANDS["run"].sections and name != "temporal")
)
