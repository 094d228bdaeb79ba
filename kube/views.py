"""Pure readers: what the operator's objects say, parsed at the boundary, with a problem instead of an exception.

Everything read from Kubernetes passes through here before it reaches a workflow or a report: an object the
contracts refuse yields a one-line problem naming the field, and the object is skipped where it is used. A
problem never carries a value from a pod spec (env values, Secret or ConfigMap names, commands, images): only
the path of the field that is wrong and what is wrong with it.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from api import contracts as c
from api import names
from api.v2alpha1 import GroupSpec, Node, NodeClaimSpec, NodeClaimStatus, NodeSpec, PowerDraw, parse_duration
from domain import law
from kube.objects import meta, spec, status

M = TypeVar("M", bound=BaseModel)

JSON = dict[str, Any]

# Fields of a slot whose contents are the user's secrets or commands: a problem there says where, never what.
POD_SPEC_FIELDS = ("startupPodSpec", "shutdownPodSpec")
# Where client-side `kubectl apply` keeps the document it applied, unknown fields included.
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# What the API server quotes back in a refusal ("Invalid value: \"...\""), dropped before anything is logged.
_QUOTED_VALUE = re.compile(r'(Invalid value|Unsupported value|Duplicate value): ("(?:[^"\\]|\\.)*"|\S+)')


def field_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a Kubernetes field path: `spec.startupPodSpec.env[0].value`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def problem_of(err: ValidationError, prefix: str = "") -> str:
    """The first error of a validation as `path: what is wrong` (never the value that was given)."""
    first = err.errors(include_input=False, include_url=False)[0]
    path = field_path(tuple(first["loc"]))
    what = str(first["msg"]).removeprefix("Value error, ")
    where = ".".join(p for p in (prefix, path) if p)
    return f"{where}: {what}" if where else what


def pruned_field(obj: Mapping[str, Any] | None, model: type[BaseModel]) -> str:
    """The first field of the spec a person applied that is not in the schema ("" when none): a typo.

    The API server prunes unknown fields before anyone reads the object (`fieldValidation=Ignore`, which
    `kubectl apply --validate=false` sends, or `Warn`, the default of most clients), so the stored spec cannot
    show a typo; the document `kubectl apply` keeps in the last-applied annotation still does. Only fields the
    schema does not know are reported: a known field missing from the object was removed since, not pruned.
    """
    annotations = meta(obj).get("annotations")
    raw = annotations.get(LAST_APPLIED) if isinstance(annotations, Mapping) else None
    if not isinstance(raw, str):
        return ""
    try:
        applied = json.loads(raw)
    except ValueError:
        return ""
    applied_spec = applied.get("spec") if isinstance(applied, dict) else None
    if not isinstance(applied_spec, dict):
        return ""
    try:
        model.model_validate(applied_spec)
    except ValidationError as err:
        for error in err.errors(include_input=False, include_url=False):
            if error["type"] == "extra_forbidden":
                where = field_path(("spec", *error["loc"]))
                return f"{where}: unknown field, dropped by the API server from what kubectl applied"
    return ""


def without_values(message: str) -> str:
    """An API server refusal with the quoted values taken out (they may be a pod spec's env values)."""
    return _QUOTED_VALUE.sub(r"\1", message)


def time_of(value: Any) -> datetime | None:
    """An RFC 3339 timestamp from an object (None when absent or unreadable: a view must not fail on it)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


# --- groups ------------------------------------------------------------------------------------------------
def group_spec(group: Mapping[str, Any] | None) -> GroupSpec | str:
    """The Group's spec, or the problem that makes it unusable (its values are the operator's own: shown)."""
    try:
        found = GroupSpec.model_validate(spec(group))
    except ValidationError as err:
        detail = err.errors(include_url=False)[0]
        problem = problem_of(err, "spec")
        if "input" in detail and not isinstance(detail["input"], dict | list):
            problem += f" (got {detail['input']!r})"
        return problem
    return pruned_field(group, GroupSpec) or found


# --- slots -------------------------------------------------------------------------------------------------
def slot_problem(slot: Mapping[str, Any] | None) -> str:
    """Why a slot cannot power its machine ("" when it can): its spec, pod specs included, against the model, and
    a typo the API server pruned from what was applied (a pod spec missing the command a person meant to give).
    """
    try:
        Node.model_validate({**dict(slot or {}), "status": {}})
    except ValidationError as err:
        return problem_of(err)
    return pruned_field(slot, NodeSpec)


def attempts_reset_at(slot: Mapping[str, Any] | None) -> datetime | None:
    """The slot's reset-attempts annotation: the claims before it leave the boot-attempt streak."""
    annotations = meta(slot).get("annotations") or {}
    return time_of(annotations.get(names.ANNOTATION_RESET_ATTEMPTS)) if isinstance(annotations, dict) else None


# --- usage figures ----------------------------------------------------------------------------------------
def model_or_none(model: type[M], raw: Any) -> M | None:
    """`raw` read as `model`, or None when it is absent or does not fit (what is stored is data, never trusted)."""
    if not isinstance(raw, Mapping):
        return None
    try:
        return model.model_validate(raw)
    except ValidationError:
        return None


def power_draw(obj: Mapping[str, Any] | None) -> PowerDraw | None:
    """A slot's or Group's `spec.powerDraw` (None when absent, or unreadable: the object's Valid condition says why)."""
    return model_or_none(PowerDraw, spec(obj).get("powerDraw"))


def usage_reset(obj: Mapping[str, Any] | None) -> tuple[datetime | None, str]:
    """The time of a slot's or Group's reset-usage annotation, or why its value is none ("" when it is, or there is
    no annotation). Annotations are not secrets: the value is quoted."""
    annotations = meta(obj).get("annotations") or {}
    value = annotations.get(names.ANNOTATION_RESET_USAGE) if isinstance(annotations, Mapping) else None
    if value is None:
        return None, ""
    when = time_of(value)
    if when is None:
        where = f"metadata.annotations[{names.ANNOTATION_RESET_USAGE}]"
        return None, f"{where}: {str(value)[:64]!r} is not an RFC 3339 time (say 2030-01-01T00:00:00Z)"
    return when, ""


# --- Jobs --------------------------------------------------------------------------------------------------
def job_owners(job: Mapping[str, Any] | None) -> tuple[str, str]:
    """The full names of the slot and the claim a lifecycle Job belongs to ("" for none).

    Read from its owner references: its labels carry names bounded to 63 characters (`names.label_value`), which a
    long name does not survive. A Job with no owner of ours (made by hand) is read by its labels.
    """
    slot = claim = ""
    for ref in meta(job).get("ownerReferences") or []:
        if not isinstance(ref, Mapping) or ref.get("apiVersion") != names.API_VERSION:
            continue
        if ref.get("kind") == names.KIND_NODE:
            slot = str(ref.get("name") or "")
        elif ref.get("kind") == names.KIND_NODECLAIM:
            claim = str(ref.get("name") or "")
    if slot or claim:
        return slot, claim
    labels = meta(job).get("labels") or {}
    if not isinstance(labels, Mapping):
        return "", ""
    return str(labels.get(names.LABEL_NODE) or ""), str(labels.get(names.LABEL_NODECLAIM) or "")


def claim_jobs(claim: Mapping[str, Any], jobs: Iterable[Mapping[str, Any]], now: datetime) -> tuple[c.JobRecord, ...]:
    """The claim's own lifecycle Jobs among `jobs`: owned by it (a claim owner of another uid is another claim of
    that name), or labelled with it when made without owners; by name. `now` is the reader's clock, for their age."""
    m = meta(claim)
    name, uid = str(m.get("name") or ""), str(m.get("uid") or "")
    found = []
    for job in jobs:
        if job_owners(job)[1] != name and not (
            not meta(job).get("ownerReferences")
            and (meta(job).get("labels") or {}).get(names.LABEL_NODECLAIM) == names.label_value(name)
        ):
            continue
        owner_uids = {
            str(ref.get("uid") or "")
            for ref in meta(job).get("ownerReferences") or []
            if isinstance(ref, Mapping) and ref.get("kind") == names.KIND_NODECLAIM and ref.get("uid")
        }
        if owner_uids and uid and uid not in owner_uids:
            continue
        job_type = str((meta(job).get("labels") or {}).get(names.LABEL_JOB_TYPE) or "")
        if job_type not in (names.JobType.STARTUP, names.JobType.SHUTDOWN):
            continue
        job_name = str(meta(job).get("name") or "")
        state = job_status(job_name, job)
        created = time_of(meta(job).get("creationTimestamp"))
        attempt = str((meta(job).get("annotations") or {}).get(names.ANNOTATION_SHUTDOWN_ATTEMPT) or "")
        found.append(
            c.JobRecord(
                name=job_name,
                job_type=job_type,
                state=state.state,
                reason=state.reason,
                age_seconds=max((now - created).total_seconds(), 0.0) if created else 0.0,
                attempt=int(attempt) if attempt.isdigit() else 0,
                sequence=c.job_sequence(job_name, job_type),
            )
        )
    return tuple(sorted(found, key=lambda j: j.name))


# --- claims ------------------------------------------------------------------------------------------------
def claim_problem(claim: Mapping[str, Any] | None) -> str:
    """Why a claim resource cannot be run ("" when it can): its spec and the status its workflow wrote."""
    try:
        NodeClaimSpec.model_validate(spec(claim))
    except ValidationError as err:
        return problem_of(err, "spec")
    try:
        NodeClaimStatus.model_validate(status(claim))
    except ValidationError as err:
        return problem_of(err, "status")
    return pruned_field(claim, NodeClaimSpec)


_EPOCH = datetime.min.replace(tzinfo=UTC)


def claim_order(claim: Mapping[str, Any]) -> tuple[datetime, datetime, str]:
    """Newest last: by spec.requestedAt, then creationTimestamp, then name (the one-live-claim rule's order)."""
    requested = time_of(spec(claim).get("requestedAt")) or _EPOCH
    created = time_of(meta(claim).get("creationTimestamp")) or _EPOCH
    return (requested, created, str(meta(claim).get("name") or ""))


def claim_is_live(claim: Mapping[str, Any] | None) -> bool:
    """A claim resource that wants its slot: no phase yet (read as pending), pending, booting or ready. A phase the
    API does not define is no want (the group leaves such a claim out: nothing runs it)."""
    try:
        return law.is_live(status(claim).get("phase") or None)
    except ValueError:
        return False


def claim_ttl_seconds(claim: Mapping[str, Any] | None) -> int:
    value = spec(claim).get("ttlSecondsAfterFinished")
    return value if isinstance(value, int) and value >= 0 else names.CLAIM_TTL_SECONDS_AFTER_FINISHED


def claim_max_provision_seconds(claim: Mapping[str, Any] | None) -> float:
    try:
        return parse_duration(spec(claim).get("maxNodeProvisionTime") or 0).total_seconds()
    except ValueError:
        return 0.0


def claim_view(claim: Mapping[str, Any], now: datetime) -> c.ClaimView | None:
    """A claim resource as the group (and the watchers) read it: no phase yet is pending; None when it cannot be
    run. `now` stands for a condition's lost clock (a lastTransitionTime missing or unreadable)."""
    if claim_problem(claim):
        return None
    st, m = status(claim), meta(claim)
    return c.ClaimView(
        name=str(m.get("name")),
        slot=str(spec(claim).get("node") or ""),
        phase=str(st.get("phase") or names.ClaimPhase.PENDING),
        attempt=int(st.get("attempt") or 1),
        call=str(spec(claim).get("call") or names.ClaimCall.MANUAL),
        marked=bool(m.get("deletionTimestamp")),
        # A claim written by hand may leave requestedAt out: it was asked for when it was created.
        requested_at=time_of(spec(claim).get("requestedAt")) or time_of(m.get("creationTimestamp")),
        deadline_at=time_of(spec(claim).get("deadlineAt")),
        finished_at=time_of(st.get("finishedAt")),
        reason=str(st.get("reason") or ""),
        ttl_seconds=claim_ttl_seconds(claim),
        max_provision_seconds=claim_max_provision_seconds(claim),
        has_attempt=isinstance(st.get("attempt"), int),
        record=claim_record(claim, now),
    )


def claim_record(claim: Mapping[str, Any] | None, now: datetime) -> c.ClaimRecord | None:
    """What the claim's status holds of the runs that wrote it, for a run started from the resource to continue
    (None when nothing was ever recorded: a claim applied by hand)."""
    st = status(claim)
    revision = st.get("revision")
    if not st.get("phase") and not isinstance(revision, int):
        return None
    conditions = tuple(
        c.ConditionRecord(
            type=str(cd["type"]),
            status=cd.get("status") == "True",
            since=time_of(cd.get("lastTransitionTime")) or now,
            reason=str(cd.get("reason") or ""),
            message=str(cd.get("message") or ""),
        )
        for cd in st.get("conditions") or []
        if isinstance(cd, Mapping) and cd.get("type")
    )
    attempts = st.get("shutdownAttempts")
    return c.ClaimRecord(
        revision=revision if isinstance(revision, int) and revision > 0 else 0,
        message=without_last_words(str(st.get("message") or "")),
        shutdown_attempts=attempts if isinstance(attempts, int) and attempts > 0 else 0,
        last_shutdown_attempt_at=time_of(st.get("lastShutdownAttemptAt")),
        finished_at=time_of(st.get("finishedAt")),
        conditions=conditions,
    )


def status_edit(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> c.StatusEdit | None:
    """A person's edit of a claim's status between two versions: the fields its workflow owns changed while the
    revision its workflow numbers every write with did not (None for anything else, the workflow's own writes
    included; a claim not yet numbered cannot be told apart and is left out)."""
    before, after = status(old), status(new)
    revision = after.get("revision")
    if old is None or not isinstance(revision, int) or revision <= 0 or before.get("revision") != revision:
        return None
    owned = {key: after.get(key) for key in names.OWNED_CLAIM_STATUS}
    if owned == {key: before.get(key) for key in names.OWNED_CLAIM_STATUS}:
        return None
    message = owned.get("message")
    if isinstance(message, str):
        owned["message"] = without_last_words(message)
    return c.StatusEdit(revision, {key: value for key, value in owned.items() if value is not None})


_TEMPLATE_STATUS_FIELDS = ("capacity", "allocatable", "nodeInfo")
_CORDON_TAINT = "node.kubernetes.io/unschedulable"


def readiness_taints(group: Mapping[str, Any] | None) -> list[JSON]:
    """The group's readiness taints; the CRD default when the group (or the field) is absent, none for `[]`."""
    fields = spec(group)
    if "nodeReadinessTaints" in fields:
        return [dict(t) for t in fields.get("nodeReadinessTaints") or []]
    return [{"key": key, "effect": effect} for key, effect in names.DEFAULT_READINESS_TAINTS]


def observe(node: Mapping[str, Any] | None, taints: list[JSON], observed_at: datetime) -> c.Observation:
    """The facts the law and the readiness gate read off a kubelet Node (None: the Node does not exist)."""
    gate_open = False
    if node is not None:
        uncordoned = copy.deepcopy(dict(node))
        spec(uncordoned).pop("unschedulable", None)
        gate_open = not law.unusable(uncordoned, taints)  # Ready and free of readiness taints, cordon aside
    return c.Observation(
        power=str(law.power_of(node)),
        usable=not law.unusable(node, taints),
        exists=node is not None,
        gate_open=gate_open,
        observed_at=observed_at,
        resource_version=str(meta(node).get("resourceVersion") or ""),
    )


def template_of(node: Mapping[str, Any], taints: list[JSON], taken_at: datetime) -> JSON:
    """A sanitized copy of a kubelet Node for scale-from-zero: labels, lasting taints, capacity; no live state.

    Readiness taints and the cordon are dropped: they describe one boot of one machine, not the group's nodes.
    """
    node_meta = meta(node)
    transient = {(str(t.get("key")), t.get("effect")) for t in taints} | {(_CORDON_TAINT, "NoSchedule")}
    transient_keys = {k for k, e in transient if e is None}
    lasting = [
        dict(t)
        for t in spec(node).get("taints") or []
        if (str(t.get("key")), t.get("effect")) not in transient and str(t.get("key")) not in transient_keys
    ]
    node_status = status(node)
    template: JSON = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node_meta.get("name"),
            "labels": dict(node_meta.get("labels") or {}),
            "annotations": {names.ANNOTATION_TEMPLATE_SNAPSHOT_AT: taken_at.strftime("%Y-%m-%dT%H:%M:%SZ")},
        },
        "spec": {"taints": lasting} if lasting else {},
        "status": {k: copy.deepcopy(node_status[k]) for k in _TEMPLATE_STATUS_FIELDS if k in node_status},
    }
    return template


def job_status(name: str, job: Mapping[str, Any] | None) -> c.JobStatus:
    """A Job's state from its conditions: Complete/SuccessCriteriaMet succeeded, Failed/FailureTarget failed."""
    if job is None:
        return c.JobStatus(name, c.JOB_MISSING)
    conditions = {
        str(cond.get("type")): cond
        for cond in status(job).get("conditions") or []
        if isinstance(cond, dict) and cond.get("status") == "True"
    }
    for kind in ("Failed", "FailureTarget"):
        if kind in conditions:
            return c.JobStatus(name, c.JOB_FAILED, str(conditions[kind].get("reason") or kind))
    for kind in ("Complete", "SuccessCriteriaMet"):
        if kind in conditions:
            return c.JobStatus(name, c.JOB_SUCCEEDED)
    return c.JobStatus(name, c.JOB_RUNNING)


def template_from_status(slot: str, node_name: str, doc: Any) -> JSON | None:
    """The slot report's snapshot of its deleted kubelet Node (powerOffNodePolicy: Delete), as a template Node."""
    if not isinstance(doc, dict) or not (doc.get("labels") or doc.get("capacity")):
        return None
    taken = doc.get("takenAt")
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node_name or slot,
            "labels": dict(doc.get("labels") or {}),
            "annotations": {names.ANNOTATION_TEMPLATE_SNAPSHOT_AT: str(taken)} if taken else {},
        },
        "spec": {"taints": [dict(t) for t in doc.get("taints") or []]},
        "status": {"capacity": dict(doc.get("capacity") or {}), "allocatable": dict(doc.get("allocatable") or {})},
    }


# --- why a lifecycle Job failed ----------------------------------------------------------------------------
# A cause keeps the end of a container's termination message (where a script says what went wrong), bounded so
# it fits a claim's status message and an Event: at most this many lines, then this many characters.
CAUSE_MESSAGE_LINES = 5
CAUSE_MESSAGE_CHARS = 400
# What happened when no container's terminated state says it: `api.contracts` holds them (a history may hold them).
CAUSE_JOB_GONE = c.CAUSE_JOB_GONE
CAUSE_NO_POD = c.CAUSE_NO_POD
CAUSE_NOT_TERMINATED = c.CAUSE_NOT_TERMINATED
CAUSE_DEADLINE = c.CAUSE_DEADLINE


@dataclass(frozen=True)
class JobCause:
    """Why a lifecycle Job failed, read off its Pods.

    `exit_code` and `reason` are Kubernetes' own words and numbers (a container's exit code and terminated or
    waiting reason, or one of the `CAUSE_*` when no container said it): they may travel through a workflow
    history, as `exit`. `message` is the container's termination message (its last words: with
    `FallbackToLogsOnError` the end of its log), which may hold a script's secrets: it is for the cluster (a
    claim's status, an Event) and people, never for a history. `pod` is the Pod read ("" when none).
    """

    reason: str
    exit_code: int | None = None
    message: str = ""
    pod: str = ""
    signal: int | None = None
    deadline_seconds: int | None = None

    @property
    def exit(self) -> c.JobExit:
        """What a workflow may learn of it: everything but the message."""
        return c.JobExit(self.reason, self.exit_code, self.signal, self.pod, self.deadline_seconds)

    def summary(self) -> str:
        """One line for people: `exit code 1 (Error): <message>`, or what happened instead."""
        head = self.exit.said()
        return f"{head}: {self.message}" if self.message else head


def without_last_words(message: str) -> str:
    """A claim's status message as its workflow wrote it: the termination message an activity added after
    `LAST_WORDS_MARK` cut off, so what is read back into a workflow (a record, an edit) never carries it."""
    return message.partition(c.LAST_WORDS_MARK)[0]


def trimmed_message(text: str) -> str:
    """The end of a termination message on one line: its last `CAUSE_MESSAGE_LINES` non-empty lines joined by
    ` | `, at most `CAUSE_MESSAGE_CHARS` characters of their end; a leading `…` says something was cut."""
    lines = [" ".join(line.split()) for line in text.splitlines()]
    lines = [line for line in lines if line]
    one = " | ".join(lines[-CAUSE_MESSAGE_LINES:])
    cut = len(lines) > CAUSE_MESSAGE_LINES
    if len(one) >= CAUSE_MESSAGE_CHARS:
        one, cut = one[-(CAUSE_MESSAGE_CHARS - 1) :], True
    return f"…{one}" if cut else one


def job_pod_selector(job: Mapping[str, Any]) -> str:
    """The label selector of a Job's Pods: its `spec.selector` (the API server generates one matching its uid),
    else the `batch.kubernetes.io/job-name` label the Job controller puts on them."""
    selector = spec(job).get("selector")
    parts: list[str] = []
    if isinstance(selector, Mapping):
        for key, value in sorted((selector.get("matchLabels") or {}).items()):
            parts.append(f"{key}={value}")
        for expression in selector.get("matchExpressions") or []:
            key, operator = expression.get("key"), expression.get("operator")
            values = ",".join(str(v) for v in expression.get("values") or [])
            parts.append(
                {"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})", "Exists": str(key)}.get(
                    str(operator), f"!{key}"
                )
            )
    return ",".join(parts) or f"batch.kubernetes.io/job-name={meta(job).get('name')}"


def _created(pod: Mapping[str, Any]) -> tuple[datetime, str]:
    return time_of(meta(pod).get("creationTimestamp")) or datetime.min.replace(tzinfo=UTC), str(meta(pod).get("name"))


def _failed_container(pod: Mapping[str, Any]) -> JSON | None:
    """The container status that says why the Pod failed: the first that exited non-zero, else one waiting with a
    reason (an image it cannot pull, a Secret it cannot mount), else the first that ended."""
    statuses = [s for s in status(pod).get("containerStatuses") or [] if isinstance(s, Mapping)]
    ended = [s for s in statuses if isinstance((s.get("state") or {}).get("terminated"), Mapping)]
    for candidate in ended:
        if candidate["state"]["terminated"].get("exitCode") not in (0, None):
            return dict(candidate)
    waiting = [s for s in statuses if ((s.get("state") or {}).get("waiting") or {}).get("reason")]
    return dict(waiting[0]) if waiting else (dict(ended[0]) if ended else None)


def job_cause(job: Mapping[str, Any] | None, pods: list[JSON]) -> JobCause:
    """Why `job` failed, from its Pods (the ones it controls; the newest that failed speaks, else the newest).

    A Job past its activeDeadlineSeconds says so (its running Pod was deleted: the exit code is a Pod's that had
    ended before, if any); no Pod left, or one that never ended, is said as such.
    """
    if job is None:
        return JobCause(CAUSE_JOB_GONE)
    uid = meta(job).get("uid")
    owned = [
        p
        for p in pods
        if not uid or any(isinstance(r, Mapping) and r.get("uid") == uid for r in meta(p).get("ownerReferences") or [])
    ]
    owned.sort(key=_created, reverse=True)
    deadline = spec(job).get("activeDeadlineSeconds")
    past_deadline = job_status(str(meta(job).get("name")), job).reason == CAUSE_DEADLINE
    extra: dict[str, Any] = {"deadline_seconds": deadline if isinstance(deadline, int) else None}
    speaking = next((p for p in owned if _failed_container(p) is not None), owned[0] if owned else None)
    if speaking is None:
        return JobCause(CAUSE_DEADLINE if past_deadline else CAUSE_NO_POD, **extra)
    pod_name = str(meta(speaking).get("name"))
    container = _failed_container(speaking)
    state = (container or {}).get("state") or {}
    terminated, waiting = state.get("terminated"), state.get("waiting")
    if isinstance(terminated, Mapping):
        code = terminated.get("exitCode")
        signal = terminated.get("signal")
        return JobCause(
            CAUSE_DEADLINE if past_deadline else str(terminated.get("reason") or "Error"),
            exit_code=code if isinstance(code, int) else None,
            message=trimmed_message(str(terminated.get("message") or "")),
            pod=pod_name,
            signal=signal if isinstance(signal, int) and signal else None,
            **extra,
        )
    if past_deadline:
        return JobCause(CAUSE_DEADLINE, pod=pod_name, **extra)
    if isinstance(waiting, Mapping):
        message = trimmed_message(str(waiting.get("message") or ""))
        return JobCause(str(waiting.get("reason")), message=message, pod=pod_name, **extra)
    pod_reason = str(status(speaking).get("reason") or "")
    if pod_reason:  # the Pod itself failed: Evicted, its own DeadlineExceeded...
        message = trimmed_message(str(status(speaking).get("message") or ""))
        return JobCause(pod_reason, message=message, pod=pod_name, **extra)
    return JobCause(CAUSE_NOT_TERMINATED, pod=pod_name, **extra)
