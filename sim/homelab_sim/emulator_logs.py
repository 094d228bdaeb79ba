"""Container logs and the ``pods/log`` subresource, as kube-apiserver serves them from the kubelet.

The emulator has no kubelets: whoever plays one (the simulated homelab runs the power Jobs' scripts) writes a
container's output here, keyed by the Pod's uid, and ``GET /api/v1/namespaces/NS/pods/NAME/log`` serves it as
text with the query parameters kubectl sends (``container``, ``tailLines``, ``limitBytes``, ``timestamps``,
``previous``; ``follow`` is streamed by the emulator). The refusals are the kubelet's and the API server's: no
container named when the Pod has several, a container that is not the Pod's, one still waiting to start, no
previous instance.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from homelab_sim.emulator_errors import ApiError

__all__ = ["ContainerLogs", "LogLine", "log_container", "render_log"]

Obj = dict[str, Any]


@dataclass(frozen=True)
class LogLine:
    """One line of a container's output and when it was written (``timestamps=true`` prints it)."""

    at: datetime.datetime
    text: str


@dataclass
class ContainerLogs:
    """Every container's output by (Pod uid, container name); a Pod removed takes its logs with it."""

    lines: dict[tuple[str, str], list[LogLine]] = field(default_factory=dict)

    def write(self, pod_uid: str, container: str, text: str, at: datetime.datetime) -> None:
        """Append ``text`` (one or more lines) to the container's log."""
        out = self.lines.setdefault((pod_uid, container), [])
        out.extend(LogLine(at, line) for line in text.splitlines())

    def of(self, pod_uid: str, container: str) -> list[LogLine]:
        return list(self.lines.get((pod_uid, container), ()))

    def forget(self, pod_uid: str) -> None:
        for key in [k for k in self.lines if k[0] == pod_uid]:
            del self.lines[key]


def _get(obj: Any, *path: str) -> Any:
    for part in path:
        obj = obj.get(part) if isinstance(obj, Mapping) else None
    return obj


def _status_of(pod: Obj, container: str) -> Obj | None:
    for status in _get(pod, "status", "containerStatuses") or []:
        if isinstance(status, Mapping) and status.get("name") == container:
            return dict(status)
    return None


def log_container(pod: Obj, params: Mapping[str, str]) -> str:
    """The container whose log is asked for, or the refusal a real server gives (400 BadRequest)."""
    name = str(_get(pod, "metadata", "name") or "")
    containers = [str(c.get("name")) for c in _get(pod, "spec", "containers") or [] if isinstance(c, Mapping)]
    container = params.get("container") or ""
    if not container:
        if len(containers) != 1:
            choices = " ".join(containers)
            raise ApiError(
                400, "BadRequest", f"a container name must be specified for pod {name}, choose one of: [{choices}]"
            )
        container = containers[0]
    if container not in containers:
        raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {name}")
    status = _status_of(pod, container) or {}
    if params.get("previous") in ("true", "1"):
        if not _get(status, "lastState", "terminated"):
            raise ApiError(400, "BadRequest", f'previous terminated container "{container}" in pod "{name}" not found')
        return container
    state = status.get("state") or {}
    if not state.get("running") and not state.get("terminated"):
        waiting = str(_get(state, "waiting", "reason") or "ContainerCreating")
        raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start: {waiting}')
    return container


def _stamp(moment: datetime.datetime) -> str:
    """RFC 3339 with nanoseconds, as the kubelet prefixes a line with ``timestamps=true``."""
    utc = moment.astimezone(datetime.UTC)
    return f"{utc:%Y-%m-%dT%H:%M:%S}.{utc.microsecond:06d}000Z"


def render_log(lines: list[LogLine], params: Mapping[str, str]) -> str:
    """The text of a log as asked: the last ``tailLines`` lines, ``timestamps``, at most ``limitBytes`` bytes."""
    try:
        tail = int(params["tailLines"]) if params.get("tailLines") not in (None, "") else None
        limit = int(params["limitBytes"]) if params.get("limitBytes") not in (None, "") else None
    except ValueError as err:
        raise ApiError(400, "BadRequest", f"invalid log options: {err}") from None
    if (tail is not None and tail < 0) or (limit is not None and limit < 1):
        raise ApiError(422, "Invalid", "tailLines must be >= 0 and limitBytes must be > 0")
    chosen = lines[-tail:] if tail else ([] if tail == 0 else lines)
    stamped = params.get("timestamps") in ("true", "1")
    text = "".join(f"{_stamp(line.at)} {line.text}\n" if stamped else f"{line.text}\n" for line in chosen)
    if limit is not None:
        text = text.encode()[:limit].decode(errors="ignore")
    return text
