"""The watchers against the lab: time-skipping Temporal with the real worker, the API emulator and the
simulated homelab. The watchers are driven with `Watchers.pump()` (drain every watch, handle what came), so
each step is deterministic; workflow time moves only with `lab.advance`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from homelab_sim.emulator import Fault
from homelab_sim.homelab import Homelab

from api import contracts as c
from kube.adapter import KUBELET_NODES, Kube
from kube.errors import NotFound
from kube.watch import MODIFIED, WatchEvent
from tests.lab import (
    NS,
    SECRET,
    WORDS,
    Lab,
    activity_results,
    failing_boot,
    history_text,
    homelab,
    open_lab,
    slot,
    status_if,
)
from watchers.main import Watchers
from watchers.signals import Signals

MIN = 60.0


@asynccontextmanager
async def watched(doc: dict[str, Any]) -> AsyncIterator[tuple[Lab, Watchers]]:
    """A lab with watchers on its emulator; the first pump lists everything and starts the group workflow."""
    async with open_lab(doc) as lab:
        w = Watchers(lab.kube, Signals(lab.client), namespaces=[NS])
        try:
            await w.pump()
            assert w.dispatcher.acting, "the watchers act once every watch listed"
            yield lab, w
        finally:
            w.close()


async def drive(lab: Lab, w: Watchers, check: Callable[[], Any], *, within: float, what: str, step: float = 5) -> Any:
    """Pump the watchers, then advance workflow time by `step`, until `check()` holds (at most `within` s)."""

    async def pumped() -> Any:
        await w.pump()
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        return got

    return await lab.until(pumped, within=within, step=step, what=what)


def heartbeat(value: str) -> Callable[[Homelab], Any]:
    """A lab call re-posting Node s1 with a new heartbeat annotation, nothing a decision reads."""
    return lambda h: h.emulator.patch_object(
        "v1", "nodes", None, "s1", {"metadata": {"annotations": {"heartbeat": value}}}
    )


def slot_status(lab: Lab, slot: str) -> dict[str, Any]:
    obj = lab.lab.call(lambda h: h.emulator.get_object("infra.homecluster.dev/v2alpha1", "nodes", NS, slot))
    assert obj is not None
    return dict(obj.get("status") or {})


def group_status(lab: Lab, group: str = "g") -> dict[str, Any]:
    obj = lab.lab.call(lambda h: h.emulator.get_object("infra.homecluster.dev/v2alpha1", "groups", NS, group))
    assert obj is not None
    return dict(obj.get("status") or {})


async def wait_group_loaded(lab: Lab, w: Watchers) -> None:
    async def loaded() -> bool:
        try:
            return bool((await lab.snapshot())["loaded"])
        except Exception:
            return False

    await drive(lab, w, loaded, within=30, step=1, what="the group workflow started by the watchers loaded")


async def ready_claim(lab: Lab, w: Watchers, slot: str = "s1") -> str:
    await wait_group_loaded(lab, w)
    assert await lab.increase(1) == 1
    (name,) = await lab.claim_names()
    await drive(lab, w, lambda: slot_status(lab, slot).get("phase") == "ready", within=5 * MIN, what="report ready")
    assert await lab.phase(name) == "ready"
    return name


# --- group workflows exist for every Group -----------------------------------------------------------------
async def test_group_workflow_started_for_every_group_and_reports_written() -> None:
    async with watched(homelab([{"name": "s1"}, {"name": "s2"}])) as (lab, w):
        await wait_group_loaded(lab, w)
        assert slot_status(lab, "s1")["phase"] == "off"
        assert slot_status(lab, "s1")["powerState"] == "off"
        reported = group_status(lab)
        conditions = {cond["type"]: cond["status"] for cond in reported.pop("conditions")}
        figures = reported.pop("usage")
        assert reported == {"slots": 2, "on": 0, "off": 2, "health": "healthy"}
        assert conditions == {"Valid": "True", "Healthy": "True"}
        assert (figures["boots"], figures["onSeconds"], figures["energySlots"]) == (0, 0, 0), figures


# --- adoption: installing the operator powers nothing off -------------------------------------------------
async def test_adoption_on_first_start_powers_nothing_off() -> None:
    async with watched(homelab([{"name": "s1", "initiallyOn": True}, {"name": "s2"}])) as (lab, w):
        await wait_group_loaded(lab, w)

        async def adopted() -> bool:
            claims = (await lab.snapshot())["claims"]
            return any(d["slot"] == "s1" and d["phase"] == "ready" for d in claims.values())

        await drive(lab, w, adopted, within=2 * MIN, what="s1 adopted with a ready claim")
        await drive(lab, w, lambda: slot_status(lab, "s1").get("phase") == "ready", within=MIN, what="report ready")
        for _ in range(6):  # a while longer: still nothing powers it off
            await w.pump()
            await lab.advance(30)
        assert lab.lab.power("s1") == "on"
        assert not [j for j in lab.jobs() if j["metadata"]["labels"].get("type") == "shutdown"]
        st = slot_status(lab, "s1")
        assert st["phase"] == "ready" and st["powerState"] == "on"
        assert st["lastClaim"]["call"] == "Adopted"
        assert slot_status(lab, "s2")["phase"] == "off"
        assert group_status(lab)["on"] == 1
        node = lab.node("s1")
        assert node is not None
        assert node["metadata"]["labels"]["infra.homecluster.dev/node"] == "s1"
        assert node["spec"]["providerID"] == f"homelab://{NS}/s1"


# --- debounce and ordering --------------------------------------------------------------------------------
async def test_ten_identical_kubelet_updates_make_one_signal() -> None:
    async with watched(homelab([{"name": "s1"}])) as (lab, w):
        name = await ready_claim(lab, w)
        await w.pump()
        wid = c.claim_workflow_id(NS, name)
        before = w.signals.count(c.ClaimSignal.OBSERVE, wid)
        for i in range(10):  # heartbeats: the kubelet re-posts its Ready condition, nothing a decision reads
            lab.lab.call(heartbeat(str(i)))
            await w.pump()
        assert w.signals.count(c.ClaimSignal.OBSERVE, wid) == before
        # Cordoned: the node is not usable, but a claim waits on power and the readiness gate only (a signal is a
        # workflow task), so it is not told.
        lab.lab.call(lambda h: h.emulator.patch_object("v1", "nodes", None, "s1", {"spec": {"unschedulable": True}}))
        await w.pump()
        assert w.signals.count(c.ClaimSignal.OBSERVE, wid) == before
        taint = {"key": "node.cilium.io/agent-not-ready", "effect": "NoExecute"}
        lab.lab.call(lambda h: h.emulator.patch_object("v1", "nodes", None, "s1", {"spec": {"taints": [taint]}}))
        for i in range(10):  # one real change (a readiness taint), then ten identical updates of the changed Node
            lab.lab.call(heartbeat(f"x{i}"))
            await w.pump()
        assert w.signals.count(c.ClaimSignal.OBSERVE, wid) == before + 1


async def test_a_boot_is_told_only_that_its_node_turned_ready() -> None:
    """A signal is a workflow task: a claim the group just booked is not told what the group was told before it
    (its seed carries it), nor that its node registered (its registration wait reads that); the open gate it is."""
    async with watched(homelab([{"name": "s1"}])) as (lab, w):
        name = await ready_claim(lab, w)
        assert w.signals.count(c.ClaimSignal.OBSERVE, c.claim_workflow_id(NS, name)) == 1


async def test_a_stale_observation_delivered_late_changes_nothing() -> None:
    async with watched(homelab([{"name": "s1"}])) as (lab, w):
        name = await ready_claim(lab, w)
        stale_node = lab.node("s1")
        assert stale_node is not None
        lab.lab.die("s1")  # the machine goes away: its Node turns Ready=Unknown
        await w.pump()
        held = (await lab.status(name))["observation"]
        assert held["power"] == "off"
        reports_before = w.writer.slot_writes
        # The watcher side: an older version of the Node arriving after a newer one is dropped, unsent.
        assert isinstance(w.signals, Signals)  # `watched` gives the watchers the real one
        sent_before, dropped_before = len(w.signals.sent), w.dispatcher.dropped_stale
        await w.dispatcher.handle(KUBELET_NODES, WatchEvent(MODIFIED, stale_node))
        assert w.dispatcher.dropped_stale == dropped_before + 1
        assert len(w.signals.sent) == sent_before
        assert w.writer.slot_writes == reports_before
        # The workflow side: an observation stamped before the one it holds is ignored.
        observed_at = w.dispatcher.sent[(NS, "s1")][1].observed_at
        assert observed_at is not None
        late = c.Observation(
            power="on", usable=True, exists=True, gate_open=True, observed_at=observed_at - timedelta(seconds=5)
        )
        await lab.claim(name).signal(c.ClaimSignal.OBSERVE, late)
        await lab.advance(1)
        assert (await lab.status(name))["observation"]["power"] == "off"
        assert slot_status(lab, "s1")["powerState"] == "off"


# --- hand deletion and hand-applied claims ----------------------------------------------------------------
async def test_kubectl_delete_nodeclaim_reverses_a_ready_machine() -> None:
    async with watched(homelab([{"name": "s1"}])) as (lab, w):
        name = await ready_claim(lab, w)
        assert lab.kube.delete_claim(NS, name)  # what `kubectl delete nodeclaim` sends
        res = lab.claim_resource(name)
        assert res is not None and res["metadata"].get("deletionTimestamp"), "the finalizer holds it"
        await w.pump()
        assert w.signals.count(c.ClaimSignal.MARK_FOR_DELETION, c.claim_workflow_id(NS, name)) == 1
        await drive(lab, w, lambda: lab.claim_resource(name) is None, within=10 * MIN, what="claim resource gone")
        # The resource may go between drive's pump and its check: the watchers see it gone at the next pump (a
        # loaded machine once read the slot's report a claim behind).
        await w.pump()
        st = await lab.status(name)
        assert (st["phase"], st["reason"]) == ("completed", "DeletedByHand")
        assert lab.lab.power("s1") == "off"
        report = slot_status(lab, "s1")
        assert report["phase"] == "off"
        assert report["lastClaim"]["name"] == name
        assert report["lastClaim"]["reason"] == "DeletedByHand"
        # powerOffNodePolicy Delete (the default): the claim ended with its machine verified off, so its Node goes.
        await drive(lab, w, lambda: lab.node("s1") is None, within=5 * MIN, what="kubelet Node deleted")


async def test_a_hand_deleted_claim_that_is_gone_before_its_slot_is_reported_still_ends_the_report() -> None:
    """Found on the real node (issue 31): the claim's end and its resource's removal came before the slot's report
    was written, and the writer, reading the slot's claims from then on, found none: the slot kept saying its claim
    was ready, and powerOffNodePolicy Delete never deleted the Node. The last claim to leave is remembered."""
    async with watched(homelab([{"name": "s1"}])) as (lab, w):
        name = await ready_claim(lab, w)
        held = Fault(
            match=lambda r: r.group == "infra.homecluster.dev" and r.plural == "nodes" and r.verb == "patch",
            status=503, reason="ServiceUnavailable", times=None,
        )  # fmt: skip
        lab.lab.emulator.faults.append(held)
        assert lab.kube.delete_claim(NS, name)
        await drive(lab, w, lambda: lab.claim_resource(name) is None, within=10 * MIN, what="claim resource gone")
        assert slot_status(lab, "s1")["lastClaim"]["phase"] == "ready", "no report was written meanwhile"
        lab.lab.emulator.faults.remove(held)
        await w.writer.everything(w.clock())  # the resync's pass: no event of the slot is left to bring one
        await drive(lab, w, lambda: lab.node("s1") is None, within=5 * MIN, what="kubelet Node deleted")
        report = slot_status(lab, "s1")
        assert (report["lastClaim"]["name"], report["lastClaim"]["phase"]) == (name, "completed"), report
        assert report["lastClaim"]["reason"] == "DeletedByHand" and report["phase"] == "off"


async def test_a_failed_boots_cause_is_on_the_slots_report_and_no_reload_or_edit_puts_its_words_in_a_history() -> None:
    """Issue 23: the slot's report carries the failed claim's message (exit code, reason, the Pod's last words); the
    group's reload reads the failed claim back, and a person edits its status: neither carries the words into a
    workflow history."""
    async with watched(homelab([failing_boot("s1")])) as (lab, w):
        await wait_group_loaded(lab, w)
        assert await lab.increase(1) == 1
        (name,) = await lab.claim_names()

        def failed() -> bool:
            return bool(slot_status(lab, "s1").get("lastClaim", {}).get("phase") == "failed")

        await drive(lab, w, failed, within=5 * MIN, what="the slot reporting its claim failed")
        message = slot_status(lab, "s1")["lastClaim"]["message"]
        assert f"{name}-startup failed: exit code 3 (Error)" in message and WORDS in message, message
        lab.lab.call(lambda h: h.emulator.patch_object(
            "infra.homecluster.dev/v2alpha1", "nodeclaims", NS, name, {"status": {"shutdownAttempts": 2}},
            subresource="status",
        ))  # fmt: skip
        await w.pump()
        await lab.group().signal(c.GroupSignal.REFRESH)

        async def reloaded() -> bool:  # a load of the group read the failed claim back, with its record
            history = await lab.group().fetch_history()
            loads = activity_results(history.events)
            return any(f'"{name}"' in load and '"StartupJobFailed"' in load for load in loads)

        await drive(lab, w, reloaded, within=5 * MIN, step=10, what="the group's reload reading the failed claim")
        texts = {h.workflow_id: history_text(h) for h in await lab.histories()}
        leaks = [wid for wid, text in texts.items() if SECRET in text or WORDS in text]
        assert not leaks, f"the Pod's words in the history of {leaks}"


async def test_hand_applied_second_claim_is_resolved_newest_wins() -> None:
    async with watched(homelab([{"name": "s1"}])) as (lab, w):
        first = await ready_claim(lab, w)
        older = lab.claim_resource(first)
        assert older is not None
        body = {
            "apiVersion": "infra.homecluster.dev/v2alpha1",
            "kind": "NodeClaim",
            "metadata": {"name": "by-hand", "namespace": NS},
            "spec": {"node": "s1", "group": "g", "requestedAt": "2099-01-01T00:00:00Z"},
        }
        lab.lab.call(lambda h: h.emulator.put_object("infra.homecluster.dev/v2alpha1", "nodeclaims", body, NS))

        async def resolved() -> bool:
            try:
                return (await lab.phase(first)) == "failed" and (await lab.phase("by-hand")) == "ready"
            except Exception:
                return False

        await drive(lab, w, resolved, within=5 * MIN, what="older superseded, newest ready")
        assert (await lab.status(first))["reason"] == "Superseded"
        assert lab.lab.power("s1") == "on", "the machine is handed over, not powered off"
        await drive(
            lab,
            w,
            lambda: slot_status(lab, "s1").get("lastClaim", {}).get("name") == "by-hand",
            within=MIN,
            what="lastClaim is the newest claim",
        )
        assert slot_status(lab, "s1")["phase"] == "ready"


# --- a dropped watch loses nothing ------------------------------------------------------------------------
async def test_a_watch_dropped_mid_boot_loses_nothing() -> None:
    doc = homelab([{"name": "s1", "faults": {"kubeletNeverReady": True}}])
    async with watched(doc) as (lab, w):
        await wait_group_loaded(lab, w)
        assert await lab.increase(1) == 1
        (name,) = await lab.claim_names()
        await drive(lab, w, lambda: slot_status(lab, "s1").get("phase") == "booting", within=2 * MIN, what="booting")
        # The Node watch's position falls out of the server's window while the kubelet turns Ready (a 410 on
        # resume), and the next watch request fails outright: both must end in a relist, not a lost change.
        nodes = next(s for s in w.sources if s.resource is KUBELET_NODES)
        lab.lab.set_fault("s1", "kubeletNeverReady", False)
        lab.lab.call(
            lambda h: setattr(h.emulator._logs[("", "v1", "nodes")], "dropped_upto", h.emulator.resource_version)
        )
        relists = nodes.watch.relists
        sent = w.signals.count(c.ClaimSignal.OBSERVE)
        lab.lab.emulator.faults.append(
            Fault(match=lambda r: r.verb == "watch" and r.plural == "nodes", status=500, times=1)
        )
        position = nodes.watch.resource_version
        assert await asyncio.to_thread(nodes.drain) == [], "the resume is refused: nothing arrives"
        assert (nodes.watch.relists, nodes.watch.resource_version) == (relists, position), "the position is kept"
        await w.pump()  # the next resume meets 410: relist, then every slot's observation once
        assert nodes.watch.relists == relists + 1
        assert w.signals.count(c.ClaimSignal.OBSERVE) > sent, "after the relist every slot's observation is sent again"
        await drive(lab, w, lambda: slot_status(lab, "s1").get("phase") == "ready", within=5 * MIN, what="ready")
        assert await lab.phase(name) == "ready"


# --- the one writer of Node.status: writes only on change -------------------------------------------------
def status_patches(lab: Lab, plural: str) -> int:
    return sum(
        1 for r in lab.lab.emulator.requests if r.plural == plural and r.verb == "patch" and r.subresource == "status"
    )


async def test_reports_are_written_only_on_change() -> None:
    async with watched(homelab([{"name": "s1"}])) as (lab, w):
        await ready_claim(lab, w)
        await w.pump()
        slots, groups = status_patches(lab, "nodes"), status_patches(lab, "groups")
        for i in range(5):
            lab.lab.call(heartbeat(str(i)))
            await w.pump()
        assert await w.writer.everything(w.clock()) == 0
        assert (status_patches(lab, "nodes"), status_patches(lab, "groups")) == (slots, groups)
        lab.lab.die("s1")
        await w.pump()
        assert status_patches(lab, "nodes") == slots + 1, "one change, one write"
        assert slot_status(lab, "s1")["powerState"] == "off"


# --- powerOffNodePolicy: Delete ---------------------------------------------------------------------------
async def test_power_off_node_policy_delete_removes_the_node_and_keeps_its_template() -> None:
    async with watched(homelab([{"name": "s1"}])) as (lab, w):
        name = await ready_claim(lab, w)
        await lab.group().execute_update(c.GroupUpdate.DELETE_NODES, ["s1"])
        await drive(lab, w, lambda: lab.node("s1") is None, within=10 * MIN, what="kubelet Node deleted")
        st = await lab.status(name)
        assert st["phase"] == "completed"
        template = slot_status(lab, "s1")["nodeTemplate"]
        assert template["capacity"]["cpu"] == "4"
        assert template["labels"]["infra.homecluster.dev/node"] == "s1"
        assert "node.kubernetes.io/unschedulable" not in {t["key"] for t in template.get("taints", [])}
        assert w.writer.deleted_nodes == ["s1"]
        assert slot_status(lab, "s1")["phase"] == "off"


async def test_a_node_whose_machine_came_back_before_it_was_deleted_is_kept() -> None:
    """A kubelet that re-posted its Node (NotReady, booting) is not silent: deleting it would lose the machine.

    A running kubelet never registers a deleted Node again, so the machine would stay on, out of every count.
    """
    async with watched(homelab([{"name": "s1"}])) as (lab, w):
        name = await ready_claim(lab, w)
        held = Fault(match=lambda r: r.plural == "nodes" and r.verb == "delete", status=503, reason="x", times=None)
        lab.lab.emulator.faults.append(held)
        await lab.group().execute_update(c.GroupUpdate.DELETE_NODES, ["s1"])
        await drive(
            lab,
            w,
            lambda: status_if(lab, name, lambda s: s["phase"] == "completed"),
            within=10 * MIN,
            what="claim completed",
        )
        lab.lab.emulator.faults.remove(held)
        lab.lab.set_fault("s1", "kubeletNeverReady", True)  # the kubelet has posted Ready=False, booting
        lab.lab.power_on_by_hand("s1")
        for _ in range(3):
            await w.pump()
            await lab.advance(30)
        assert lab.node("s1") is not None, "a booting machine's Node was deleted"
        before = slot_status(lab, "s1").get("recentTransitions") or []
        lab.lab.set_fault("s1", "kubeletNeverReady", False)

        def seen_on() -> bool:
            # No claim wants the machine, so its release may power it off again between two checks: a report that
            # moved to draining (on and unwanted) since is the machine seen on just as much as powerState on is.
            status = slot_status(lab, "s1")
            moved = [t for t in status.get("recentTransitions") or [] if t not in before]
            return status.get("powerState") == "on" or any(t.get("to") == "draining" for t in moved)

        await drive(lab, w, seen_on, within=5 * MIN, what="the machine seen on again")
        assert lab.node("s1") is not None and w.writer.deleted_nodes == []


async def test_kube_errors_are_typed_for_leases() -> None:
    # A Lease that does not exist is None, not an error: the elector creates it.
    async with open_lab(homelab([{"name": "s1"}])) as lab:
        kube: Kube = lab.kube
        assert kube.get_lease(NS, "nope") is None
        try:
            kube.patch_lease(NS, "nope", {"holderIdentity": "x"}, "1")
        except NotFound:
            pass
        else:
            raise AssertionError("patching a missing Lease is NotFound")


async def test_the_first_sync_makes_no_watch_a_real_api_server_would_hold_open() -> None:
    """Found on the real kube-apiserver: it reads a watch's `timeoutSeconds=0` as "none given" and holds the stream
    open for its default 30-60 minutes. The first sync followed every fresh list with such a watch, so each resource
    stalled for the client's 10 s read timeout, was logged as dropped, and the Lease came 50 s late."""
    async with open_lab(homelab([slot("s1"), slot("s2")])) as lab:
        w = Watchers(lab.kube, Signals(lab.client), namespaces=[NS])
        try:
            seen = len(lab.lab.call(lambda h: h.emulator.requests))
            await w.pump(until_ready=True)
            requests = lab.lab.call(lambda h: list(h.emulator.requests))[seen:]
        finally:
            w.close()
    assert [r for r in requests if r.verb == "list"], "the first sync lists every watched resource"
    zero = [r.path for r in requests if r.verb == "watch" and r.params.get("timeoutSeconds", "") in ("", "0")]
    assert zero == [], f"watches a real server would hold open: {zero}"
