"""`homelab-autoscaler worker` as people run it: a real process against a Temporal dev server and the
simulated homelab served over HTTP, driving a claim from IncreaseSize to ready."""

from __future__ import annotations

import asyncio
import re
import socket
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s
from temporalio.api.failure.v1 import Failure
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.testing import WorkflowEnvironment

from api import contracts as c
from homelab_autoscaler.devserver import DevServer
from homelab_autoscaler.temporal import CONNECT_ATTEMPT_SECONDS, DATA_CONVERTER, START_WAIT_SECONDS
from tests.procs import BIN, ROOT, free_port, port_open, process, wait_for
from workflows.group.workflow import GroupWorkflow

NS = "homelab-autoscaler-system"
SEARCH_ATTRIBUTES = [
    SearchAttributeKey.for_int(n) if kind == "Int" else SearchAttributeKey.for_keyword(n)
    for n, kind in c.SEARCH_ATTRIBUTES.items()
]


@pytest.fixture
async def dev_server() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(BIN / "temporal"),
        search_attributes=SEARCH_ATTRIBUTES,
        data_converter=DATA_CONVERTER,
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.mark.system
async def test_worker_process_drives_a_claim_to_ready(dev_server: WorkflowEnvironment, tmp_path: Path) -> None:
    port, metrics_port = free_port(), free_port()
    address = dev_server.client.service_client.config.target_host
    sim = [str(BIN / "python"), "-m", "homelab_sim", "--port", str(port), "--time-scale", "0"]
    worker = [str(BIN / "homelab-autoscaler"), "worker", "--temporal-address", address,
              "--kube-server", f"http://127.0.0.1:{port}",
              "--metrics-address", f"127.0.0.1:{metrics_port}", "--health-port", "0"]  # fmt: skip
    with process(sim, log=tmp_path / "sim.log"), process(worker, log=tmp_path / "worker.log") as proc:
        wait_for(lambda: port_open(port), timeout=20, what="the simulated homelab's API server")
        group = await dev_server.client.start_workflow(
            GroupWorkflow.run,
            args=[c.GroupRef(NS, "workers"), None],
            id=c.group_workflow_id(NS, "workers"),
            task_queue=c.TASK_QUEUE,
        )
        assert await group.execute_update(GroupWorkflow.increase_size, 2) == 2
        snap = await group.query(GroupWorkflow.snapshot)
        names = sorted(snap["claims"])
        assert len(names) == 2, names
        cfg = k8s.Configuration()
        cfg.host = f"http://127.0.0.1:{port}"
        statuses = []
        with k8s.ApiClient(cfg) as api:
            batch = k8s.BatchV1Api(api)
            for name in names:
                claim = dev_server.client.get_workflow_handle(c.claim_workflow_id(NS, name))
                # Stand in for the Job watcher (it arrives with the watchers): say the startup Job finished.
                for _ in range(100):
                    jobs = batch.list_namespaced_job(NS, label_selector=f"infra.homecluster.dev/nodeclaim={name}")
                    if jobs.items:
                        break
                    await asyncio.sleep(0.1)
                assert jobs.items, f"the worker created no startup Job for {name}"
                await claim.signal(c.ClaimSignal.JOB_FINISHED, c.JobFinished(f"{name}-startup", True))
                for _ in range(150):
                    status = await claim.query(c.ClaimQuery.STATUS)
                    if status["phase"] == "ready":
                        break
                    await asyncio.sleep(0.2)
                assert status["phase"] == "ready", status
                statuses.append(status)
        assert proc.poll() is None, (tmp_path / "worker.log").read_text()[-2000:]
        desc = await claim.describe()
        assert desc.typed_search_attributes.get(SearchAttributeKey.for_keyword(c.SA_PHASE)) == "ready"
        assert await desc.static_summary() == f"claim {name} for slot {status['slot']} in group workers, attempt 1"

        def scrape() -> str:
            # typeshed types urlopen's answer Any; an http URL's is an HTTPResponse, whose read() gives bytes
            body: bytes = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read()
            return body.decode()

        def ready_gauge(text: str) -> float | None:
            found = re.search(r"^homelab_claims\{([^}]*)\} (\S+)$", text, re.M)
            rows = [m for m in re.finditer(r"^homelab_claims\{([^}]*)\} (\S+)$", text, re.M) if 'phase="ready"' in m[1]]
            return float(rows[0][2]) if found and rows else None

        # The gauge follows every move (a claim's move wakes no loop pass of the group, so it is set on the signal).
        wait_for(lambda: ready_gauge(scrape()) == 2, timeout=10, what="homelab_claims{phase=ready} to read 2")
        metrics = scrape()
        assert re.search(rf'homelab_claims\{{[^}}]*kubernetes_namespace="{NS}"', metrics), metrics[:3000]
        assert re.search(r'homelab_claim_moves_total\{[^}]*group="workers",[^}]*phase="ready"', metrics), metrics[:3000]
        # Boots take minutes: the buckets reach half an hour instead of stopping at 10 s.
        assert re.search(r'homelab_claim_time_to_ready_seconds_bucket\{[^}]*le="1800"', metrics), metrics[:3000]
        assert re.search(r'homelab_claim_time_to_ready_seconds_bucket\{[^}]*le="60"', metrics)
        assert re.search(r'homelab_jobs_total\{[^}]*outcome="succeeded"[^}]*type="startup"', metrics)
        assert "temporal_workflow_completed_total" in metrics or "temporal_request_total" in metrics
        assert "service_name=" not in metrics


async def test_worker_refuses_to_start_without_search_attributes(tmp_path: Path) -> None:
    env = await WorkflowEnvironment.start_local(dev_server_existing_path=str(BIN / "temporal"))
    try:
        address = env.client.service_client.config.target_host
        worker = [
            str(BIN / "homelab-autoscaler"),
            "worker",
            "--temporal-address",
            address,
            "--kube-server",
            "http://127.0.0.1:9",
            # Ports of its own: the defaults (8081, 9464) may be held by another test of the run (pytest-xdist).
            "--health-port",
            "0",
            "--metrics-address",
            f"127.0.0.1:{free_port()}",
        ]
        with process(worker, log=tmp_path / "worker.log") as proc:
            assert await asyncio.to_thread(proc.wait, 60) == 2
        out = (tmp_path / "worker.log").read_text()
        assert "search attributes missing" in out and "temporal operator search-attribute create" in out
    finally:
        await env.shutdown()


@pytest.mark.parametrize("before", ["refused", "silent"])
@pytest.mark.system
def test_a_worker_started_before_its_temporal_waits_for_it(before: str, tmp_path: Path) -> None:
    """An install starts the operator's Pod and Temporal's at once: the operator waits for a Temporal that does not
    answer yet (saying so, with the reason) instead of exiting for the kubelet to restart it (the real node saw that
    restart at `helm install`), and works once Temporal is up. Before it is up, its address refuses, or answers
    nothing (a Service whose Pod is gone: one connect hung for over a minute on the real node), each try bounded."""
    temporal_port = free_port()
    silent = socket.socket()  # accepts connections (the kernel's backlog) and never says a word
    if before == "silent":
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        silent.bind(("127.0.0.1", temporal_port))
        silent.listen(16)
    worker = [str(BIN / "homelab-autoscaler"), "worker", "--temporal-address", f"127.0.0.1:{temporal_port}",
              "--kube-server", "http://127.0.0.1:9", "--health-port", "0",
              "--metrics-address", f"127.0.0.1:{free_port()}"]  # fmt: skip
    log = tmp_path / "worker.log"
    reason = {"refused": "Connection refused", "silent": f"no answer within {CONNECT_ATTEMPT_SECONDS:.0f} s"}[before]
    server = DevServer(port=temporal_port, ui_port=free_port(), headless=True, db_file=tmp_path / "temporal.db")
    with process(worker, log=log) as proc:
        wait_for(lambda: "does not answer yet" in log.read_text() or proc.poll() is not None, timeout=60,
                 what="the worker to say it waits for Temporal")  # fmt: skip
        assert proc.poll() is None, log.read_text()[-2000:]
        assert f"Temporal at 127.0.0.1:{temporal_port} does not answer yet ({reason})" in log.read_text()
        silent.close()
        with server:
            wait_for(lambda: "worker polling" in log.read_text() or proc.poll() is not None, timeout=60,
                     what="the worker to poll once Temporal is up")  # fmt: skip
            assert proc.poll() is None, log.read_text()[-2000:]
        assert f"Temporal at 127.0.0.1:{temporal_port} answers" in log.read_text()


def test_the_wait_for_temporal_fits_in_the_manifests_liveness_allowance() -> None:
    """The kubelet kills a container whose /healthz failed `failureThreshold` times in a row; a role waiting for
    Temporal serves no /healthz yet, so its wait must end before deploy/'s liveness probe would kill it."""
    (deployment,) = [d for d in yaml.safe_load_all((ROOT / "deploy" / "base" / "operator.yaml").read_text())
                     if d and d["kind"] == "Deployment"]  # fmt: skip
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]
    killed_after = probe["initialDelaySeconds"] + probe["periodSeconds"] * (probe["failureThreshold"] - 1)
    assert killed_after > START_WAIT_SECONDS


def test_a_bad_setting_is_one_clear_line(tmp_path: Path) -> None:
    import subprocess

    res = subprocess.run(
        [str(BIN / "homelab-autoscaler"), "worker", "--log-level", "LOUD"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0
    assert "log_level" in res.stderr


def test_an_expected_outcome_carries_no_stack_trace_and_a_crash_keeps_its_own() -> None:
    """The Web UI shows a failure's stack trace under its message: a claim that closes Failed (a benign application
    error) must not look like a crash of the operator, while an unexpected error keeps its trace."""

    def converted(category: ApplicationErrorCategory) -> Failure:
        failure = Failure()
        try:
            raise ApplicationError("StartupJobFailed: ...", type="StartupJobFailed", category=category)
        except ApplicationError as err:
            DATA_CONVERTER.failure_converter.to_failure(err, DATA_CONVERTER.payload_converter, failure)
        return failure

    expected = converted(ApplicationErrorCategory.BENIGN)
    assert expected.stack_trace == "" and expected.message == "StartupJobFailed: ..."
    assert expected.application_failure_info.type == "StartupJobFailed"
    assert "test_worker_process.py" in converted(ApplicationErrorCategory.UNSPECIFIED).stack_trace
