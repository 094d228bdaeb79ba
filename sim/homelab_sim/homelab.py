"""A simulated homelab living inside the Kubernetes API emulator: machines that answer lifecycle Jobs.

The operator never talks to machines; it creates startup/shutdown Jobs and watches kubelet Nodes. So the sim
plays the two things a real cluster has and the emulator lacks: the Job controller and the kubelets. A lifecycle
Job gets its Pods as the Job controller makes them (``homelab_sim.power_pods``: names, labels, owner, phases,
each container's terminated state) and its Events (``SuccessfulCreate``, ``Completed``, ``BackoffLimitExceeded``,
``DeadlineExceeded``); a Pod runs for ``jobSeconds`` and exits as its shell script says (or 1 when the machine's
``startupJobFails``/``shutdownJobFails`` is set), its output served as the Pod's log (``kubectl logs job/<name>``);
a failed Pod is followed by another up to the Job's ``backoffLimit``, after the controller's backoff; past
``activeDeadlineSeconds`` (real time only) the running Pod is deleted and the Job fails ``DeadlineExceeded``.
The machines' kubelets: a booted machine registers its core v1 Node NotReady with the group's readiness taints,
turns Ready, then loses the taints; a machine that stops leaves its Node Ready=Unknown. Fault switches per
machine reproduce the ways real hardware lets the operator down.

It hooks the emulator through ``KubeEmulator.listeners``, so it reacts to whatever writes the Job — the
operator over HTTP, a test, kubectl. A delay of zero means "now, inside the listener call": with all
delays zero every reaction is stored before the HTTP request that created the Job returns, so tests on
Temporal's time-skipping server never race a real clock. Non-zero delays use ``loop.call_later`` on the
emulator's loop (real time, for ``homelab-autoscaler dev --simulate``). The controllers' and kubelets' writes go
through the emulator's admission (``patch_object(..., admit=True)``), as a real kubelet's are judged; what the
sim installs at start (``put_object``) is the cluster as it already is.

Not modelled: Pods of Jobs that are not lifecycle Jobs of a machine here, the scheduler (the power Jobs' Pods
run on ``homelab-control-plane``, named but not registered), the Pods' IPs, the Job TTL controller, the
node-lifecycle controller's ``node.kubernetes.io/*`` taints, a kubelet re-registering a Node deleted while its
machine runs (it stays deleted until the next boot). Everything here runs on the emulator's event loop; from
another thread use ``HomelabServer`` (or ``EmulatorServer.call``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType
from typing import Any, Literal, TypeVar

from api import names
from api.names import JobType
from api.v2alpha1 import GroupSpec, NodeSpec
from homelab_sim import workloads
from homelab_sim.emulator import ApiError, EmulatorServer, KubeEmulator, ResourceSpec, UserInfo, format_time
from homelab_sim.homelab_spec import (
    FAULT_NAMES,
    Faults,
    HomelabSpec,
    HomelabSpecError,
    SlotSpec,
    Timings,
    load_homelab_spec,
    parse_homelab_spec,
)
from homelab_sim.ledger import ReadyLedger, total
from homelab_sim.power_pods import (
    ScriptRun,
    pod_for_job,
    read_script,
    running_status,
    terminated_status,
    termination_message,
)

__all__ = [
    "FAULT_NAMES",
    "Faults",
    "Homelab",
    "HomelabEvent",
    "HomelabServer",
    "HomelabSpec",
    "HomelabSpecError",
    "Machine",
    "Power",
    "SlotSpec",
    "Stage",
    "Timings",
    "load_homelab_spec",
    "parse_homelab_spec",
]

T = TypeVar("T")
Obj = dict[str, Any]
_log = logging.getLogger(__name__)

_JOBS = ("batch", "v1", "jobs")
_NODES = "v1", "nodes"
_PODS = "v1", "pods"
_CRD_API_VERSION = names.API_VERSION
_SNAKE_FAULTS = dict(zip(FAULT_NAMES, Faults.model_fields, strict=True))

Power = Literal["on", "off"]


class Stage(StrEnum):
    """Where a machine is in its life; everything but ``off`` means power is on."""

    OFF = "off"
    BOOTING = "booting"  # powered, kubelet not registered yet
    NOT_READY = "not-ready"  # Node registered, Ready=False, readiness taints on
    READY = "ready"  # Ready=True, readiness taints still on
    SETTLED = "settled"  # Ready=True, readiness taints gone: usable


@dataclass
class Machine:
    """The sim's truth about one machine (the cluster only ever shows its kubelet's view of it)."""

    slot: SlotSpec
    timings: Timings
    faults: Faults
    stage: Stage = Stage.OFF
    epoch: int = 0  # bumped by every power change; cancels steps scheduled before it
    readiness_taints: list[Obj] = field(default_factory=list)
    running_jobs: set[str] = field(default_factory=set)  # lifecycle Jobs started and not yet ended

    @property
    def power(self) -> Power:
        return "off" if self.stage is Stage.OFF else "on"

    @property
    def node_name(self) -> str:
        return self.slot.node_name


@dataclass(frozen=True)
class HomelabEvent:
    """One thing that happened to a machine, for tests that assert on what the hardware did."""

    at: datetime.datetime
    slot: str
    what: str  # job-started, job-succeeded, job-failed, powered-on, registered, ready, taints-cleared, ...
    detail: str = ""


def _condition(kind: str, status: str, reason: str, message: str, now: str, previous: list[Obj]) -> Obj:
    """A NodeCondition, keeping lastTransitionTime when the status did not change (as the kubelet does)."""
    before = next((c for c in previous if c.get("type") == kind), None)
    moved = before is None or before.get("status") != status
    return {
        "type": kind,
        "status": status,
        "lastHeartbeatTime": now,
        "lastTransitionTime": now if moved or before is None else before.get("lastTransitionTime", now),
        "reason": reason,
        "message": message,
    }


def _kubelet_conditions(ready: bool, now: str, previous: list[Obj]) -> list[Obj]:
    """The four conditions a kubelet posts; Ready=False carries the CNI-not-ready message of a fresh boot."""
    pressure = [
        ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ]
    conditions = [_condition(kind, "False", reason, message, now, previous) for kind, reason, message in pressure]
    if ready:
        conditions.append(_condition("Ready", "True", "KubeletReady", "kubelet is posting ready status", now, previous))
    else:
        message = (
            "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady"
            " message:Network plugin returns error: cni plugin not initialized"
        )
        conditions.append(_condition("Ready", "False", "KubeletNotReady", message, now, previous))
    return conditions


def _unknown_conditions(now: str, previous: list[Obj]) -> list[Obj]:
    """What the node-lifecycle controller writes once a kubelet stops posting: every condition Unknown."""
    result = []
    for kind in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready"):
        before = next((c for c in previous if c.get("type") == kind), {})
        message = "Kubelet stopped posting node status."
        condition = _condition(kind, "Unknown", "NodeStatusUnknown", message, now, previous)
        condition["lastHeartbeatTime"] = before.get("lastHeartbeatTime", now)
        result.append(condition)
    return result


class _NodeGone(Exception):
    """The kubelet Node a step wanted to update was deleted meanwhile (someone else's decision; not an error)."""


def _taint_key(taint: Obj) -> tuple[Any, Any]:
    return taint.get("key"), taint.get("effect")


def _job_finished(job: Obj) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions)


@dataclass
class _JobRun:
    """One lifecycle Job the simulated Job controller runs: its machine, its current Pod, the failures so far."""

    machine: Machine
    name: str
    uid: str
    job_type: JobType
    backoff_limit: int
    pod: str = ""
    pod_uid: str = ""
    failures: int = 0
    scripts: dict[str, ScriptRun] = field(default_factory=dict)  # what each container of the current Pod does
    hung: bool = False  # its current Pod started under ``jobHangs`` and has not ended


class Homelab:
    """Machines reacting to lifecycle Jobs, attached to a ``KubeEmulator``; all calls on the emulator's loop.

    ``time_scale`` multiplies every delay (0 makes the whole homelab synchronous whatever the spec says).
    Runtime actions (``die``, ``power_on_by_hand``, ``set_fault``) are how tests stage what hardware does.
    """

    def __init__(
        self,
        emulator: KubeEmulator,
        spec: HomelabSpec,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        time_scale: float = 1.0,
    ) -> None:
        if time_scale < 0:
            raise ValueError("time_scale must not be negative")
        self.emulator = emulator
        self.spec = spec
        self.time_scale = time_scale
        self.history: list[HomelabEvent] = []
        self.stats: Counter[str] = Counter()  # what the machines went through (the chaos suite reads it)
        self._loop = loop
        self._timers: set[asyncio.TimerHandle] = set()
        self.machines: dict[str, Machine] = {}
        self._runs: dict[str, _JobRun] = {}  # the lifecycle Jobs running, by uid
        self._event_serial = 0
        self.ledger = ReadyLedger()  # the homelab's own record of what was on (its kubelets Ready)
        for slot in spec.slots:
            self.machines[slot.name] = Machine(
                slot=slot,
                timings=spec.timings_of(slot),
                faults=slot.faults.model_copy(),
                stage=Stage.SETTLED if slot.initially_on else Stage.OFF,
            )
        emulator.listeners.append(self._on_change)
        emulator.control["usage"] = self.usage

    # ----------------------------------------------------------------------------------------------
    # Public API.

    def usage(self, arg: Obj | None) -> Obj:
        """`POST /_sim/usage {"windows": {"<slot>": {"since": t, "until": t}}}` (RFC 3339 times; every slot over the
        homelab's whole life when no windows are given): each machine's own figures over its window, from the
        ledger, and their total."""
        windows = (arg or {}).get("windows")
        if windows is None:
            now = self.emulator.clock()
            start = min((p.start for held in self.ledger.periods.values() for p in held), default=now)
            windows = {name: {"since": start.isoformat(), "until": now.isoformat()} for name in self.machines}
        slots: dict[str, Obj] = {}
        for name, window in windows.items():
            machine = self.machine(name)
            since = datetime.datetime.fromisoformat(str(window["since"]).replace("Z", "+00:00"))
            until = datetime.datetime.fromisoformat(str(window["until"]).replace("Z", "+00:00"))
            slots[name] = self.ledger.figures(name, since, until, self.spec.draw_of(machine.slot))
        return {"slots": slots, "total": total(list(slots.values()))}

    def close(self) -> None:
        """Detach from the emulator and cancel every pending step (the machines freeze where they are)."""
        with contextlib.suppress(ValueError):
            self.emulator.listeners.remove(self._on_change)
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()

    def seed(self) -> None:
        """Create the Namespace, Groups, slots and the kubelet Nodes of machines on at install time.

        Objects that already exist are left alone, so seeding twice (or over a hand-made object) is harmless.
        """
        ns = self.spec.namespace
        if self.emulator.get_object("v1", "namespaces", None, ns) is None:
            self.emulator.put_object("v1", "namespaces", {"metadata": {"name": ns}, "status": {"phase": "Active"}})
        for group in self.spec.groups:
            if self.emulator.get_object(_CRD_API_VERSION, names.PLURAL_GROUPS, ns, group.name) is None:
                spec = group.model_dump(by_alias=True, exclude_none=True, mode="json", exclude={"name"})
                body = {"apiVersion": _CRD_API_VERSION, "kind": names.KIND_GROUP, "metadata": {"name": group.name}}
                self.emulator.put_object(_CRD_API_VERSION, names.PLURAL_GROUPS, {**body, "spec": spec}, ns)
        for slot in self.spec.slots:
            if self.emulator.get_object(_CRD_API_VERSION, names.PLURAL_NODES, ns, slot.name) is None:
                node_spec = NodeSpec(
                    group=slot.group,
                    kubernetes_node_name=slot.node_name,
                    provider_id=slot.provider_id,
                    startup_pod_spec=slot.startup_pod_spec,
                    shutdown_pod_spec=slot.shutdown_pod_spec,
                    pricing=slot.pricing,
                    power_draw=slot.power_draw,
                )
                body = {
                    "apiVersion": _CRD_API_VERSION,
                    "kind": names.KIND_NODE,
                    "metadata": {"name": slot.name},
                    "spec": node_spec.model_dump(by_alias=True, exclude_none=True, mode="json"),
                }
                self.emulator.put_object(_CRD_API_VERSION, names.PLURAL_NODES, body, ns)
        for machine in self.machines.values():
            if machine.slot.initially_on and self._node(machine) is None:
                self.emulator.put_object(*_NODES, self._node_body(machine, ready=True, taints=[]))
                self._record(machine, "registered", "on at install time")
                self.ledger.ready(machine.slot.name, self.emulator.clock())

    def machine(self, slot: str) -> Machine:
        try:
            return self.machines[slot]
        except KeyError:
            raise KeyError(f"no slot {slot!r} in the homelab (slots: {sorted(self.machines)})") from None

    def power(self, slot: str) -> Power:
        """The machine's real power, which the cluster can only infer from its kubelet."""
        return self.machine(slot).power

    def stage(self, slot: str) -> Stage:
        return self.machine(slot).stage

    def set_fault(self, slot: str, name: str, value: bool = True) -> None:
        """Flip a fault switch now (camelCase or snake_case name); clearing one resumes a stuck machine."""
        machine = self.machine(slot)
        attr = _SNAKE_FAULTS.get(name, name)
        if attr not in Faults.model_fields:
            raise ValueError(f"unknown fault {name!r} (known: {', '.join(FAULT_NAMES)})")
        setattr(machine.faults, attr, bool(value))
        self._record(machine, "fault", f"{name}={bool(value)}")
        if value:
            return
        if attr == "kubelet_never_registers" and machine.stage is Stage.BOOTING:
            self._after(machine, machine.timings.boot_seconds, lambda: self._register(machine))
        elif attr == "kubelet_never_ready" and machine.stage is Stage.NOT_READY:
            self._after(machine, machine.timings.ready_seconds, lambda: self._ready(machine))
        elif attr == "taint_never_clears" and machine.stage is Stage.READY:
            self._after(machine, machine.timings.taint_clear_seconds, lambda: self._clear_taints(machine))

    def end_hanging_jobs(self, slot: str) -> list[str]:
        """A slow Job's end: the Pods of this machine's Jobs that hang (``jobHangs``) end now, as their scripts say
        (the switch itself stays as it is). The names of the Jobs whose Pods ended."""
        machine = self.machine(slot)
        ended = []
        for run in list(self._runs.values()):
            if run.machine is machine and run.hung:
                run.hung = False
                ended.append(run.name)
                self._end_pod(run, run.pod_uid)
        return ended

    def die(self, slot: str) -> None:
        """Pull the plug: the machine is off at once and its Node goes Ready=Unknown. No-op when off."""
        machine = self.machine(slot)
        if machine.stage is not Stage.OFF:
            self._power_off(machine, "died")

    def power_on_by_hand(self, slot: str) -> None:
        """Someone pressed the power button: the machine boots with no Job. No-op when already on.

        ``neverBoots`` does not apply (it models a wake-up that never reaches the machine); the kubelet
        faults do.
        """
        machine = self.machine(slot)
        if machine.stage is Stage.OFF:
            self._boot(machine, "by hand")

    # ----------------------------------------------------------------------------------------------
    # Scheduling.

    def _now(self) -> str:
        return format_time(self.emulator.clock())

    def _record(self, machine: Machine, what: str, detail: str = "") -> None:
        self.history.append(HomelabEvent(self.emulator.clock(), machine.slot.name, what, detail))
        _log.info("homelab %s: %s%s", machine.slot.name, what, f" ({detail})" if detail else "")

    def _realtime(self, machine: Machine) -> bool:
        """A machine runs in real time unless all its delays are zero (then nothing ever waits on a clock)."""
        return self.time_scale > 0 and not machine.timings.all_zero

    def _later(self, seconds: float, step: Callable[[], None]) -> None:
        """Run ``step`` after ``seconds`` scaled; at once, synchronously, when that is zero."""
        delay = seconds * self.time_scale
        if delay <= 0:
            self._run(step)
            return
        loop = self._loop or asyncio.get_running_loop()
        handle: asyncio.TimerHandle | None = None

        def fire() -> None:
            if handle is not None:
                self._timers.discard(handle)
            self._run(step)

        handle = loop.call_later(delay, fire)
        self._timers.add(handle)

    def _after(self, machine: Machine, seconds: float, step: Callable[[], None]) -> None:
        """Like ``_later``, but dropped if the machine's power changed in between (a stale boot step)."""
        epoch = machine.epoch

        def guarded() -> None:
            if machine.epoch == epoch:
                step()

        self._later(seconds, guarded)

    @staticmethod
    def _run(step: Callable[[], None]) -> None:
        """Run one step; an API error (say the Node was deleted meanwhile) ends that chain, logged."""
        try:
            step()
        except (ApiError, _NodeGone) as exc:
            _log.warning("homelab step %r abandoned: %s", step, exc)

    # ----------------------------------------------------------------------------------------------
    # The Job controller.

    def _on_change(self, kind: str, spec: ResourceSpec, obj: Obj, old: Obj | None) -> None:
        """Emulator listener: only the creation of a lifecycle Job starts anything."""
        if kind == "ADDED" and spec.key == _JOBS:
            self._on_job(obj)
        elif kind == "DELETED" and spec.key == _JOBS:
            meta = obj.get("metadata") or {}
            self._runs.pop(str(meta.get("uid")), None)
            for machine in self.machines.values():
                machine.running_jobs.discard(str(meta.get("name")))

    def _on_job(self, job: Obj) -> None:
        meta = job.get("metadata") or {}
        labels = meta.get("labels") or {}
        slot_label = labels.get(names.LABEL_NODE, "")  # the bounded form of the slot's name (names.label_value)
        machine = next((m for n, m in self.machines.items() if names.label_value(n) == slot_label), None)
        job_type = labels.get(names.LABEL_JOB_TYPE)
        if meta.get("namespace") != self.spec.namespace or machine is None:
            return
        if job_type not in (JobType.STARTUP, JobType.SHUTDOWN):
            return
        name, uid = meta["name"], str(meta.get("uid"))
        spec = job.get("spec") or {}
        backoff_limit = spec.get("backoffLimit")
        run = _JobRun(machine, name, uid, JobType(job_type), backoff_limit if isinstance(backoff_limit, int) else 6)
        self._runs[uid] = run
        started = self._now()
        # what the Job controller writes first (kube-controller-manager 1.35.4), then ready once its Pod runs
        first = {"startTime": started, "active": 1, "ready": 0, "terminating": 0, "uncountedTerminatedPods": {}}
        self._job_status(name, uid, first)
        self._record(machine, "job-started", f"{job_type} {name}")
        self.stats[f"{job_type} jobs"] += 1
        if self.spec.workloads and job_type == JobType.SHUTDOWN:
            left = workloads.in_the_way(self.emulator, self.spec.namespace, machine.node_name)
            if left:
                self.stats[workloads.STAT] += len(left)
                self._record(machine, "shutdown-over-pods", f"{name} with {left}")
        if machine.running_jobs:  # two lifecycle Jobs on one machine at once: someone lost track of a boot
            self.stats["overlapping jobs"] += 1
            self._record(machine, "jobs-overlap", f"{name} while {sorted(machine.running_jobs)}")
        machine.running_jobs.add(name)
        # activeDeadlineSeconds is enforced in real time only: a zero-delay homelab never waits on a clock
        deadline = spec.get("activeDeadlineSeconds") if self._realtime(machine) else None
        if deadline:
            self._later(float(deadline), lambda: self._fail_job(run, "DeadlineExceeded"))
        self._start_pod(run)

    def _start_pod(self, run: _JobRun) -> None:
        """The Job controller creates the Job's next Pod, and its kubelet starts it at once (its script's output is
        the log); it ends after ``jobSeconds``, or never with ``jobHangs``."""
        job = self._current_job(run.name, run.uid)
        if job is None:
            return
        ns, machine = self.spec.namespace, run.machine
        pod_name = self.emulator.generate_name("v1", "pods", ns, f"{run.name}-")
        pod = self.emulator.put_object(*_PODS, pod_for_job(job, pod_name, self._now()), ns)
        run.pod, run.pod_uid = pod_name, str(pod["metadata"]["uid"])
        self._job_event(job, "Normal", "SuccessfulCreate", f"Created pod: {pod_name}")
        containers = pod["spec"].get("containers") or []
        run.scripts = {str(c.get("name")): read_script(c) for c in containers}
        now = self.emulator.clock()
        for container, script in run.scripts.items():
            self.emulator.logs.write(run.pod_uid, container, script.output, now)
        self.emulator.patch_object(
            *_PODS, ns, pod_name, {"status": running_status(pod, format_time(now))}, "status", admit=True
        )
        self._job_status(run.name, run.uid, {"active": 1, "ready": 1})
        if machine.faults.job_hangs:
            run.hung = True
            self._record(machine, "job-hangs", f"{run.job_type} {run.name}")
            return
        pod_uid = run.pod_uid
        self._later(machine.timings.job_seconds, lambda: self._end_pod(run, pod_uid))

    def _pod(self, run: _JobRun, pod_uid: str) -> Obj | None:
        pod = self.emulator.get_object(*_PODS, self.spec.namespace, run.pod)
        return pod if pod is not None and pod["metadata"].get("uid") == pod_uid else None

    def _end_pod(self, run: _JobRun, pod_uid: str) -> None:
        """The Pod's containers exit as their scripts say, or 1 when the machine's fault fails this kind of Job;
        the Job then completes, fails (past its backoffLimit), or gets its next Pod after the controller's backoff."""
        if self._current_job(run.name, run.uid) is None or (pod := self._pod(run, pod_uid)) is None:
            return
        machine = run.machine
        faulty = (
            machine.faults.startup_job_fails if run.job_type is JobType.STARTUP else machine.faults.shutdown_job_fails
        )
        exits: dict[str, tuple[int, str]] = {}
        now = self.emulator.clock()
        for index, container in enumerate(pod["spec"].get("containers") or []):
            cname = str(container.get("name"))
            script = run.scripts.get(cname, ScriptRun())
            if faulty and index == 0 and script.exit_code == 0:
                fault = "startupJobFails" if run.job_type is JobType.STARTUP else "shutdownJobFails"
                self.emulator.logs.write(pod_uid, cname, f"homelab simulator: fault {fault} is set: exit 1", now)
                script = ScriptRun(script.output, 1, script.message_file)
            log = "".join(f"{line.text}\n" for line in self.emulator.logs.of(pod_uid, cname))
            exits[cname] = (script.exit_code, termination_message(container, script, log))
        status = terminated_status(pod, exits, format_time(now))
        self.emulator.patch_object(*_PODS, self.spec.namespace, run.pod, {"status": status}, "status", admit=True)
        if status["phase"] == "Succeeded":
            self._finish_job(run)
            return
        run.failures += 1
        self._record(machine, "pod-failed", f"{run.pod} exit {max(code for code, _ in exits.values())}")
        if run.failures > run.backoff_limit:
            self._fail_job(run, "BackoffLimitExceeded")
            return
        self._job_status(run.name, run.uid, {"active": None, "ready": 0, "failed": run.failures})
        # The controller's pod backoff: 10 s, doubling, at most 6 minutes (none for a zero-delay machine).
        backoff = min(10.0 * 2 ** (run.failures - 1), 360.0) if self._realtime(machine) else 0.0
        self._later(backoff, lambda: self._next_pod(run))

    def _next_pod(self, run: _JobRun) -> None:
        if self._current_job(run.name, run.uid) is not None:
            self._start_pod(run)

    def _job_event(self, job: Obj, kind: str, reason: str, message: str) -> None:
        """An Event on the Job as the Job controller records it (``kubectl describe job`` lists them)."""
        meta = job.get("metadata") or {}
        moment = self.emulator.clock()
        self._event_serial += 1
        nanos = int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000 + self._event_serial
        when = format_time(moment)
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta.get('name')}.{nanos:x}", "namespace": meta.get("namespace")},
            "involvedObject": {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message,
            "type": kind,
            "count": 1,
            "firstTimestamp": when,
            "lastTimestamp": when,
            "source": {"component": "job-controller"},
            "reportingComponent": "job-controller",
            "reportingInstance": "",
        }
        self.emulator.put_object("v1", "events", event, self.spec.namespace)

    def _current_job(self, name: str, uid: str | None) -> Obj | None:
        """The Job if it is still the one we started and still running (deleted or recreated Jobs are left)."""
        job = self.emulator.get_object("batch/v1", "jobs", self.spec.namespace, name)
        if job is None or job["metadata"].get("uid") != uid or _job_finished(job):
            return None
        return job

    def _job_status(self, name: str, uid: str | None, status: Obj) -> bool:
        if self._current_job(name, uid) is None:
            return False
        self.emulator.patch_object(
            "batch/v1", "jobs", self.spec.namespace, name, {"status": status}, "status", admit=True
        )
        if status.get("conditions"):  # it ended
            for machine in self.machines.values():
                machine.running_jobs.discard(name)
        return True

    def _finish_job(self, run: _JobRun) -> None:
        machine, name, job_type = run.machine, run.name, run.job_type
        now = self._now()
        conditions = [
            {
                "type": kind,
                "status": "True",
                "lastProbeTime": now,
                "lastTransitionTime": now,
                "reason": "CompletionsReached",
                "message": "Reached expected number of succeeded pods",
            }
            for kind in ("SuccessCriteriaMet", "Complete")
        ]
        done = {"active": None, "ready": 0, "succeeded": 1, "completionTime": now, "conditions": conditions}
        job = self._current_job(name, run.uid)
        if job is None or not self._job_status(name, run.uid, done):
            return
        self._runs.pop(run.uid, None)
        self._job_event(job, "Normal", "Completed", "Job completed")
        self._record(machine, "job-succeeded", f"{job_type} {name}")
        if job_type is JobType.STARTUP:
            if machine.faults.never_boots:
                self._record(machine, "never-boots")
            elif machine.stage is Stage.OFF:
                self._boot(machine, f"startup Job {name}")
        elif machine.faults.shutdown_does_nothing:
            self._record(machine, "shutdown-ignored")
        elif machine.stage is not Stage.OFF:
            self._after(machine, machine.timings.shutdown_seconds, lambda: self._power_off(machine, "shut down"))

    def _fail_job(self, run: _JobRun, reason: str) -> None:
        """The Job fails: past its backoffLimit, or past its activeDeadlineSeconds, when the controller deletes the
        Pod still running (its container stopped by SIGTERM, exit 143) before it marks the Job Failed."""
        job = self._current_job(run.name, run.uid)
        if job is None:
            return
        failed = run.failures
        pod = self._pod(run, run.pod_uid) if reason == "DeadlineExceeded" else None
        if pod is not None and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            failed += 1
            now = format_time(self.emulator.clock())
            exits = {name: (143, "") for name in run.scripts}
            status = terminated_status(pod, exits, now)
            self.emulator.patch_object(*_PODS, self.spec.namespace, run.pod, {"status": status}, "status", admit=True)
            self.emulator.delete_object(*_PODS, self.spec.namespace, run.pod)
            self._job_event(job, "Normal", "SuccessfulDelete", f"Deleted pod: {run.pod}")
        now = self._now()
        message = {
            "BackoffLimitExceeded": "Job has reached the specified backoff limit",
            "DeadlineExceeded": "Job was active longer than specified deadline",
        }[reason]
        conditions = [
            {
                "type": kind,
                "status": "True",
                "lastProbeTime": now,
                "lastTransitionTime": now,
                "reason": reason,
                "message": message,
            }
            for kind in ("FailureTarget", "Failed")
        ]
        if self._job_status(
            run.name, run.uid, {"active": None, "ready": 0, "failed": max(failed, 1), "conditions": conditions}
        ):
            self._runs.pop(run.uid, None)
            self._job_event(job, "Warning", reason, message)
            self._record(run.machine, "job-failed", f"{run.name} {reason}")

    # ----------------------------------------------------------------------------------------------
    # The machines and their kubelets.

    def _node(self, machine: Machine) -> Obj | None:
        return self.emulator.get_object(*_NODES, None, machine.node_name)

    def _group_readiness_taints(self, machine: Machine) -> list[Obj]:
        """The group's readiness taints as the cluster has them now (the Group object), else as seeded."""
        group = self.emulator.get_object(_CRD_API_VERSION, names.PLURAL_GROUPS, self.spec.namespace, machine.slot.group)
        try:
            spec = GroupSpec.model_validate(group["spec"]) if group else self.spec.group(machine.slot.group)
        except (ValueError, KeyError):
            spec = self.spec.group(machine.slot.group)
        return [taint.model_dump(by_alias=True, exclude_none=True, mode="json") for taint in spec.node_readiness_taints]

    def _node_body(self, machine: Machine, *, ready: bool, taints: list[Obj]) -> Obj:
        name, kubelet = machine.node_name, machine.slot.node
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **kubelet.labels,
        }
        spec: Obj = {}
        if kubelet.provider_id:
            spec["providerID"] = kubelet.provider_id
        if taints:
            spec["taints"] = taints
        now = self._now()
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "spec": spec,
            "status": {
                "capacity": dict(kubelet.capacity),
                "allocatable": dict(kubelet.allocatable or kubelet.capacity),
                "conditions": _kubelet_conditions(ready, now, []),
                "addresses": [{"type": "Hostname", "address": name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                    "osImage": "Simulated homelab machine",
                    "kernelVersion": "6.8.0-sim",
                    "kubeletVersion": "v1.32.0",
                    "kubeProxyVersion": "v1.32.0",
                    "containerRuntimeVersion": "containerd://1.7.24",
                    "machineID": machine.slot.name,
                    "systemUUID": machine.slot.name,
                    "bootID": f"{machine.slot.name}-{machine.epoch}",
                },
            },
        }

    def _boot(self, machine: Machine, cause: str) -> None:
        machine.epoch += 1
        machine.stage = Stage.BOOTING
        self._record(machine, "powered-on", cause)
        self._after(machine, machine.timings.boot_seconds, lambda: self._register(machine))

    def _register(self, machine: Machine) -> None:
        """The kubelet comes up: registers its Node (or, if the Node was kept, re-posts it NotReady)."""
        if machine.faults.kubelet_never_registers:
            self._record(machine, "kubelet-silent", "powered, no Node registered")
            return
        taints = self._group_readiness_taints(machine)
        machine.readiness_taints = taints
        machine.stage = Stage.NOT_READY
        existing = self._node(machine)
        if existing is None:
            self.emulator.put_object(*_NODES, self._node_body(machine, ready=False, taints=taints))
        else:
            fresh = self._node_body(machine, ready=False, taints=[])
            present = (existing.get("spec") or {}).get("taints") or []
            keys = {_taint_key(t) for t in present}
            merged = present + [t for t in taints if _taint_key(t) not in keys]
            self.emulator.patch_object(
                *_NODES, None, machine.node_name, {"metadata": {"labels": fresh["metadata"]["labels"]}}, admit=True
            )
            if merged:
                self.emulator.patch_object(*_NODES, None, machine.node_name, {"spec": {"taints": merged}}, admit=True)
            previous = (existing.get("status") or {}).get("conditions") or []
            status = {**fresh["status"], "conditions": _kubelet_conditions(False, self._now(), previous)}
            self.emulator.patch_object(*_NODES, None, machine.node_name, {"status": status}, "status", admit=True)
        self._record(machine, "registered", "Ready=False, readiness taints on")
        if not machine.faults.kubelet_never_ready:
            self._after(machine, machine.timings.ready_seconds, lambda: self._ready(machine))

    def _ready(self, machine: Machine) -> None:
        if machine.stage is not Stage.NOT_READY or machine.faults.kubelet_never_ready:
            return
        self._post_conditions(machine, _kubelet_conditions(True, self._now(), self._conditions(machine)))
        machine.stage = Stage.READY
        self._record(machine, "ready")
        self.ledger.ready(machine.slot.name, self.emulator.clock())
        if not machine.faults.taint_never_clears:
            self._after(machine, machine.timings.taint_clear_seconds, lambda: self._clear_taints(machine))

    def _clear_taints(self, machine: Machine) -> None:
        if machine.stage is not Stage.READY or machine.faults.taint_never_clears:
            return
        node = self._node(machine)
        if node is None:
            raise _NodeGone(f"Node {machine.node_name} is gone")
        gone = {_taint_key(t) for t in machine.readiness_taints}
        remaining = [t for t in (node.get("spec") or {}).get("taints") or [] if _taint_key(t) not in gone]
        self.emulator.patch_object(
            *_NODES, None, machine.node_name, {"spec": {"taints": remaining or None}}, admit=True
        )
        machine.stage = Stage.SETTLED
        self._record(machine, "taints-cleared")
        if self.spec.workloads:
            workloads.place(self.emulator, self.spec.namespace, machine.node_name, machine.epoch)

    def _power_off(self, machine: Machine, cause: str) -> None:
        machine.epoch += 1
        machine.stage = Stage.OFF
        self._record(machine, "powered-off", cause)
        if self.spec.workloads:
            workloads.clear(self.emulator, self.spec.namespace, machine.node_name)
        self.ledger.not_ready(machine.slot.name, self.emulator.clock())
        if self._node(machine) is not None:
            self._post_conditions(machine, _unknown_conditions(self._now(), self._conditions(machine)))

    def _conditions(self, machine: Machine) -> list[Obj]:
        node = self._node(machine)
        if node is None:
            raise _NodeGone(f"Node {machine.node_name} is gone")
        conditions: list[Obj] = (node.get("status") or {}).get("conditions") or []
        return conditions

    def _post_conditions(self, machine: Machine, conditions: list[Obj]) -> None:
        """Write the conditions list whole (a merge patch replaces lists), as a status update would."""
        self.emulator.patch_object(
            *_NODES, None, machine.node_name, {"status": {"conditions": conditions}}, "status", admit=True
        )


class HomelabServer:
    """An ``EmulatorServer`` with a seeded ``Homelab`` attached, driven from any thread.

    ``with HomelabServer(spec) as lab: lab.api_client() ...; lab.die("worker-1")``. The machine actions hop
    onto the server loop, so a test thread (or the Temporal test environment) can stage hardware events.
    """

    def __init__(
        self,
        spec: HomelabSpec,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        time_scale: float = 1.0,
        seed: bool = True,
        clock: Callable[[], datetime.datetime] | None = None,
        strict: bool | None = None,
        users: Mapping[str, UserInfo] | None = None,
    ) -> None:
        self.spec = spec
        self.server = (
            EmulatorServer(port, host, strict=strict, users=users)
            if clock is None
            else EmulatorServer(port, host, clock=clock, strict=strict, users=users)
        )
        self._time_scale = time_scale
        self._seed = seed
        self._homelab: Homelab | None = None

    @property
    def homelab(self) -> Homelab:
        """The model itself; touch it only through ``call`` (it lives on the server loop)."""
        if self._homelab is None:
            raise RuntimeError("the homelab server is not running")
        return self._homelab

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def emulator(self) -> KubeEmulator:
        return self.server.emulator

    def start(self) -> HomelabServer:
        self.server.start()

        def attach(emulator: KubeEmulator) -> Homelab:
            homelab = Homelab(emulator, self.spec, loop=asyncio.get_running_loop(), time_scale=self._time_scale)
            if self._seed:
                homelab.seed()
            return homelab

        try:
            self._homelab = self.server.call(attach)
        except BaseException:
            self.server.stop()
            raise
        return self

    def stop(self) -> None:
        if self._homelab is not None:
            homelab, self._homelab = self._homelab, None
            with contextlib.suppress(Exception):
                self.server.call(lambda _: homelab.close())
        self.server.stop()

    def call(self, fn: Callable[[Homelab], T], timeout: float = 10.0) -> T:
        """Run ``fn(homelab)`` on the server loop and return its result."""
        homelab = self.homelab
        return self.server.call(lambda _: fn(homelab), timeout)

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for this server (close it, or use ``with``)."""
        return self.server.api_client()

    def power(self, slot: str) -> Power:
        return self.call(lambda lab: lab.power(slot))

    def stage(self, slot: str) -> Stage:
        return self.call(lambda lab: lab.stage(slot))

    def die(self, slot: str) -> None:
        self.call(lambda lab: lab.die(slot))

    def power_on_by_hand(self, slot: str) -> None:
        self.call(lambda lab: lab.power_on_by_hand(slot))

    def set_fault(self, slot: str, name: str, value: bool = True) -> None:
        self.call(lambda lab: lab.set_fault(slot, name, value))

    def end_hanging_jobs(self, slot: str) -> list[str]:
        return self.call(lambda lab: lab.end_hanging_jobs(slot))

    def history(self, slot: str | None = None) -> list[HomelabEvent]:
        """What the machines did so far (optionally one slot's), oldest first."""
        return self.call(lambda lab: [e for e in lab.history if slot is None or e.slot == slot])

    def __enter__(self) -> HomelabServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
