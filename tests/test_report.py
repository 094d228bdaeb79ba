"""The report writer: the law table row by row, the history after a day of churn, the marker conditions,
group health, and the rule that nothing else writes Node.status.

The cluster is the API emulator over HTTP (no Temporal here): the watchers run against it with a signal sink
that records what it was asked and delivers nothing, because what these tests look at is the report.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from homelab_sim.emulator import EmulatorServer

from api import contracts as c
from api.names import ClaimPhase, GroupHealth, PowerState, Report
from api.v2alpha1 import NodeStatus
from domain import law
from kube.adapter import Kube
from watchers import report
from watchers.main import Watchers
from watchers.report import SlotFacts, group_conditions, group_health, markers, merge_diff, slot_status

NS = "lab"
CRD = "infra.homecluster.dev/v2alpha1"
T0 = datetime(2030, 1, 1, tzinfo=UTC)
POD = {"image": "busybox", "command": ["true"]}


@dataclass
class Quiet:
    """A signal sink that records and delivers nothing: no workflow runs in these tests."""

    sent: list[tuple[str, str]] = field(default_factory=list)

    async def claim(self, namespace: str, claim: str, signal: str, arg: Any = None) -> bool:
        self.sent.append((c.claim_workflow_id(namespace, claim), signal))
        return True

    async def release(self, namespace: str, slot: str, signal: str, arg: Any = None) -> bool:
        self.sent.append((c.release_workflow_id(namespace, slot), signal))
        return True

    async def group(self, namespace: str, group: str, signal: str, arg: Any = None, *, start: bool = True) -> bool:
        self.sent.append((c.group_workflow_id(namespace, group), signal))
        return True

    async def claim_running(self, namespace: str, claim: str) -> bool:
        return True

    async def start_claim(self, seed: c.ClaimSeed) -> bool:
        return True

    def count(self, signal: str | None = None, workflow_id: str | None = None) -> int:
        return sum(
            1 for w, s in self.sent if (signal is None or s == signal) and (workflow_id is None or w == workflow_id)
        )


class World:
    """Slots, kubelet Nodes and claims in the emulator, written the way their owners write them."""

    def __init__(self, emulator: EmulatorServer) -> None:
        self.em = emulator
        self.put(CRD, "groups", {"metadata": {"name": "g"}, "spec": {"maxSize": 64, "nodeReadinessTaints": []}})

    def put(self, gv: str, plural: str, obj: dict[str, Any]) -> None:
        self.em.call(lambda e: e.put_object(gv, plural, {"apiVersion": gv, **obj}, NS))

    def slot(self, name: str) -> None:
        spec = {"group": "g", "kubernetesNodeName": name, "startupPodSpec": POD, "shutdownPodSpec": POD}
        self.put(CRD, "nodes", {"kind": "Node", "metadata": {"name": name}, "spec": spec})

    def kubelet(self, name: str, power: str | None, usable: bool = True) -> None:
        """The kubelet's Node: None removes it; off is Ready=Unknown; on and not usable is cordoned."""
        if power is None:
            self.em.call(
                lambda e: e.get_object("v1", "nodes", None, name) and e.delete_object("v1", "nodes", None, name)
            )
            return
        ready = "True" if power == "on" else "Unknown"
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name},
            "spec": {} if usable or power == "off" else {"unschedulable": True},
            "status": {"conditions": [{"type": "Ready", "status": ready}], "capacity": {"cpu": "2"}},
        }
        self.em.call(lambda e: e.put_object("v1", "nodes", body))

    def claim(self, name: str, slot: str, phase: str | None, *, marked: bool = False, at: datetime = T0) -> None:
        meta: dict[str, Any] = {"name": name}
        if marked:
            meta["finalizers"] = ["test/hold"]
        body = {
            "kind": "NodeClaim",
            "metadata": meta,
            "spec": {"node": slot, "group": "g", "requestedAt": at.strftime("%Y-%m-%dT%H:%M:%SZ")},
        }
        if phase:
            body["status"] = {"phase": phase, "attempt": 1}
        self.put(CRD, "nodeclaims", body)
        if marked:
            self.em.call(lambda e: e.delete_object(CRD, "nodeclaims", NS, name))

    def drop_claim(self, name: str) -> None:
        def drop(e: Any) -> None:
            if e.get_object(CRD, "nodeclaims", NS, name) is not None:
                e.patch_object(CRD, "nodeclaims", NS, name, {"metadata": {"finalizers": None}})
                if e.get_object(CRD, "nodeclaims", NS, name) is not None:
                    e.delete_object(CRD, "nodeclaims", NS, name)

        self.em.call(drop)

    def status(self, slot: str) -> dict[str, Any]:
        obj = self.em.call(lambda e: e.get_object(CRD, "nodes", NS, slot))
        assert obj is not None
        return dict(obj.get("status") or {})


# Every observable input of the law: off with usable=True cannot be observed (off is never usable).
KEYS = [k for k in law.ALL_KEYS if not (k[2] is PowerState.OFF and k[3])]


def writes(emulator: EmulatorServer, plural: str, group: str) -> int:
    """Writes that reached the API server over HTTP for one resource (the tests' own setup is not HTTP)."""
    verbs = {"create", "update", "patch", "delete"}
    return sum(1 for r in emulator.emulator.requests if r.plural == plural and r.group == group and r.verb in verbs)


def _label(key: law.Key) -> str:
    phase, marked, power, usable = key
    return f"{phase or 'none'}{'-marked' if marked else ''}-{power}-{'usable' if usable else 'unusable'}"


async def test_report_follows_every_row_when_only_the_claim_changes(emulator: EmulatorServer, kube: Kube) -> None:
    world = World(emulator)
    for i, (phase, _, power, usable) in enumerate(KEYS):
        world.slot(f"k{i}")
        world.kubelet(f"k{i}", str(power), usable)
        if phase is None:  # the change is the live claim going away
            world.claim(f"c{i}", f"k{i}", "pending")
    w = Watchers(kube, Quiet(), namespaces=[NS])
    await w.pump()
    nodes_before = writes(emulator, "nodes", "")
    for i, (phase, marked, _, _) in enumerate(KEYS):
        if phase is None:
            world.drop_claim(f"c{i}")
        else:
            world.claim(f"c{i}", f"k{i}", str(phase), marked=marked)
    await w.pump()
    wrong = {}
    for i, key in enumerate(KEYS):
        want = law.derive(law.Input(*key))
        got = world.status(f"k{i}").get("phase")
        if got != want:
            wrong[_label(key)] = (got, str(want))
    assert wrong == {}
    nodes_after = writes(emulator, "nodes", "")
    assert nodes_after == nodes_before, "no kubelet Node was touched: the claims alone moved the reports"


async def test_report_follows_every_row_when_only_the_kubelet_changes(emulator: EmulatorServer, kube: Kube) -> None:
    world = World(emulator)
    for i, (phase, marked, power, _) in enumerate(KEYS):
        world.slot(f"k{i}")
        world.kubelet(f"k{i}", None if power is PowerState.ON else "on")  # the opposite of the target
        if phase is not None:
            world.claim(f"c{i}", f"k{i}", str(phase), marked=marked)
    w = Watchers(kube, Quiet(), namespaces=[NS])
    await w.pump()
    claims_before = writes(emulator, "nodeclaims", "infra.homecluster.dev")
    for i, (_, _, power, usable) in enumerate(KEYS):
        world.kubelet(f"k{i}", str(power), usable)
    await w.pump()
    wrong = {}
    for i, key in enumerate(KEYS):
        want = law.derive(law.Input(*key))
        st = world.status(f"k{i}")
        if (st.get("phase"), st.get("powerState")) != (want, str(key[2])):
            wrong[_label(key)] = (st.get("phase"), st.get("powerState"), str(want))
    assert wrong == {}
    claims_after = writes(emulator, "nodeclaims", "infra.homecluster.dev")
    assert claims_after == claims_before, "no claim was touched: the kubelet alone moved the reports"


# --- the history after a day of churn ---------------------------------------------------------------------
async def test_history_ring_and_activation_counts_after_a_day_of_churn(emulator: EmulatorServer, kube: Kube) -> None:
    """40 boots in 24 hours: the ring keeps its 32 newest rows, the ledger counts all 40; time is an argument."""
    world = World(emulator)
    world.slot("s1")
    w = Watchers(kube, Quiet(), namespaces=[NS])
    await w.pump()
    cluster, writer, key = w.cluster, w.writer, (NS, "s1")
    every = timedelta(hours=24) / 40
    claim: dict[str, Any] = {}
    for n in range(40):
        start = T0 + n * every
        claim = {
            "metadata": {"name": f"c{n}", "namespace": NS},
            "spec": {"node": "s1", "group": "g", "requestedAt": start.strftime("%Y-%m-%dT%H:%M:%SZ")},
            "status": {"phase": "pending"},
        }
        cluster.claims = {(NS, f"c{n}"): claim}
        cluster.nodes.pop("s1", None)
        await writer.slot(key, start)  # pending
        claim["status"] = {"phase": "booting"}
        await writer.slot(key, start + timedelta(minutes=1))
        cluster.nodes["s1"] = {
            "metadata": {"name": "s1"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
        claim["status"] = {"phase": "ready"}
        await writer.slot(key, start + timedelta(minutes=3))
        claim["status"] = {"phase": "completed"}  # a scale-down: the claim ended, the machine still on
        await writer.slot(key, start + timedelta(minutes=20))
        cluster.nodes["s1"]["status"]["conditions"][0]["status"] = "Unknown"
        await writer.slot(key, start + timedelta(minutes=25))
    st = NodeStatus.model_validate(world.status("s1"))
    assert st.activations_total == 40
    assert st.activations_last_24h == 40
    assert len(st.recent_activations) == 40
    assert len(st.recent_transitions) == 32
    last_churn = [Report.PENDING, Report.BOOTING, Report.READY, Report.DRAINING, Report.OFF]
    assert [r.to_phase for r in st.recent_transitions[-5:]] == last_churn
    assert st.phase is Report.OFF and st.previous_phase is Report.DRAINING
    # The expiry pass, run when due: half a day later, only the boots of the last 24 hours count.
    noon = T0 + timedelta(hours=36)
    slot_writes = writer.slot_writes
    await writer.everything(noon)  # (the group's usage figures catch up too: its slot booted 40 times meanwhile)
    assert writer.slot_writes == slot_writes + 1
    st = NodeStatus.model_validate(world.status("s1"))
    assert st.activations_total == 40
    assert st.activations_last_24h == len(
        [n for n in range(40) if T0 + n * every + timedelta(minutes=3) >= noon - timedelta(hours=24)]
    )
    due = writer.next_expiry()
    assert due is not None and due > noon
    assert await writer.everything(due - timedelta(seconds=1)) == 0, "nothing expires before it is due"
    assert await writer.everything(T0 + timedelta(days=3)) == 1
    st = NodeStatus.model_validate(world.status("s1"))
    assert (st.activations_last_24h, st.recent_transitions, st.recent_activations) == (0, [], [])
    assert writer.next_expiry() is None


# --- what happened while no replica acted is delivered at start ---------------------------------------------
async def test_hand_deletion_and_finished_jobs_from_before_the_start_are_delivered_once(
    emulator: EmulatorServer, kube: Kube
) -> None:
    world = World(emulator)
    world.slot("s1")
    world.claim("c1", "s1", "ready", marked=True)  # deleted by hand while the watchers were down
    job = {
        "kind": "Job",
        "metadata": {
            "name": "c1-startup",
            "labels": {"infra.homecluster.dev/node": "s1", "infra.homecluster.dev/nodeclaim": "c1"},
        },
        "spec": {"template": {"spec": {"containers": []}}},
        "status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]},
    }
    world.put("batch/v1", "jobs", job)
    sink = Quiet()
    w = Watchers(kube, sink, namespaces=[NS])
    await w.pump()
    await w.pump()
    assert sink.count(c.ClaimSignal.MARK_FOR_DELETION, c.claim_workflow_id(NS, "c1")) == 1
    assert sink.count(c.ClaimSignal.JOB_FINISHED, c.claim_workflow_id(NS, "c1")) == 1
    assert world.status("s1")["phase"] == "off"  # marked ready claim, machine off: the claim ends, nothing on


# --- marker conditions ------------------------------------------------------------------------------------
def _facts(phase: ClaimPhase | None, marked: bool, power: str, usable: bool) -> SlotFacts:
    return SlotFacts("c1" if phase else None, phase, marked, PowerState(power), usable)


@pytest.mark.parametrize(
    ("facts", "up", "down"),
    [
        (_facts(None, False, "off", False), "False", "False"),
        (_facts(ClaimPhase.PENDING, False, "off", False), "True", "False"),
        (_facts(ClaimPhase.BOOTING, False, "on", False), "True", "False"),
        (_facts(ClaimPhase.READY, False, "on", True), "False", "False"),
        (_facts(ClaimPhase.READY, True, "on", False), "False", "True"),
        (_facts(ClaimPhase.BOOTING, True, "on", False), "False", "True"),
        (_facts(None, False, "on", True), "False", "True"),
    ],
)
def test_marker_conditions(facts: SlotFacts, up: str, down: str) -> None:
    st = slot_status(NodeStatus(), facts, T0)
    by_type = {cond.type: cond.status for cond in st.conditions}
    assert (by_type["ScaleUpInFlight"], by_type["ScaleDownInFlight"]) == (up, down)


def test_marker_clocks_move_only_when_the_status_flips() -> None:
    booting = slot_status(NodeStatus(), _facts(ClaimPhase.PENDING, False, "off", False), T0)
    later = slot_status(booting, _facts(ClaimPhase.BOOTING, False, "on", False), T0 + timedelta(minutes=1))
    up = {cond.type: cond for cond in later.conditions}["ScaleUpInFlight"]
    assert (up.reason, up.last_transition_time) == ("ClaimBooting", T0)
    ready = slot_status(later, _facts(ClaimPhase.READY, False, "on", True), T0 + timedelta(minutes=2))
    up = {cond.type: cond for cond in ready.conditions}["ScaleUpInFlight"]
    assert (up.status, up.last_transition_time) == ("False", T0 + timedelta(minutes=2))
    assert markers(_facts(None, False, "off", False), Report.OFF, [], T0)[0].type == "ScaleUpInFlight"


def test_group_health() -> None:
    assert group_health([]) is GroupHealth.UNKNOWN
    assert group_health([False, False]) is GroupHealth.HEALTHY
    assert group_health([False, True]) is GroupHealth.DEGRADED
    assert group_health([True, True]) is GroupHealth.OFFLINE


def test_a_degraded_group_says_which_slots_and_why_in_time_order() -> None:
    """`kubectl describe group` shows why a group is degraded (the slots and their reasons), and its conditions
    in the order they changed, oldest first."""
    group = {"spec": {"maxSize": 3}, "status": {}}
    why = ["s2: claim s2-abc failed (StartupJobFailed)", "s3: ready claim, but the node is not usable"]
    first = group_conditions(group, GroupHealth.HEALTHY, [], T0)
    assert [(cd["type"], cd["status"]) for cd in first] == [("Healthy", "True"), ("Valid", "True")]
    later = group_conditions({**group, "status": {"conditions": first}}, GroupHealth.DEGRADED, why, T0 + timedelta(1))
    by_type = {cd["type"]: cd for cd in later}
    assert by_type["Healthy"]["status"] == "False" and by_type["Healthy"]["reason"] == "Degraded"
    assert by_type["Healthy"]["message"] == "; ".join(why)
    assert [cd["type"] for cd in later] == ["Valid", "Healthy"], "the one that changed last comes last"


def test_merge_diff_deletes_nested_keys_that_went_away() -> None:
    have = {"lastClaim": {"name": "c", "deadlineAt": "x"}, "phase": "booting", "gone": 1}
    want = {"lastClaim": {"name": "c"}, "phase": "ready"}
    assert merge_diff(have, want) == {"gone": None, "lastClaim": {"deadlineAt": None}, "phase": "ready"}
    assert merge_diff(want, want) == {}


# --- Node.status has one writer ---------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("api", "workflows", "activities", "watchers", "provider", "admission", "homelab_autoscaler", "kube")
ADAPTER = "kube/adapter.py"  # defines the call; writes nothing by itself


def node_status_writes(source: str) -> list[int]:
    """Lines that write Node.status: any use of `patch_slot_status`, or a `patch_raw`/`_patch` of SLOTS'
    status subresource.
    """
    found: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "patch_slot_status":
            found.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            slots = any(isinstance(a, ast.Name) and a.id == "SLOTS" for a in node.args)
            status = any(
                k.arg == "status" and not (isinstance(k.value, ast.Constant) and not k.value.value)
                for k in node.keywords
            )
            if node.func.attr in {"patch_raw", "_patch"} and slots and status:
                found.append(node.lineno)
    return found


def test_no_code_outside_the_report_writer_writes_node_status() -> None:
    writers: dict[str, list[int]] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            lines = node_status_writes(path.read_text())
            if lines and rel != ADAPTER:
                writers[rel] = lines
    assert "watchers/report.py" in writers, "the checker sees the report writer"
    assert {p for p in writers if not p.startswith("watchers/report")} == set()


@pytest.mark.parametrize(
    "bad",
    [
        "kube.patch_slot_status(ns, name, {'phase': 'off'})",
        "await asyncio.to_thread(self.kube.patch_slot_status, ns, name, patch)",
        "kube.patch_raw(SLOTS, ns, name, {'status': {}}, status=True)",
    ],
)
def test_node_status_checker_catches(bad: str) -> None:
    assert node_status_writes(bad)


def test_node_status_checker_allows_other_writes() -> None:
    assert (
        node_status_writes("kube.patch_raw(CLAIMS, ns, name, body, status=True)\nkube.patch_raw(SLOTS, ns, n, p)") == []
    )
    assert report.__name__ == "watchers.report"
