"""The install's doors, read from what `kubectl kustomize` renders (issue 43, part 3): every Pod of every install is
isolated both ways, and the door table (who may reach which port) is exactly the one docs/install.md states.
tests/netpol.py reads the policies as the API defines them; the real engine on the real node judges them too."""

from __future__ import annotations

from typing import Any

import pytest

from tests.netpol import Address, Pod, allowed, isolated
from tests.test_deploy import needs_kubectl, render

NS = "homelab-autoscaler-system"
WORKLOADS = ("Deployment", "StatefulSet", "Job", "CronJob")
INSTALLS = ["overlays/homelab", "overlays/dev-server", "overlays/homelab-mtls", "overlays/split",
            "overlays/temporal-cluster", "overlays/external-postgresql", "cluster-autoscaler/mtls", "kind"]  # fmt: skip

API_SERVER = Address("192.168.1.2")  # where the kubernetes Service leads: a node's address, no Pod
ELSEWHERE = Address("192.168.1.50")  # a machine on the LAN: a BMC, an external database


def _template(doc: dict[str, Any]) -> dict[str, Any]:
    spec = doc["spec"]
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    template: dict[str, Any] = spec["template"]
    return template


def pods(docs: list[dict[str, Any]]) -> dict[str, Pod]:
    """Each workload's Pod, by the workload's name: what its template's labels make it."""
    return {d["metadata"]["name"]: Pod(d["metadata"].get("namespace", NS), _template(d)["metadata"]["labels"])
            for d in docs if d["kind"] in WORKLOADS}  # fmt: skip


def policies(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "NetworkPolicy"]


INTRUDER = Pod("intruder", {"app": "curious"})  # another namespace, no certificate
STRANGER = Pod(NS, {"app": "curious"})  # the install's own namespace, but none of its Pods
AUTOSCALER = Pod(NS, {"app.kubernetes.io/name": "cluster-autoscaler"})
SCRAPER = Pod("monitoring", {"app": "prometheus"}, {"homelab-autoscaler.dev/metrics-scraper": "true"})


@needs_kubectl
@pytest.mark.parametrize("path", INSTALLS)
def test_every_pod_of_every_install_is_isolated_both_ways(path: str) -> None:
    """kube-score's and checkov's finding ("no NetworkPolicy"), for every Pod an install makes: a Pod that no
    policy isolates would take any connection and make any, whatever the rest say."""
    docs = render(path)
    found = pods(docs)
    assert found, f"deploy/{path} renders Pods"
    for name, pod in found.items():
        assert isolated(policies(docs), pod) == {"Ingress", "Egress"}, f"deploy/{path}: {name}'s Pod"


def _doors(docs: list[dict[str, Any]]) -> dict[str, tuple[Pod, int]]:
    p = pods(docs)
    doors = {"provider gRPC": (p["homelab-autoscaler"], 8086), "operator metrics": (p["homelab-autoscaler"], 9464)}
    if "temporal-server" in p:
        doors |= {"Temporal frontend": (p["temporal-server"], 7233), "Temporal metrics": (p["temporal-server"], 9090),
                  "Web UI": (p["temporal-web"], 8080), "PostgreSQL": (p["temporal-postgresql"], 5432)}  # fmt: skip
    return doors


def door_table(docs: list[dict[str, Any]], sources: dict[str, Pod]) -> set[tuple[str, str]]:
    """(source, door) for every door a source may open."""
    rules = policies(docs)
    return {(s, d) for s, src in sources.items() for d, (dst, port) in _doors(docs).items()
            if allowed(rules, src, dst, port)}  # fmt: skip


@needs_kubectl
def test_the_default_installs_doors_are_the_documented_ones() -> None:
    """Each door of overlays/homelab opens to exactly who docs/install.md says, and to nobody else: a Pod in another
    namespace, or one of the install's namespace that is none of its Pods, opens none."""
    docs = render("overlays/homelab")
    p = pods(docs)
    sources = {"intruder": INTRUDER, "stranger": STRANGER, "cluster-autoscaler": AUTOSCALER, "scraper": SCRAPER,
               "operator": p["homelab-autoscaler"], "Temporal server": p["temporal-server"],
               "Web UI": p["temporal-web"], "PostgreSQL": p["temporal-postgresql"],
               "certs": p["homelab-autoscaler-certs"]}  # fmt: skip
    assert door_table(docs, sources) == {
        ("cluster-autoscaler", "provider gRPC"),
        ("scraper", "operator metrics"),
        ("scraper", "Temporal metrics"),
        ("operator", "Temporal frontend"),
        ("Web UI", "Temporal frontend"),
        ("Temporal server", "PostgreSQL"),
    }


@needs_kubectl
def test_each_pod_goes_out_only_where_it_must() -> None:
    docs = render("overlays/homelab")
    rules, p = policies(docs), pods(docs)
    operator, server, pg, web, certs = (p[n] for n in ("homelab-autoscaler", "temporal-server", "temporal-postgresql",
                                                       "temporal-web", "homelab-autoscaler-certs"))  # fmt: skip
    for pod in (operator, certs):
        assert allowed(rules, pod, API_SERVER, 6443) and allowed(rules, pod, API_SERVER, 443)
        assert allowed(rules, pod, API_SERVER, 53, "UDP")
        assert not allowed(rules, pod, ELSEWHERE, 22) and not allowed(rules, pod, ELSEWHERE, 623, "UDP")
    assert not allowed(rules, certs, server, 7233), "the certs step has no business with Temporal"
    for pod in (server, web):
        assert allowed(rules, pod, API_SERVER, 53, "UDP") and not allowed(rules, pod, API_SERVER, 6443)
    assert not allowed(rules, server, ELSEWHERE, 5432), "the bundled server's database is the bundled PostgreSQL"
    assert not allowed(rules, pg, API_SERVER, 53, "UDP"), "PostgreSQL only answers"
    assert not allowed(rules, pg, ELSEWHERE, 443), "PostgreSQL only answers"
    assert not allowed(rules, web, pg, 5432) and not allowed(rules, operator, pg, 5432)


@needs_kubectl
def test_split_roles_are_closed_like_the_one_process() -> None:
    docs = render("overlays/split")
    rules, p = policies(docs), pods(docs)
    roles = [n for n, pod in p.items() if pod.labels.get("app.kubernetes.io/name") == "homelab-autoscaler"
             and pod.labels.get("app.kubernetes.io/component") != "certs"]  # fmt: skip
    assert len(roles) == 3, roles
    provider = next(pod for pod in p.values() if pod.labels.get("app.kubernetes.io/component") == "provider")
    assert allowed(rules, AUTOSCALER, provider, 8086) and not allowed(rules, INTRUDER, provider, 8086)
    for name in roles:
        assert allowed(rules, p[name], p["temporal-server"], 7233), name
        assert not allowed(rules, INTRUDER, p[name], 9464) and allowed(rules, SCRAPER, p[name], 9464), name


@needs_kubectl
def test_the_temporal_elsewhere_overlays_open_only_the_way_to_it() -> None:
    """An existing Temporal (temporal-cluster) is reached on its frontend's port wherever it is; an external
    PostgreSQL likewise on 5432, and the install then has no database of its own to open."""
    cluster = render("overlays/temporal-cluster")
    operator = pods(cluster)["homelab-autoscaler"]
    assert allowed(policies(cluster), operator, ELSEWHERE, 7233)
    assert not allowed(policies(cluster), operator, ELSEWHERE, 7234)
    external = render("overlays/external-postgresql")
    server = pods(external)["temporal-server"]
    assert allowed(policies(external), server, ELSEWHERE, 5432)
    assert not allowed(policies(external), server, ELSEWHERE, 22)
    assert "temporal-postgresql" not in {d["metadata"]["name"] for d in policies(external)}


@needs_kubectl
def test_the_dev_server_is_closed_too() -> None:
    docs = render("overlays/dev-server")
    rules, p = policies(docs), pods(docs)
    dev = p["temporal"]
    assert allowed(rules, p["homelab-autoscaler"], dev, 7233)
    for port in (7233, 8233):
        assert not allowed(rules, INTRUDER, dev, port) and not allowed(rules, STRANGER, dev, port), port
    assert not allowed(rules, dev, ELSEWHERE, 443), "the dev server calls nothing"


@needs_kubectl
def test_the_webhook_takes_the_api_server_and_cluster_autoscaler_reaches_only_the_provider() -> None:
    docs = render("overlays/homelab-mtls")
    rules, p = policies(docs), pods(docs)
    assert allowed(rules, API_SERVER, p["homelab-autoscaler"], 9443)
    autoscaler = render("cluster-autoscaler/mtls")
    ca = pods(autoscaler)["cluster-autoscaler"]
    both = policies(docs) + policies(autoscaler)
    assert allowed(both, ca, p["homelab-autoscaler"], 8086)
    assert allowed(both, ca, API_SERVER, 6443) and not allowed(both, ca, p["temporal-server"], 7233)
    assert not allowed(both, INTRUDER, ca, 8085) and allowed(both, SCRAPER, ca, 8085)


def test_the_model_reads_selectors_and_peers_as_the_api_defines_them() -> None:
    """The reader itself, against the API's own examples: no policy means open; a selected Pod is closed but for
    its rules; podSelector alone means the policy's namespace; both selectors in one peer mean AND."""
    a = Pod("a", {"role": "db"})
    client = Pod("b", {"role": "frontend"}, {"team": "web"})
    assert allowed([], client, a, 5432)
    policy: dict[str, Any] = {"metadata": {"namespace": "a"}, "spec": {"podSelector": {"matchLabels": {"role": "db"}},
                              "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "frontend"}}}],
                                           "ports": [{"port": 5432}]}]}}  # fmt: skip
    assert not allowed([policy], client, a, 5432), "podSelector alone is the policy's own namespace"
    assert allowed([policy], Pod("a", {"role": "frontend"}), a, 5432)
    assert not allowed([policy], Pod("a", {"role": "frontend"}), a, 5433)
    policy["spec"]["ingress"][0]["from"] = [{"namespaceSelector": {"matchLabels": {"team": "web"}},
                                             "podSelector": {"matchLabels": {"role": "frontend"}}}]  # fmt: skip
    assert allowed([policy], client, a, 5432)
    assert not allowed([policy], Pod("b", {"role": "other"}, {"team": "web"}), a, 5432)
    assert isolated([policy], a) == {"Ingress"} and allowed([policy], a, Address("10.0.0.1"), 1)
    policy["spec"]["ingress"][0]["from"] = [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}]
    assert allowed([policy], Address("10.2.0.1"), a, 5432) and not allowed([policy], Address("10.1.0.1"), a, 5432)
    assert not allowed([policy], client, a, 5432), "an ipBlock is never reckoned to match a Pod"
