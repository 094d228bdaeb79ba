"""Waiting for CustomResourceDefinitions to be served. `kubectl wait --for=condition=Established` right after an
apply fails at once ("status.conditions accessor error: <nil>") when the API server has not yet written the CRD's
status, which a loaded machine shows (`make e2e-real` failed on it), so the condition is polled instead."""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s

from tests.realcluster.cluster import Cluster, wait_until


def established(cluster: Cluster, *names: str, within: float = 60) -> None:
    """Every named CRD Established, within `within` seconds, or an AssertionError naming the ones that are not."""
    api: Any = k8s.ApiextensionsV1Api(cluster.admin)

    def waiting() -> list[str]:
        left = []
        for name in names:
            crd = api.read_custom_resource_definition(name)
            conditions = (crd.status.conditions if crd.status else None) or []
            if not any(c.type == "Established" and c.status == "True" for c in conditions):
                left.append(name)
        return left

    wait_until(f"the CRDs {', '.join(names)} Established", lambda: not waiting(), within=within)
