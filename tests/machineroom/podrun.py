"""An example's power Job, run as its container would run on a node: the slot of a file in deploy/examples/power,
with only host names, addresses, image names and Secret values replaced (what docs/power-methods.md tells a user to
replace), becomes the Job the operator builds (activities.jobs.build_job, the operator's own code); its container
is resolved as a kubelet resolves one (env values, `secretKeyRef`, `envFrom`, `$(VAR)` references, Secret and
ConfigMap volumes as files of mode 0644, /dev/termination-log) and run by runc in the built image, inside the
machine room's network: the node's namespace for a host-network Pod, the pod network behind it otherwise.

Its outcome is what a kubelet would report: the exit code (None past activeDeadlineSeconds) and the termination
message by the container's policy (FallbackToLogsOnError: the file when it is not empty, else the log's last 80
lines, at most 2048 bytes, when the container failed). While it runs, every process's command line is read, so a
secret on one is caught. The claim side (tests/machineroom/test_claims_real.py) runs the same slots' Jobs on the real
node of issue 30 through the operator; this module is the script side's fast, direct run of each container.
"""

from __future__ import annotations

import copy
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from activities.jobs import build_job
from api.names import JobType
from api.v2alpha1 import Node
from tests.machineroom import runc

ROOT = Path(__file__).resolve().parents[2]
POWER_EXAMPLES = ROOT / "deploy" / "examples" / "power"
# kubelet's bounds on a termination message taken from the log (kubecontainer.MaxContainerTerminationMessageLog*).
LOG_LINES, LOG_BYTES, FILE_BYTES = 80, 2048, 4096

Secrets = Mapping[str, Mapping[str, str]]  # name -> key -> value (Secrets and ConfigMaps alike)


class ExampleChanged(AssertionError):
    """A replacement no longer matches the example: the test's map must follow the example."""


def localize(text: str, replacements: Mapping[str, str]) -> str:
    """An example's text with each key replaced by its value; every key must occur (else the example changed)."""
    for old, new in replacements.items():
        if old not in text:
            raise ExampleChanged(f"{old!r} is not in the example any more")
        text = text.replace(old, new)
    return text


def changed_values(before: Any, after: Any, where: str = "") -> list[tuple[str, Any, Any]]:
    """Every leaf that differs between two documents: (path, before, after)."""
    if isinstance(before, dict) and isinstance(after, dict):
        keys = sorted(set(before) | set(after))
        return [d for k in keys for d in changed_values(before.get(k), after.get(k), f"{where}.{k}")]
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [d for i, (b, a) in enumerate(zip(before, after, strict=True))
                for d in changed_values(b, a, f"{where}[{i}]")]  # fmt: skip
    return [] if before == after else [(where, before, after)]


def slot_of(path: Path, replacements: Mapping[str, str]) -> Node:
    """The example's slot (its one Node document), localized and validated as the API would."""
    docs = [d for d in yaml.safe_load_all(localize(path.read_text(), replacements)) if d]
    (doc,) = [d for d in docs if d.get("kind") == "Node"]
    doc.setdefault("metadata", {})["uid"] = "00000000-0000-4000-8000-000000000031"
    return Node.model_validate(doc)


def job_of(slot: Node, operation: JobType) -> dict[str, Any]:
    """The Job the operator creates for this slot and operation (the operator's own builder)."""
    name = f"{slot.metadata.name}-{operation}-test"
    return build_job(slot, operation, name, f"{slot.metadata.name}-claim", "00000000-0000-4000-8000-000000000032")


def _expand(text: str, env: Mapping[str, str]) -> str:
    """kubelet's `$(VAR)` expansion: a defined variable is replaced, `$$` is a literal `$`, the rest stays."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)  # fmt: skip


@dataclass(frozen=True)
class Resolved:
    """A container as the kubelet hands it to the runtime."""

    argv: list[str]
    env: dict[str, str]
    files: dict[str, dict[str, str]]  # mount path -> file name -> content
    host_network: bool
    deadline: int
    image: str
    termination_policy: str


def resolve(job: Mapping[str, Any], secrets: Secrets, config_maps: Secrets) -> Resolved:
    """The Job's container resolved against the cluster's Secrets and ConfigMaps; a missing one raises, naming it
    (the kubelet's CreateContainerConfigError)."""
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        ref, store, kind = ((source["secretRef"], secrets, "Secret") if "secretRef" in source
                            else (source["configMapRef"], config_maps, "ConfigMap"))  # fmt: skip
        if ref["name"] not in store:
            raise KeyError(f"{kind} {ref['name']!r} not found (envFrom)")
        env.update({source.get("prefix", "") + k: v for k, v in store[ref["name"]].items()})
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = _expand(item["value"], env)
            continue
        value_from = item.get("valueFrom") or {}
        ref, store, kind = ((value_from["secretKeyRef"], secrets, "Secret") if "secretKeyRef" in value_from
                            else (value_from["configMapKeyRef"], config_maps, "ConfigMap"))  # fmt: skip
        try:
            env[item["name"]] = store[ref["name"]][ref["key"]]
        except KeyError:
            raise KeyError(f"{kind} {ref['name']!r} has no key {ref['key']!r} (env {item['name']})") from None
    argv = [_expand(a, env) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    files: dict[str, dict[str, str]] = {}
    for mount in container.get("volumeMounts") or []:
        volume = volumes[mount["name"]]
        if "secret" in volume:
            name, store, kind = volume["secret"]["secretName"], secrets, "Secret"
        else:
            name, store, kind = volume["configMap"]["name"], config_maps, "ConfigMap"
        if name not in store:
            raise KeyError(f"{kind} {name!r} not found (volume {mount['name']})")
        files[mount["mountPath"]] = dict(store[name])
    return Resolved(argv, env, files, bool(pod.get("hostNetwork")), int(job["spec"]["activeDeadlineSeconds"]),
                    container["image"], container.get("terminationMessagePolicy", "File"))  # fmt: skip


def termination_message(policy: str, exit_code: int | None, file_text: str, log: str) -> str:
    """What the kubelet puts in the terminated state's message."""
    if file_text.strip():
        return file_text[:FILE_BYTES]
    if policy == "FallbackToLogsOnError" and exit_code != 0:
        tail = "\n".join(log.splitlines()[-LOG_LINES:])
        return tail.encode()[-LOG_BYTES:].decode(errors="replace")
    return ""


@dataclass
class Outcome:
    exit_code: int | None
    log: str
    message: str
    seconds: float
    leaks: list[str] = field(default_factory=list)

    @property
    def last_words(self) -> str:
        lines = [ln for ln in self.message.splitlines() if ln.strip()]
        return lines[-1] if lines else ""


class CmdlineWatch:
    """Reads every process's command line while a container runs: a secret seen on one is a leak."""

    def __init__(self, secrets: list[str]) -> None:
        self.secrets = [s for s in secrets if s]
        self.leaks: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CmdlineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.samples += 1
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit():
                    continue
                try:
                    cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                for s in self.secrets:
                    if s in cmdline:
                        self.leaks.append(f"pid {proc.name}: {cmdline[:200]}")


def run(job: Mapping[str, Any], *, rootfs: Path, workdir: Path, netns: str, secrets: Secrets,
        config_maps: Secrets, watch_for: list[str], run_id: str) -> Outcome:  # fmt: skip
    """Run the Job's container once (one Pod; the Job's retries are the claim side's) and report as a kubelet."""
    r = resolve(copy.deepcopy(dict(job)), secrets, config_maps)
    workdir.mkdir(parents=True, exist_ok=True)
    mounts: list[runc.Mount] = []
    for i, (path, content) in enumerate(sorted(r.files.items())):
        d = workdir / f"volume-{i}"
        d.mkdir(parents=True, exist_ok=True)
        for name, text in content.items():
            (d / name).write_text(text)
            (d / name).chmod(0o644)  # the kubelet's defaultMode
        mounts.append(runc.Mount(d, path))
    termination = workdir / "termination-log"
    termination.write_text("")
    termination.chmod(0o666)
    mounts.append(runc.Mount(termination, "/dev/termination-log", readonly=False))
    container = runc.Container(id=f"{run_id}-{workdir.name}", image_rootfs=rootfs, workdir=workdir, args=r.argv,
                               netns=netns, env=r.env, mounts=mounts)  # fmt: skip
    began = time.monotonic()
    try:
        with CmdlineWatch(watch_for) as watch:
            container.start()
            code = container.wait(r.deadline)
    finally:
        container.remove()
    log = container.log.read_text(errors="replace")
    if "runc run failed" in log:  # the runtime, not the script: a kubelet would say StartError (exit 128)
        raise RuntimeError(f"runc could not start {r.argv[:2]}: {log.strip()[-500:]}")
    message = termination_message(r.termination_policy, code, termination.read_text(), log)
    leaks = list(watch.leaks)
    leaks += [f"log: {s[:4]}…" for s in watch_for if s and s in log]
    leaks += [f"termination message: {s[:4]}…" for s in watch_for if s and s in message]
    return Outcome(code, log, message, time.monotonic() - began, leaks)
