"""The flags of `homelab-autoscaler provider` (and `python -m provider`), mapped onto `ProviderSettings`.

The console script's `provider` subcommand calls `add_arguments(subparser)`, then `settings_from_args(args)`
and `asyncio.run(provider.server.serve(settings))`.
"""

from __future__ import annotations

import argparse
from typing import Any

from provider.settings import ProviderSettings

FLAGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("--address", "provider_address", {"help": "host:port to listen on (default 127.0.0.1:8086)"}),
    ("--tls-cert", "tls_cert", {"help": "server certificate (PEM); mTLS with --tls-key and --tls-ca"}),
    ("--tls-key", "tls_key", {"help": "server private key (PEM)"}),
    ("--tls-ca", "tls_ca", {"help": "CA (PEM) that signs cluster-autoscaler's client certificate"}),
    ("--insecure", "insecure", {"action": "store_true", "default": None, "help": "allow plaintext off loopback"}),
    ("--namespaces", "namespaces", {"help": "comma-separated namespaces whose Groups are served"}),
    ("--gpu-label", "gpu_label", {"help": "node label whose value is the GPU type"}),
    ("--gpu-types", "gpu_types", {"help": "comma-separated GPU types"}),
    ("--pricing-window-seconds", "pricing_window_seconds", {"type": float}),
    ("--rpc-timeout-seconds", "rpc_timeout_seconds", {"type": float}),
    ("--temporal-address", "temporal_address", {}),
    ("--temporal-namespace", "temporal_namespace", {}),
    ("--task-queue", "task_queue", {}),
    ("--kube-server", "kube_server", {}),
    ("--kubeconfig", "kubeconfig", {}),
    ("--kube-context", "kube_context", {}),
    ("--log-level", "log_level", {}),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, dest, extra in FLAGS:
        parser.add_argument(flag, dest=dest, **extra)


def settings_from_args(args: argparse.Namespace) -> ProviderSettings:
    """Flags given on the command line win; the rest come from HOMELAB_AUTOSCALER_* and the defaults."""
    given = {k: v for k, v in vars(args).items() if k in ProviderSettings.model_fields and v is not None}
    return ProviderSettings(**given)
