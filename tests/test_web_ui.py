"""The Temporal Web UI of the embedded dev server, in headless Chromium, showing the operator's claims (issue 7).

Real processes all the way: `DevServer` (the embedded `temporal server start-dev` with the operator's search
attributes), the simulated homelab over HTTP and `homelab-autoscaler worker`. The group `workers` of the example
homelab grows by three: worker-1 and worker-2 come up `ready`, worker-3 (its startup Job always fails) ends
`failed`. Chromium (Debian's package, driven over the DevTools Protocol by `tests/cdp.py`) then checks that the
list shows the claims, counts and filters the failed one, shows the phase and reason as columns, that a
`ClaimPhase` filter in the URL narrows it, and that a claim's page shows its outcome, its summary and its named
timers. Skipped only when Chromium is not installed; `.ci/run` installs it.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client as k8s
from temporalio.client import Client, WorkflowHandle

from api import contracts as c
from homelab_autoscaler.devserver import DevServer
from homelab_autoscaler.temporal import DATA_CONVERTER
from tests.cdp import Chromium, chromium_missing
from tests.procs import BIN, free_port, port_open, process, wait_for
from workflows.group.workflow import GroupWorkflow

MISSING = chromium_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

NS = "homelab-autoscaler-system"
GROUP = "workers"
UI_WAIT = 20.0

T = TypeVar("T")


@dataclass
class Claim:
    name: str
    slot: str
    phase: str

    @property
    def workflow_id(self) -> str:
        return c.claim_workflow_id(NS, self.name)


@dataclass
class Demo:
    server: DevServer
    client: Client
    claims: list[Claim]

    def by_phase(self, phase: str) -> list[Claim]:
        return [claim for claim in self.claims if claim.phase == phase]


async def until(check: Callable[[], Awaitable[T | None]], *, timeout: float, what: str, every: float = 0.2) -> T:
    """Await `check()` until it returns something truthy; fail saying `what` after `timeout` seconds."""
    end = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        await asyncio.sleep(every)


async def finish_startup_job(api: k8s.ApiClient, handle: WorkflowHandle[Any, Any], name: str) -> None:
    """Stand in for the Job watcher: wait for the claim's startup Job to end in the homelab, then signal it."""
    batch = k8s.BatchV1Api(api)
    selector = f"infra.homecluster.dev/nodeclaim={name}"

    async def ended() -> tuple[str, bool] | None:
        jobs = await asyncio.to_thread(batch.list_namespaced_job, NS, label_selector=selector)
        for job in jobs.items:
            if job.metadata and job.metadata.name and job.status and (job.status.succeeded or job.status.failed):
                return job.metadata.name, bool(job.status.succeeded)
        return None

    job, succeeded = await until(ended, timeout=20, what=f"the startup Job of claim {name} to end in the homelab")
    await handle.signal(c.ClaimSignal.JOB_FINISHED, c.JobFinished(job, succeeded))


@pytest.fixture
async def demo(tmp_path: Path) -> AsyncIterator[Demo]:
    """The demo's claims, settled: worker-1/worker-2 ready and worker-3 failed, with the servers still running."""
    port, metrics_port = free_port(), free_port()
    server = DevServer(
        ip="127.0.0.1",
        port=free_port(),
        ui_port=free_port(),
        db_file=tmp_path / "t.db",
        log_file=tmp_path / "temporal.log",
    )
    sim = [str(BIN / "python"), "-m", "homelab_sim", "--port", str(port), "--time-scale", "0"]
    with server, process(sim, log=tmp_path / "sim.log"):
        worker = [str(BIN / "homelab-autoscaler"), "worker", "--temporal-address", server.address,
                  "--kube-server", f"http://127.0.0.1:{port}",
                  "--metrics-address", f"127.0.0.1:{metrics_port}", "--health-port", "0"]  # fmt: skip
        with process(worker, log=tmp_path / "worker.log") as proc:
            wait_for(lambda: port_open(port), timeout=20, what="the simulated homelab's API server")
            client = await Client.connect(server.address, data_converter=DATA_CONVERTER)
            group = await client.start_workflow(
                GroupWorkflow.run,
                args=[c.GroupRef(NS, GROUP), None],
                id=c.group_workflow_id(NS, GROUP),
                task_queue=c.TASK_QUEUE,
            )
            assert await group.execute_update(GroupWorkflow.increase_size, 3) == 3
            names = list((await group.query(GroupWorkflow.snapshot))["claims"])
            assert len(names) == 3, names
            handles = {name: client.get_workflow_handle(c.claim_workflow_id(NS, name)) for name in names}
            cfg = k8s.Configuration()
            cfg.host = f"http://127.0.0.1:{port}"
            with k8s.ApiClient(cfg) as api:
                await asyncio.gather(*(finish_startup_job(api, handles[n], n) for n in names))

            async def settled() -> list[dict[str, Any]] | None:
                statuses = [await handles[n].query(c.ClaimQuery.STATUS) for n in names]
                return statuses if all(s["phase"] in ("ready", "failed") for s in statuses) else None

            statuses = await until(settled, timeout=30, what="all three claims ready or failed")
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()[-2000:]
            claims = [Claim(n, s["slot"], s["phase"]) for n, s in zip(names, statuses, strict=True)]
            phases = sorted((cl.slot, cl.phase) for cl in claims)
            assert phases == [("worker-1", "ready"), ("worker-2", "ready"), ("worker-3", "failed")], phases
            yield Demo(server, client, claims)


def list_url(server: DevServer, query: str | None = None) -> str:
    """The UI's workflow list, optionally filtered by a visibility query (the UI 2.x `?query=` parameter)."""
    url = f"{server.ui_url}/namespaces/default/workflows"
    return url if query is None else f"{url}?query={urllib.parse.quote(query, safe='')}"


def workflow_url(server: DevServer, workflow_id: str, tail: str = "") -> str:
    """A workflow's page (its latest run's timeline), or a tab of one run with `tail` such as `/<run>/history`."""
    return f"{server.ui_url}/namespaces/default/workflows/{urllib.parse.quote(workflow_id, safe='')}{tail}"


def listed(text: str) -> set[str]:
    """The operator's workflow ids in a list page's rows (the checkbox labels spell `/` as `&#x2F;`: not matched)."""
    return set(re.findall(rf"(?:nodeclaim|group)/{NS}/[\w.-]+", text))


async def timer_summaries(handle: WorkflowHandle[Any, Any]) -> set[str]:
    """The summaries the workflow gave its timers (TimerStarted user metadata), as recorded in its history."""
    converter = DATA_CONVERTER.payload_converter
    history = await handle.fetch_history()
    return {
        converter.from_payload(e.user_metadata.summary, str)
        for e in history.events
        if e.HasField("timer_started_event_attributes") and e.user_metadata.HasField("summary")
    }


@pytest.mark.long
@pytest.mark.system
async def test_web_ui_lists_filters_and_shows_the_claims(demo: Demo, tmp_path: Path) -> None:
    ready, failed = demo.by_phase("ready"), demo.by_phase("failed")
    group_id = c.group_workflow_id(NS, GROUP)
    claim = ready[0]
    handle = demo.client.get_workflow_handle(claim.workflow_id)
    run_id = (await handle.describe()).run_id
    # The claim is ready once its resource says so; the workflow task that then starts its liveness timer may
    # still be on its way (a loaded machine): wait for it, bounded.
    timers: set[str] = set()
    for _ in range(60):
        timers = await timer_summaries(handle)
        if timers:
            break
        await asyncio.sleep(0.5)
    assert timers, f"no named timer in the history of {claim.workflow_id} after 30 s"

    async with Chromium(log=tmp_path / "chromium.log") as browser:
        page = await browser.new_page()

        # The list: the group and every claim, whatever its phase.
        await page.navigate(list_url(demo.server))
        everything = {group_id, *(cl.workflow_id for cl in demo.claims)}
        await page.wait_for_text(
            lambda t: everything <= listed(t), timeout=UI_WAIT, what=f"the workflow list with {sorted(everything)}"
        )
        await page.screenshot(tmp_path / "list.png")

        # A ClaimPhase filter (given in the URL, shown as a filter chip) narrows the list to that phase.
        for phase, expected in (("ready", ready), ("failed", failed)):
            await page.navigate(list_url(demo.server, f'ClaimPhase="{phase}"'))
            ids = {cl.workflow_id for cl in expected}

            def filtered(text: str, phase: str = phase, ids: set[str] = ids) -> bool:
                return f'ClaimPhase = "{phase}"' in text and listed(text) == ids

            await page.wait_for_text(
                filtered,
                timeout=UI_WAIT,
                what=f"the list filtered by ClaimPhase={phase!r} showing exactly {sorted(ids)}",
            )
            await page.screenshot(tmp_path / f"list-{phase}.png")

        # Failed claims close Failed: the header counts them, and its filter lists exactly them.
        await page.navigate(list_url(demo.server))
        await page.wait_for_text(
            lambda t: re.search(rf"\b{len(failed)} FAILED\b", t, re.I) is not None,
            timeout=UI_WAIT,
            what=f"the list's header counting {len(failed)} failed workflow(s)",
        )
        await page.navigate(list_url(demo.server, 'ExecutionStatus="Failed"'))
        await page.wait_for_text(
            lambda t: listed(t) == {cl.workflow_id for cl in failed},
            timeout=UI_WAIT,
            what=f"the Failed filter listing exactly {[cl.workflow_id for cl in failed]}",
        )

        # The phase and reason as columns of the list (Configure Columns, once per browser: docs/operations.md).
        await page.navigate(list_url(demo.server))
        await page.wait_for_text(lambda t: everything <= listed(t), timeout=UI_WAIT, what="the workflow list")
        assert await page.evaluate(
            "(() => { const b = Array.from(document.querySelectorAll('button'))"
            ".find(e => (e.getAttribute('aria-label') || '').includes('Configure Columns')); if (!b) return false;"
            " b.click(); return true; })()"
        ), "no Configure Columns button on the list"
        for attribute in ("ClaimPhase", "ClaimReason"):
            button = f'[data-testid="orderable-list-item-{attribute}-add-button"]'

            def offered(t: str, a: str = attribute) -> bool:
                return a in t

            await page.wait_for_text(offered, timeout=UI_WAIT, what=f"{attribute} offered")
            assert await page.evaluate(
                f"(() => {{ const b = document.querySelector('{button}');"
                " if (!b) return false; b.click(); return true; })()"
            ), f"no button adds the {attribute} column"
        await page.navigate(list_url(demo.server))

        def rows_say(text: str) -> bool:
            rows = {m.group(1): m.group(0) for m in re.finditer(rf"(nodeclaim/{NS}/[\w.-]+)\t[^\n]*", text)}
            return all(
                cl.workflow_id in rows
                and f"\t{cl.phase}" in rows[cl.workflow_id]
                and (cl.phase != "failed" or "\tStartupJobFailed" in rows[cl.workflow_id])
                for cl in demo.claims
            )

        await page.wait_for_text(rows_say, timeout=UI_WAIT, what="every claim's row showing its phase (and reason)")
        await page.screenshot(tmp_path / "list-columns.png")

        # A failed claim's first screen: FAILED, the reason leading the failure message, then the cause (the exit
        # code and reason of its startup Job's Pod) and where the Pod's last words are; no stack trace of the SDK,
        # and not the words themselves (they are kept out of histories).
        gone = failed[0]
        job = f"{gone.name}-startup"
        cause = f'"message": "StartupJobFailed: startup Job {job} failed: exit code 1 (Error). The Pod\'s last words '
        where = f"kubectl -n {NS} describe nodeclaim {gone.name}; its whole output: kubectl -n {NS} logs job/{job}"
        await page.navigate(workflow_url(demo.server, gone.workflow_id))
        shown = await page.wait_for_text(
            lambda t: gone.workflow_id in t and "FAILED" in t and cause in t and where in t,
            timeout=UI_WAIT,
            what=f"the page of {gone.workflow_id} showing FAILED, its reason, its cause and where its last words are",
        )
        await page.screenshot(tmp_path / "claim-failed.png")
        (tmp_path / "claim-failed.txt").write_text(shown)
        assert "stackTrace" not in shown and "_workflow_instance.py" not in shown, shown[:3000]
        assert "did not answer ping" not in shown, "the Pod's words are in the workflow's failure"

        # A claim's page: its timeline names the timers the workflow started (each as its own row) and its
        # Kubernetes calls (local activities, one row each, named by the call: `record_claim` for a move).
        await page.navigate(workflow_url(demo.server, claim.workflow_id))
        await page.wait_for_text(
            lambda t: (
                claim.workflow_id in t
                and timers | {c.Act.RECORD_CLAIM, c.Act.OPEN_GATE} <= {line.strip() for line in t.splitlines()}
            ),
            timeout=UI_WAIT,
            what=f"the timeline of {claim.workflow_id} naming its timers {sorted(timers)} and its calls",
        )
        named = min(timers)
        assert await page.scroll_to(named), f"no element shows {named!r}"
        await asyncio.sleep(0.5)  # let the scroll settle before the picture
        await page.screenshot(tmp_path / "claim-timeline.png")

        # Its event history gives each call its summary: the last move reads "record ready on claim ...".
        await page.navigate(workflow_url(demo.server, claim.workflow_id, f"/{run_id}/history"))
        await page.wait_for_text(
            lambda t: f"record ready on claim {claim.name}" in t and "Local Activity" in t,
            timeout=UI_WAIT,
            what=f"the event history of {claim.workflow_id} with its last move's summary",
        )

        # ... and its static summary, under User Metadata.
        summary = f"claim {claim.name} for slot {claim.slot} in group {GROUP}, attempt 1"
        await page.navigate(workflow_url(demo.server, claim.workflow_id, f"/{run_id}/user-metadata"))
        await page.wait_for_text(
            lambda t: summary in t, timeout=UI_WAIT, what=f"the summary {summary!r} of {claim.workflow_id}"
        )
        await page.screenshot(tmp_path / "claim-summary.png")
