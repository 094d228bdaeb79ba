"""`homelab-autoscaler temporal-setup`, the bundled Temporal's setup step (the operator's init container), against a
real Temporal (the dev server) and the API emulator: what it creates, that a second run changes nothing, and that
what a user brought is kept."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from homelab_sim.emulator import EmulatorServer
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client

from api.contracts import SEARCH_ATTRIBUTES
from homelab_autoscaler.devserver import DevServer
from homelab_autoscaler.setup import PASSWORD_ALPHABET, PASSWORD_LENGTH
from tests.procs import BIN, ROOT, free_port

NS = "homelab-autoscaler-system"


def setup(*args: str, kube: str, address: str) -> subprocess.CompletedProcess[str]:
    cli = str(BIN / "homelab-autoscaler")
    return subprocess.run([cli, "temporal-setup", "--temporal-address", address, "--kube-server", kube, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip


def secret(emulator: EmulatorServer, name: str) -> dict[str, str] | None:
    try:
        with urllib.request.urlopen(f"{emulator.url}/api/v1/namespaces/{NS}/secrets/{name}", timeout=5) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise
    data = {k: base64.b64decode(v).decode() for k, v in (body.get("data") or {}).items()}
    return {**data, **(body.get("stringData") or {})}


async def described(address: str, namespace: str) -> tuple[float, set[str]]:
    client = await Client.connect(address, namespace=namespace)
    ns = await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))
    attrs = await client.operator_service.list_search_attributes(ListSearchAttributesRequest(namespace=namespace))
    return ns.config.workflow_execution_retention_ttl.ToTimedelta().total_seconds(), set(attrs.custom_attributes)


@pytest.mark.long
@pytest.mark.system
def test_the_setup_creates_once_keeps_what_exists_and_says_each_step(tmp_path: Path, emulator: EmulatorServer) -> None:
    server = DevServer(port=free_port(), ui_port=free_port(), headless=True, db_file=tmp_path / "temporal.db")
    with server:
        first = setup("--temporal-namespace", "homelab", "--retention", "3d", "--postgresql-secret", "pg",
                      "--secret-namespace", NS, kube=emulator.url, address=server.address)  # fmt: skip
        assert first.returncode == 0, first.stderr
        assert "Secret homelab-autoscaler-system/pg: created" in first.stdout, first.stdout
        assert "Temporal namespace homelab: registered, retention 3d" in first.stdout, first.stdout
        password = (secret(emulator, "pg") or {})["password"]
        assert len(password) == PASSWORD_LENGTH and set(password) <= set(PASSWORD_ALPHABET)
        retention, attrs = asyncio.run(described(server.address, "homelab"))
        assert retention == 3 * 86400 and set(SEARCH_ATTRIBUTES) <= attrs
        # Again, with another retention: nothing changes, and it says so.
        second = setup("--temporal-namespace", "homelab", "--retention", "1d", "--postgresql-secret", "pg",
                       "--secret-namespace", NS, kube=emulator.url, address=server.address)  # fmt: skip
        assert second.returncode == 0, second.stderr
        assert "pg: exists, kept" in second.stdout and "homelab: exists, kept" in second.stdout, second.stdout
        assert (secret(emulator, "pg") or {})["password"] == password
        assert asyncio.run(described(server.address, "homelab"))[0] == 3 * 86400
    # No Temporal: one line saying what it waited for, and how long.
    down = setup("--wait-seconds", "2", kube=emulator.url, address=f"127.0.0.1:{free_port()}")
    lines = down.stderr.splitlines()
    assert down.returncode == 2 and "Traceback" not in down.stderr, down.stderr
    assert "waiting up to 2 s" in lines[0] and "did not answer within 2 s" in lines[-1] and len(lines) == 2, lines


def test_a_bad_retention_is_refused_naming_the_option() -> None:
    done = subprocess.run([str(BIN / "homelab-autoscaler"), "temporal-setup", "--retention", "7 days"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "--retention" in done.stderr and "72h, 7d or 30m" in done.stderr, done.stderr
