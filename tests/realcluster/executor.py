"""The machines of the real-cluster story. KWOK runs no containers, so this executor plays what a power Job's
container would do to a real machine, through the API server as its kubelet would show it:

- a startup Job's Pod, once KWOK has it Running: the machine boots, so its kubelet (a KWOK process of its own)
  registers the Node, makes it Ready and heartbeats its Lease; the Pod then ends Succeeded with exit code 0;
- a shutdown Job's Pod: the machine powers off, so its kubelet process stops and the node-lifecycle controller
  marks the Node NotReady once the Lease is stale; the Pod ends Succeeded;
- a fault switch makes the next Pods of one slot's operation end Failed with an exit code and a message, as a
  BMC that does not answer would;
- what the container printed is kept as a container runtime keeps it (a CRI-format log file), with a KWOK `Logs`
  object naming that file (owned by the Pod), so the node's KWOK kubelet serves it to `kubectl logs` through the
  API server; the termination message is the last line printed, as a script writing /dev/termination-log says it.

The operation, slot and node name come from the Pod's environment (HOMELAB_OPERATION, HOMELAB_SLOT,
HOMELAB_NODE_NAME), which the operator sets on every lifecycle Job.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.realcluster.cluster import Cluster

log = logging.getLogger(__name__)
MANAGED = "app.kubernetes.io/managed-by=homelab-autoscaler"


@dataclass(frozen=True)
class Machine:
    """One physical machine as its kubelet would register it."""

    node_name: str
    provider_id: str
    labels: Mapping[str, str] = field(default_factory=dict)
    capacity: Mapping[str, str] = field(default_factory=lambda: {"cpu": "4", "memory": "8Gi", "pods": "110"})
    taints: tuple[Mapping[str, str], ...] = ()


@dataclass
class Fault:
    exit_code: int
    message: str
    times: int
    output: tuple[str, ...] = ()  # printed before the message


@dataclass
class Record:
    """What the executor did, for the story's assertions and its failure report."""

    at: float
    pod: str
    operation: str
    slot: str
    outcome: str


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Executor:
    """Polls the power Jobs' Pods and plays their effects; `start()` runs it on a thread, `stop()` joins it."""

    def __init__(self, cluster: Cluster, namespace: str, machines: Mapping[str, Machine], *,
                 work_seconds: float = 1.0, every: float = 0.5) -> None:  # fmt: skip
        self.cluster = cluster
        self.core: Any = k8s.CoreV1Api(cluster.admin)
        self.custom: Any = k8s.CustomObjectsApi(cluster.admin)
        self.logs_dir = cluster.dir / "pod-logs"
        self.namespace = namespace
        self.machines = dict(machines)  # by slot name
        self.work_seconds = work_seconds
        self.every = every
        self.records: list[Record] = []
        self.errors: list[str] = []
        self._faults: dict[tuple[str, str], Fault] = {}
        self._done: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the machines, driven directly ---------------------------------------------------------------------------
    def power_on(self, slot: str) -> None:
        """The machine is on: its kubelet registers the Node (or finds the one kept from before) and runs."""
        m = self.machines[slot]
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": m.node_name,
                "labels": {"kubernetes.io/hostname": m.node_name, "kubernetes.io/os": "linux",
                           "kubernetes.io/arch": "amd64", "type": "kwok", **m.labels},
            },
            "spec": {"providerID": m.provider_id, "taints": [dict(t) for t in m.taints]},
            "status": {"capacity": dict(m.capacity), "allocatable": dict(m.capacity)},
        }  # fmt: skip
        try:
            self.core.create_node(body)
        except ApiException as exc:
            if exc.status != 409:  # kept (powerOffNodePolicy Keep) or not deleted yet: the kubelet comes back to it
                raise
        self.cluster.start_kubelet(m.node_name)

    def power_off(self, slot: str) -> None:
        """The machine is off: its kubelet stops, the Node object stays until someone deletes it."""
        self.cluster.stop_kubelet(self.machines[slot].node_name)

    def fail(self, slot: str, operation: str, *, exit_code: int, message: str, times: int = 1,
             output: tuple[str, ...] = ()) -> None:  # fmt: skip
        """The next `times` Pods of `operation` for `slot` print `output`, then `message` (their termination message),
        and end Failed with this exit code."""
        with self._lock:
            self._faults[(slot, operation)] = Fault(exit_code, message, times, output)

    # --- the loop ------------------------------------------------------------------------------------------------
    def start(self) -> Executor:
        self._thread = threading.Thread(target=self._run, name="power-executor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)

    def __enter__(self) -> Executor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                for pod in self._ready_pods():
                    self._play(pod)
            except ApiException as exc:
                self.errors.append(f"{_now()} {exc.status} {exc.reason}")
            except Exception as exc:  # a harness thread reports, never dies silently
                self.errors.append(f"{_now()} {type(exc).__name__}: {exc}")
                log.exception("power executor")

    def _ready_pods(self) -> Iterator[Any]:
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=MANAGED, _request_timeout=10)
        for pod in pods.items:
            if pod.metadata.uid in self._done or pod.metadata.deletion_timestamp is not None:
                continue
            if pod.status is not None and pod.status.phase == "Running":
                yield pod

    def _env(self, pod: Any) -> dict[str, str]:
        container = pod.spec.containers[0]
        return {e.name: e.value for e in container.env or [] if e.value is not None}

    def _play(self, pod: Any) -> None:
        env = self._env(pod)
        operation, slot = env.get("HOMELAB_OPERATION", ""), env.get("HOMELAB_SLOT", "")
        if slot not in self.machines or operation not in ("startup", "shutdown"):
            said = f"no machine {slot!r} for {operation!r}"
            self._finish(pod, 2, said, operation, slot, (said,))
            return
        time.sleep(self.work_seconds)  # the BMC takes a moment
        with self._lock:
            fault = self._faults.get((slot, operation))
            if fault is not None:
                fault.times -= 1
                if fault.times <= 0:
                    del self._faults[(slot, operation)]
        if fault is not None:
            self._finish(pod, fault.exit_code, fault.message, operation, slot, (*fault.output, fault.message))
            return
        if operation == "startup":
            self.power_on(slot)
        else:
            self.power_off(slot)
        self._finish(pod, 0, "", operation, slot, (f"{slot} powered {'on' if operation == 'startup' else 'off'}",))

    def _print(self, pod: Any, lines: tuple[str, ...]) -> None:
        """The container's output as a container runtime keeps it (CRI log format: time, stream, tag, line) and a
        KWOK Logs object naming the file, owned by the Pod so the garbage collector takes it with the Pod. A failure
        here is an executor error; the Pod still ends (the story's `kubectl logs` check then says what is missing)."""
        container = pod.spec.containers[0].name
        directory = self.logs_dir / f"{pod.metadata.namespace}_{pod.metadata.name}_{pod.metadata.uid}" / container
        directory.mkdir(parents=True, exist_ok=True)
        log = directory / "0.log"
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        log.write_text("".join(f"{stamp} stdout F {line}\n" for line in lines))
        body = {
            "apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Logs",
            "metadata": {"name": pod.metadata.name, "namespace": pod.metadata.namespace,
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name,
                                              "uid": pod.metadata.uid}]},
            "spec": {"logs": [{"containers": [container], "logsFile": str(log)}]},
        }  # fmt: skip
        try:
            self.custom.create_namespaced_custom_object("kwok.x-k8s.io", "v1alpha1", pod.metadata.namespace, "logs",
                                                        body, _request_timeout=10)  # fmt: skip
        except ApiException as exc:
            if exc.status != 409:
                self.errors.append(f"{_now()} the Logs of {pod.metadata.name}: {exc.status} {exc.reason}")

    def _finish(self, pod: Any, exit_code: int, message: str, operation: str, slot: str,
                output: tuple[str, ...]) -> None:  # fmt: skip
        self._print(pod, output)
        now = _now()
        started = now
        for status in pod.status.container_statuses or []:
            if status.state and status.state.running and status.state.running.started_at:
                started = status.state.running.started_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        terminated: dict[str, Any] = {
            "exitCode": exit_code,
            "reason": "Completed" if exit_code == 0 else "Error",
            "startedAt": started,
            "finishedAt": now,
        }
        if message:
            terminated["message"] = message
        container = pod.spec.containers[0]
        status = {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
            ],
            "containerStatuses": [
                {"name": container.name, "image": container.image, "imageID": "", "ready": False, "restartCount": 0,
                 "started": False, "state": {"terminated": terminated}},
            ],
        }  # fmt: skip
        self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": status})
        self._done.add(pod.metadata.uid)
        outcome = "succeeded" if exit_code == 0 else f"failed (exit {exit_code}: {message})"
        self.records.append(Record(time.monotonic(), pod.metadata.name, operation, slot, outcome))
        log.info("power executor: %s %s of %s %s", pod.metadata.name, operation, slot, outcome)
