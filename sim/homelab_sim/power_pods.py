"""The Pods of the simulated Job controller and what their containers say: pure builders, no emulator.

A lifecycle Job's Pod is made as the Job controller makes it (``generateName: <job>-``, the template's labels,
which carry the API server's ``job-name`` and ``controller-uid`` labels, an owner reference to the Job with
``controller: true``; not the ``batch.kubernetes.io/job-tracking`` finalizer, which the controller removes once
it has counted the Pod) and moved as a kubelet moves it:
Pending, Running, then Succeeded or Failed with each container's terminated state (exit code, reason, message,
startedAt, finishedAt).

A container does not run: its script is *read*. For ``sh -c <script>`` (also ``bash``, ``/bin/sh``, ``-ec`` and
the like) each ``echo`` prints its words (``$NAME`` and ``${NAME}`` taken from the container's plain ``env``
values), ``exit N`` ends the script with N, and ``> /dev/termination-log`` writes the termination message; any
other command succeeds and prints nothing. A container that is no shell script prints nothing and exits 0. The
output is the container's log (``kubectl logs``); the termination message follows the container's
``terminationMessagePolicy`` as the kubelet does: the file's content (4096 bytes at most), or with
``FallbackToLogsOnError`` and a failure, the last 80 lines of the log, 2048 bytes at most.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

__all__ = [
    "POWER_JOB_NODE",
    "ScriptRun",
    "pod_for_job",
    "read_script",
    "running_status",
    "terminated_status",
    "termination_message",
]

Obj = dict[str, Any]

# The node the power Jobs run on: a homelab's always-on machine. Named on the Pods, not registered as a Node: the
# operator lists every kubelet Node, and one no slot describes would be one more for it to skip.
POWER_JOB_NODE = "homelab-control-plane"
TERMINATION_LOG = "/dev/termination-log"
# The kubelet's bounds (pkg/kubelet/container): the message file, and the log tail of FallbackToLogsOnError.
MESSAGE_MAX_BYTES = 4096
FALLBACK_MAX_BYTES = 2048
FALLBACK_MAX_LINES = 80
_SHELLS = frozenset({"sh", "bash", "ash", "dash", "zsh"})
_SEPARATORS = frozenset({";", "&&", "||", "|", "&"})
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass(frozen=True)
class ScriptRun:
    """What one container does: its output (the log), its exit code, what it wrote to the termination-log file."""

    output: str = ""
    exit_code: int = 0
    message_file: str = ""


def _script_of(container: Mapping[str, Any]) -> str | None:
    argv = [str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
    if len(argv) < 3 or PurePosixPath(argv[0]).name not in _SHELLS:
        return None
    flags = argv[1]
    if not (flags.startswith("-") and "c" in flags):
        return None
    return argv[2]


def _statements(script: str) -> list[list[str]]:
    """The simple commands of a script, one list of words each (quotes honoured, comments dropped)."""
    out: list[list[str]] = []
    for line in script.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        try:
            tokens = list(lexer)
        except ValueError:  # an unbalanced quote: the shell would refuse the line; here it says nothing
            continue
        current: list[str] = []
        for token in tokens:
            if token in _SEPARATORS:
                out.append(current)
                current = []
            else:
                current.append(token)
        out.append(current)
    return [words for words in out if words]


def read_script(container: Mapping[str, Any]) -> ScriptRun:
    """What the container's shell script prints and how it ends (see the module's docstring for the reading)."""
    script = _script_of(container)
    if script is None:
        return ScriptRun()
    env = {
        str(e.get("name")): str(e.get("value"))
        for e in container.get("env") or []
        if isinstance(e, Mapping) and e.get("value") is not None
    }

    def expand(word: str) -> str:
        return _VARIABLE.sub(lambda m: env.get(m.group(1) or m.group(2), m.group(0)), word)

    output: list[str] = []
    message: list[str] = []
    for words in _statements(script):
        words, target = _redirect(words)
        command, args = words[0], [expand(w) for w in words[1:]]
        if command == "exit":
            code = int(args[0]) if args and args[0].lstrip("-").isdigit() else 0
            return ScriptRun(_text(output), code % 256, _text(message))
        if command != "echo":
            continue
        while args and args[0] in ("-n", "-e", "-ne", "-en"):
            args = args[1:]
        line = " ".join(args)
        if target == TERMINATION_LOG:
            message.append(line)
        elif target in ("", "&1", "&2"):
            output.append(line)
    return ScriptRun(_text(output), 0, _text(message))


def _redirect(words: list[str]) -> tuple[list[str], str]:
    """The words without their redirection, and where the output goes ("" stdout, "&2", or a file)."""
    for index, word in enumerate(words):
        if word in (">", ">>", ">&") and index + 1 < len(words):
            target = words[index + 1]
            return words[:index] or ["true"], f"&{target}" if word == ">&" else target
    return words, ""


def _text(lines: list[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


def termination_message(container: Mapping[str, Any], run: ScriptRun, log: str) -> str:
    """The container's terminated ``message`` as the kubelet fills it from its ``terminationMessagePolicy``."""
    message = run.message_file.encode()[:MESSAGE_MAX_BYTES].decode(errors="ignore")
    fallback = container.get("terminationMessagePolicy") == "FallbackToLogsOnError"
    if message or not fallback or run.exit_code == 0:
        return message
    tail = "".join(f"{line}\n" for line in log.splitlines()[-FALLBACK_MAX_LINES:])
    return tail.encode()[-FALLBACK_MAX_BYTES:].decode(errors="ignore")


def _pull_policy(image: str) -> str:
    """``SetDefaults_Container``: Always for ``:latest`` or no tag, else IfNotPresent."""
    tail = image.rsplit("/", 1)[-1]
    if "@" in tail:
        return "IfNotPresent"
    return "Always" if ":" not in tail or tail.endswith(":latest") else "IfNotPresent"


def _container_defaults(container: Mapping[str, Any]) -> Obj:
    out = dict(container)
    out.setdefault("terminationMessagePath", TERMINATION_LOG)
    out.setdefault("terminationMessagePolicy", "File")
    out.setdefault("imagePullPolicy", _pull_policy(str(container.get("image") or "")))
    out.setdefault("resources", {})
    return out


def pod_for_job(job: Mapping[str, Any], name: str, now: str) -> Obj:
    """The Pod the Job controller creates for ``job`` (Pending: not yet started by its kubelet)."""
    meta = job.get("metadata") or {}
    template = (job.get("spec") or {}).get("template") or {}
    template_meta = template.get("metadata") or {}
    spec = dict(template.get("spec") or {})
    spec["containers"] = [_container_defaults(c) for c in spec.get("containers") or []]
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    spec["nodeName"] = POWER_JOB_NODE
    pod_meta: Obj = {
        "name": name,
        "generateName": f"{meta.get('name')}-",
        "namespace": meta.get("namespace"),
        "labels": dict(template_meta.get("labels") or {}),
        "ownerReferences": [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": meta.get("name"),
                "uid": meta.get("uid"),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if template_meta.get("annotations"):
        pod_meta["annotations"] = dict(template_meta["annotations"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": pod_meta,
        "spec": spec,
        "status": {"phase": "Pending", "qosClass": _qos(spec), "conditions": [_condition("PodScheduled", True, now)]},
    }


def _qos(spec: Mapping[str, Any]) -> str:
    resources = [c.get("resources") or {} for c in spec.get("containers") or []]
    return "Burstable" if any(r.get("requests") or r.get("limits") for r in resources) else "BestEffort"


def _condition(kind: str, ok: bool, now: str, reason: str = "") -> Obj:
    condition: Obj = {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": now}
    if reason:
        condition["reason"] = reason
    return condition


def _ids(pod: Mapping[str, Any], container: Mapping[str, Any]) -> tuple[str, str]:
    """A containerd container id and an image id, stable for the Pod and the image."""
    uid = str((pod.get("metadata") or {}).get("uid"))
    image = str(container.get("image") or "")
    container_id = hashlib.sha256(f"{uid}/{container.get('name')}".encode()).hexdigest()
    image_id = hashlib.sha256(image.encode()).hexdigest()
    return f"containerd://{container_id}", f"{image.split(':')[0]}@sha256:{image_id}"


def running_status(pod: Mapping[str, Any], now: str) -> Obj:
    """The kubelet's status once every container started: Running and Ready."""
    statuses = []
    for container in (pod.get("spec") or {}).get("containers") or []:
        container_id, image_id = _ids(pod, container)
        statuses.append(
            {
                "name": container.get("name"),
                "image": container.get("image"),
                "imageID": image_id,
                "containerID": container_id,
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
                "lastState": {},
            }
        )
    conditions = [
        _condition(kind, True, now)
        for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    return {
        "phase": "Running",
        "conditions": conditions,
        "startTime": now,
        "containerStatuses": statuses,
        "qosClass": (pod.get("status") or {}).get("qosClass", "BestEffort"),
    }


def terminated_status(pod: Mapping[str, Any], exits: Mapping[str, tuple[int, str]], now: str) -> Obj:
    """The kubelet's status once every container ended: ``exits`` is each container's (exit code, message).

    Succeeded when all exited 0, else Failed; a container's reason is ``Completed`` or ``Error``, as containerd
    reports a plain exit.
    """
    status = dict(pod.get("status") or {})
    failed = any(code != 0 for code, _ in exits.values())
    reason = "PodFailed" if failed else "PodCompleted"
    statuses = []
    for previous in status.get("containerStatuses") or []:
        code, message = exits.get(str(previous.get("name")), (0, ""))
        started = ((previous.get("state") or {}).get("running") or {}).get("startedAt", now)
        terminated: Obj = {
            "exitCode": code,
            "reason": "Error" if code else "Completed",
            "startedAt": started,
            "finishedAt": now,
            "containerID": previous.get("containerID"),
        }
        if message:
            terminated["message"] = message
        statuses.append({**previous, "ready": False, "started": False, "state": {"terminated": terminated}})
    conditions = [
        _condition("PodReadyToStartContainers", False, now),
        _condition("Initialized", True, now, "" if failed else "PodCompleted"),
        _condition("Ready", False, now, reason),
        _condition("ContainersReady", False, now, reason),
        _condition("PodScheduled", True, now),
    ]
    return {
        **status,
        "phase": "Failed" if failed else "Succeeded",
        "conditions": conditions,
        "containerStatuses": statuses,
    }
