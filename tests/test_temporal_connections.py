"""The bundled Temporal's connection pools fit its PostgreSQL: each of the server's four services (frontend,
history, matching, worker) keeps its own pools of both datastores, so their sum at the most, and room for a backup
and a person's psql, must stay under PostgreSQL's max_connections (a burst once took every one of the 50 there
were). Read from deploy/components/temporal and the chart's copy, which tests/test_chart.py holds equal."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TEMPORAL = ROOT / "deploy" / "components" / "temporal"
HEADROOM = 10  # a pg_dumpall, a person's psql, the superuser's reserved slots (3)


def _server_config() -> str:
    for doc in yaml.safe_load_all((TEMPORAL / "temporal-server.yaml").read_text()):
        if doc and doc["kind"] == "ConfigMap":
            return str(doc["data"]["config.yaml"])
    raise AssertionError("temporal-server.yaml has no ConfigMap")


def _max_connections() -> int:
    for doc in yaml.safe_load_all((TEMPORAL / "temporal-postgresql.yaml").read_text()):
        if doc and doc["kind"] == "StatefulSet":
            args = doc["spec"]["template"]["spec"]["containers"][0]["args"]
            (value,) = [a.split("=", 1)[1] for a in args if a.startswith("max_connections=")]
            return int(value)
    raise AssertionError("temporal-postgresql.yaml has no StatefulSet")


def test_every_services_pools_at_their_most_fit_postgresqls_connections() -> None:
    config = _server_config()
    pools = [int(n) for n in re.findall(r"^\s+maxConns: (\d+)$", config, re.MULTILINE)]
    idle = [int(n) for n in re.findall(r"^\s+maxIdleConns: (\d+)$", config, re.MULTILINE)]
    services = re.findall(r"^  (frontend|history|matching|worker):$", config, re.MULTILINE)
    assert len(pools) == 2 and len(idle) == 2, "one pool per datastore (default, visibility)"
    assert sorted(services) == ["frontend", "history", "matching", "worker"], services
    assert all(i <= p for i, p in zip(idle, pools, strict=True)), "an idle pool larger than its pool"
    most = len(services) * sum(pools)
    assert most + HEADROOM <= _max_connections(), (
        f"{len(services)} services × {sum(pools)} connections = {most}, and {HEADROOM} to spare, exceed "
        f"max_connections={_max_connections()}"
    )


def test_the_charts_copy_has_the_same_pools() -> None:
    pools = re.compile(r"max(?:Idle)?Conns: \d+")
    chart = (ROOT / "charts" / "homelab-autoscaler" / "files" / "config.yaml").read_text()
    assert pools.findall(chart) == pools.findall(_server_config()), pools.findall(chart)
