"""Every side effect of the workflows on Kubernetes, as synchronous Temporal activities over one shared `Kube`.

Activities take names and read what they need from the resources, so no pod spec or Secret reference ever lands
in a workflow history. Each is idempotent under retry (deterministic names, compare-and-set, "already gone is
done"). Errors: `Transient` and `Conflict` are raised as they are, so Temporal retries; what retrying cannot fix
is an `ApplicationError` with `non_retryable=True` and a type the workflows' retry policies name
(`SlotDeleted`, `InvalidPodSpec`, `NotFound`, `Invalid`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.drain import blocked_words, drain_round
from activities.jobs import build_job, pod_spec_field
from activities.tell import tell_group
from api import contracts as c
from api import names
from api.names import Failure, JobType
from api.v2alpha1 import (
    DEFAULT_DRAIN_TIMEOUT,
    ClaimDigest,
    Node,
    NodeClaim,
    NodeClaimSpec,
    ObjectMeta,
    OwnerReference,
    parse_duration,
)
from domain.drain import forced
from kube import views
from kube.adapter import CLAIMS, GROUPS, JOBS, SLOTS, Kube, ObjectRef
from kube.errors import Invalid, KubeError, NotFound
from kube.objects import meta as _meta
from kube.objects import spec as _spec
from kube.objects import status as _status
from kube.views import job_status, observe, readiness_taints, template_from_status, template_of

log = logging.getLogger(__name__)

JSON = dict[str, Any]

SLOT_DELETED = Failure.SLOT_DELETED
INVALID_POD_SPEC = Failure.INVALID_POD_SPEC
NOT_FOUND = Failure.NOT_FOUND
INVALID = Failure.INVALID

# A snapshot for scale-from-zero keeps what cluster-autoscaler plans with, nothing that names one machine's state.


def utc_now() -> datetime:
    """The activities' default clock (observations are stamped with it)."""
    return datetime.now(UTC)


def _occurrence() -> datetime | None:
    """When this activity was first scheduled: stable across its retries, ordered across a workflow's writes.

    Events are named from it, so each claim move is its own Event and they list in order. Called directly (tests,
    no activity context) there is none, and repeats of the same Event bump its count instead.
    """
    if not activity.in_activity():
        return None
    scheduled = activity.info().scheduled_time
    return scheduled if scheduled.timestamp() > 0 else None


def _fail(kind: str, message: str) -> ApplicationError:
    return ApplicationError(message, type=kind, non_retryable=True)


@contextmanager
def _mapped(what: str) -> Iterator[None]:
    """Turn what retrying cannot fix into non-retryable errors; let Transient, Conflict and the rest retry."""
    try:
        yield
    except NotFound as exc:
        raise _fail(NOT_FOUND, f"{what}: {exc}") from exc
    except Invalid as exc:
        raise _fail(INVALID, f"{what}: {views.without_values(str(exc))}") from None


class KubeActivities:
    """The activities, bound to one `Kube` adapter shared by the worker's thread pool (the client is thread-safe).

    Register with `Worker(..., activities=KubeActivities(kube).all(), activity_executor=ThreadPoolExecutor(...))`.
    `clock` stamps observations (tests pin it).
    """

    def __init__(self, kube: Kube, *, clock: Callable[[], datetime] = utc_now) -> None:
        self.kube = kube
        self.clock = clock

    def all(self) -> list[Callable[..., Any]]:
        """The bound activity methods, for `Worker(activities=...)`."""
        return [
            self.record_scale,
            self.create_claim,
            self.create_claim_held,
            self.record_claim,
            self.add_claim_finalizer,
            self.release_claim,
            self.delete_claim,
            self.create_job,
            self.read_job,
            self.read_job_exit,
            self.observe_slot,
            self.cordon_slot,
            self.uncordon_slot,
            self.open_gate,
            self.slot_event,
            self.drain_slot,
            self.drain_blocked,
            self.load_group,
            tell_group,
        ]

    # --- reads shared by several activities --------------------------------------------------------------
    def _slot(self, namespace: str, slot: str) -> JSON:
        """The slot as stored; gone is `SlotDeleted`, which no retry can fix."""
        try:
            return self.kube.get_raw(SLOTS, namespace, slot)
        except NotFound as exc:
            raise _fail(SLOT_DELETED, f"slot {namespace}/{slot} is deleted") from exc

    def _group(self, namespace: str, group: str) -> JSON | None:
        try:
            return self.kube.get_raw(GROUPS, namespace, group)
        except NotFound:
            return None

    def _node_name(self, slot: Mapping[str, Any], namespace: str, name: str) -> str:
        node_name = _spec(slot).get("kubernetesNodeName")
        if not isinstance(node_name, str) or not node_name:
            raise _fail(INVALID, f"slot {namespace}/{name} has no spec.kubernetesNodeName")
        return node_name

    # --- claims ------------------------------------------------------------------------------------------
    @activity.defn(name=c.Act.CREATE_CLAIM)
    def create_claim(self, seed: c.ClaimSeed) -> None:
        """Create the NodeClaim resource, owned by its slot (deleting a slot takes its claims), stamp its first
        status (its phase, attempt and reason) and publish ClaimCreated; a retry finds it and writes nothing new.
        """
        self._create_claim(seed, held=False)

    @activity.defn(name=c.Act.CREATE_CLAIM_HELD)
    def create_claim_held(self, seed: c.ClaimSeed) -> None:
        """As `create_claim`, with the finalizer in the create: the claim is held from its first write, so its
        workflow needs no separate finalizer write (and a claim deleted by hand waits for its workflow).
        """
        self._create_claim(seed, held=True)

    def _create_claim(self, seed: c.ClaimSeed, *, held: bool) -> None:
        what = f"create claim {seed.namespace}/{seed.name}"
        slot = self._slot(seed.namespace, seed.slot)
        try:
            claim = self._claim_of(seed, str(_meta(slot).get("uid") or ""))
            if held:
                claim.metadata.finalizers = [names.FINALIZER_CLAIM]
        except (ValidationError, ValueError) as exc:
            raise _fail(Failure.CLAIM_REFUSED, f"{what}: the seed does not make a valid claim: {exc}") from exc
        try:
            created = self.kube.create_claim(claim)
        except Invalid as exc:
            raise _fail(Failure.CLAIM_REFUSED, f"{what}: {views.without_values(str(exc))}") from None
        with _mapped(what):
            uid = created.metadata.uid or ""
            # A retry whose first attempt stored the status goes on to the Event (named by its occurrence, so an
            # Event that landed too is found, not repeated): the Event follows the write that landed, always.
            if created.status.phase is None:
                written = self.kube.patch_raw(
                    CLAIMS,
                    seed.namespace,
                    seed.name,
                    {"status": {"phase": seed.phase, "attempt": seed.attempt, "reason": seed.reason or None}},
                    status=True,
                )
                uid = str(_meta(written).get("uid") or uid)
            ref = ObjectRef(names.KIND_NODECLAIM, seed.namespace, seed.name, uid)
            self.kube.create_event(
                ref,
                names.EventReason.CLAIM_CREATED,
                f"attempt {seed.attempt} for slot {seed.slot} ({seed.call})",
                warning=False,
                now=self.clock(),
                occurrence=_occurrence(),
            )

    @staticmethod
    def _claim_of(seed: c.ClaimSeed, slot_uid: str) -> NodeClaim:
        """The claim resource a seed describes: labelled with its slot and group (bounded), owned by the slot."""
        return NodeClaim(
            metadata=ObjectMeta(
                name=seed.name,
                namespace=seed.namespace,
                labels=_claim_labels(seed.slot, seed.group),
                owner_references=[_slot_owner(seed.slot, slot_uid)],
            ),
            spec=NodeClaimSpec(
                node=seed.slot,
                group=seed.group,
                requested_at=seed.requested_at,
                deadline_at=seed.deadline_at,
                max_node_provision_time=parse_duration(seed.max_provision_seconds)
                if seed.max_provision_seconds > 0
                else None,
                ttl_seconds_after_finished=seed.ttl_seconds,
                call=names.ClaimCall(seed.call),
            ),
        )

    @activity.defn(name=c.Act.RECORD_CLAIM)
    def record_claim(self, w: c.StatusWrite) -> int:
        """Project the workflow's claim state (status, and spec when given), then one Event once it landed; the
        revision the status holds now (0 for an unnumbered write).

        A run that records one projection at a time (`above_held`) writes above a revision another run left, and
        hears when the claim is gone (`NotFound`: deleted by hand): a write never passes for landed when it did
        not, and the finalizer and the Event follow only a write that landed. For an earlier run a claim that is
        gone makes the projection moot, as it always did: it returns quietly.
        """
        what = f"record claim {w.namespace}/{w.name}"
        revision = 0
        status, event_message = w.status, w.event_message
        words = self._last_words(w.namespace, w.last_words_of)
        if words:
            status = {**status, "message": f"{status.get('message') or ''}{words}"}
            event_message = f"{event_message}{words}"
        with _mapped(what):
            try:
                if w.revision:
                    written, revision = self.kube.project_claim_status(
                        w.namespace, w.name, status, w.revision, above_held=w.above_held
                    )
                    if w.above_held and revision > w.revision:
                        activity.logger.info(
                            "%s: it held revision %d of another run; written above it", what, revision - 1
                        )
                else:  # a generation-2 claim's projection: unnumbered
                    written = self.kube.patch_raw(CLAIMS, w.namespace, w.name, {"status": dict(status)}, status=True)
                if w.spec:
                    written = self.kube.patch_raw(CLAIMS, w.namespace, w.name, {"spec": dict(w.spec)})
                if w.identity is not None:
                    written = self._carry_identity(w.namespace, w.name, w.identity)
                if w.release_finalizer:
                    self.kube.remove_claim_finalizer(w.namespace, w.name)
            except NotFound:
                if w.above_held:
                    raise
                activity.logger.info("%s: the claim is gone; nothing to record", what)
                return revision
            if w.event_reason:
                ref = ObjectRef(names.KIND_NODECLAIM, w.namespace, w.name, str(_meta(written).get("uid") or ""))
                self.kube.create_event(
                    ref,
                    w.event_reason,
                    event_message,
                    warning=w.warning,
                    now=self.clock(),
                    occurrence=_occurrence(),
                    fact=w.event_fact,
                )
        return revision

    def _carry_identity(self, namespace: str, name: str, identity: c.ClaimIdentity) -> JSON:
        """The labels, slot owner and deadline a claim the group creates carries, written where this one lacks them
        (one write, none when nothing is missing). A slot that is gone owns nothing: its claim hears so."""
        owner: JSON | None = None
        try:
            slot_uid = str(_meta(self.kube.get_raw(SLOTS, namespace, identity.slot)).get("uid") or "")
        except NotFound:
            slot_uid = ""
        if slot_uid:
            owner = _slot_owner(identity.slot, slot_uid).model_dump(by_alias=True, exclude_none=True, mode="json")
        return self.kube.carry_identity(
            namespace,
            name,
            labels=_claim_labels(identity.slot, identity.group),
            owner=owner,
            deadline_at=_rfc3339(identity.deadline_at),
        )

    def _last_words(self, namespace: str, job: str) -> str:
        """`LAST_WORDS_MARK` and the termination message of the failed Job `job`, or "" when it has none. Read here,
        written to the cluster only. A read that a retry may fix fails the write with it (it is retried until it
        lands); one no retry fixes (the Pods cannot be listed) leaves the words out rather than the record."""
        if not job:
            return ""
        try:
            message = self.kube.job_cause(namespace, job).message
        except KubeError as exc:
            if exc.retryable:
                raise
            activity.logger.info("Job %s/%s: its Pod's termination message is left out: %s", namespace, job, exc)
            return ""
        return f"{c.LAST_WORDS_MARK}{message}" if message else ""

    @activity.defn(name=c.Act.ADD_FINALIZER)
    def add_claim_finalizer(self, ref: c.ClaimRef) -> None:
        """Hold the claim until its machine is verified off; a claim that already has it is not written.

        A claim being deleted cannot take a finalizer: to its workflow that is a claim deleted by hand.
        """
        what = f"add the finalizer to claim {ref.namespace}/{ref.name}"
        try:
            with _mapped(what):
                self.kube.add_claim_finalizer(ref.namespace, ref.name)
        except ApplicationError as err:
            if err.type == INVALID:
                raise _fail(NOT_FOUND, f"{what}: the claim is being deleted") from err
            raise

    @activity.defn(name=c.Act.RELEASE_CLAIM)
    def release_claim(self, ref: c.ClaimRef) -> None:
        """Remove the finalizer (the machine is verified off); a claim without it, or gone, is done."""
        with _mapped(f"release claim {ref.namespace}/{ref.name}"):
            self.kube.remove_claim_finalizer(ref.namespace, ref.name)

    @activity.defn(name=c.Act.DELETE_CLAIM)
    def delete_claim(self, ref: c.ClaimRef) -> None:
        """Delete the claim resource (collection or cancel), its finalizer first; already gone is done."""
        with _mapped(f"delete claim {ref.namespace}/{ref.name}"):
            try:
                self.kube.remove_claim_finalizer(ref.namespace, ref.name)
            except NotFound:
                return
            self.kube.delete_claim(ref.namespace, ref.name)

    # --- Jobs --------------------------------------------------------------------------------------------
    @activity.defn(name=c.Act.CREATE_JOB)
    def create_job(self, req: c.JobRequest) -> dict[str, str]:
        """Create the lifecycle Job from the slot's own pod spec under its deterministic name; a retry finds it."""
        try:
            job_type = JobType(req.job_type)
        except ValueError as exc:
            raise _fail(INVALID, f"unknown Job type {req.job_type!r} for slot {req.namespace}/{req.slot}") from exc
        raw = self._slot(req.namespace, req.slot)
        field = pod_spec_field(job_type)
        if not _spec(raw).get(field):
            raise _fail(INVALID_POD_SPEC, f"slot {req.namespace}/{req.slot} has no spec.{field}")
        problem = views.slot_problem(raw)
        if problem:  # either pod spec, or the node it names: a machine booted must be one that can be stopped
            raise _fail(INVALID_POD_SPEC, f"slot {req.namespace}/{req.slot}: {problem}")
        slot = Node.model_validate({**raw, "status": {}})
        name = req.name or c.job_name(req.claim or req.slot, job_type, req.sequence)
        what = f"create {job_type} Job {req.namespace}/{name} for slot {req.slot}"
        claim_uid = ""
        if req.claim:
            try:
                claim = self.kube.get_raw(CLAIMS, req.namespace, req.claim)
            except NotFound as exc:
                raise _fail(NOT_FOUND, f"{what}: claim {req.namespace}/{req.claim} is gone") from exc
            claim_uid = str(_meta(claim).get("uid") or "")
        body = build_job(slot, job_type, name, req.claim, claim_uid, req.attempt)
        try:
            self.kube.create_job(req.namespace, body)
        except Invalid as exc:  # the API server refused the Job: its name, labels or the pod spec it carries
            refused = f"{what}: the API server refused it: {views.without_values(str(exc))}"
            raise _fail(Failure.JOB_REFUSED, refused) from None  # the refusal may quote the pod spec: not chained
        except NotFound as exc:
            raise _fail(NOT_FOUND, f"{what}: {exc}") from exc
        return {"name": name, "namespace": req.namespace}

    @activity.defn(name=c.Act.READ_JOB)
    def read_job(self, ref: c.JobRef) -> c.JobStatus:
        """The Job's state from its conditions; a Job that is gone is `missing` (its outcome is unknown)."""
        with _mapped(f"read Job {ref.namespace}/{ref.name}"):
            return job_status(ref.name, self.kube.get_job(ref.namespace, ref.name))

    @activity.defn(name=c.Act.READ_JOB_EXIT)
    def read_job_exit(self, ref: c.JobRef) -> c.JobExit:
        """How a failed Job's Pod ended (exit code and reason): what its workflow says of the failure. The Pod's
        termination message is not returned: it may hold the script's secrets, and this result is in a history."""
        with _mapped(f"read how Job {ref.namespace}/{ref.name} ended"):
            return self.kube.job_cause(ref.namespace, ref.name).exit

    # --- the machine -------------------------------------------------------------------------------------
    @activity.defn(name=c.Act.OBSERVE_SLOT)
    def observe_slot(self, ref: c.SlotRef) -> c.Observation:
        """What the cluster shows about the slot's machine now: the truth a timer-woken wait reads."""
        slot = self._slot(ref.namespace, ref.slot)
        node_name = self._node_name(slot, ref.namespace, ref.slot)
        with _mapped(f"observe slot {ref.namespace}/{ref.slot}"):
            group = self._group(ref.namespace, str(_spec(slot).get("group") or ""))
            node = self.kube.get_node(node_name)
        return observe(node, readiness_taints(group), self.clock())

    @activity.defn(name=c.Act.CORDON)
    def cordon_slot(self, ref: c.SlotRef) -> None:
        """Cordon the slot's kubelet Node before its shutdown; no Node is nothing to cordon."""
        node_name = self._node_name(self._slot(ref.namespace, ref.slot), ref.namespace, ref.slot)
        try:
            with _mapped(f"cordon slot {ref.namespace}/{ref.slot}"):
                self.kube.cordon(node_name)
        except ApplicationError as err:
            if err.type != NOT_FOUND:
                raise
            activity.logger.info("cordon slot %s/%s: Node %s does not exist", ref.namespace, ref.slot, node_name)

    @activity.defn(name=c.Act.UNCORDON)
    def uncordon_slot(self, ref: c.SlotRef) -> None:
        """Uncordon the slot's kubelet Node; no Node is nothing to uncordon."""
        node_name = self._node_name(self._slot(ref.namespace, ref.slot), ref.namespace, ref.slot)
        try:
            with _mapped(f"uncordon slot {ref.namespace}/{ref.slot}"):
                self.kube.uncordon(node_name)
        except ApplicationError as err:
            if err.type != NOT_FOUND:
                raise
            activity.logger.info("uncordon slot %s/%s: Node %s does not exist", ref.namespace, ref.slot, node_name)

    @activity.defn(name=c.Act.OPEN_GATE)
    def open_gate(self, ref: c.SlotRef) -> None:
        """Make a passed node take work: uncordon, drop the slot's taintsToRemove, stamp the group's nodeTaints
        and the slot identity (labels, providerID when empty). Every step is idempotent.
        """
        slot = self._slot(ref.namespace, ref.slot)
        spec = _spec(slot)
        node_name = self._node_name(slot, ref.namespace, ref.slot)
        group_name = str(spec.get("group") or "")
        what = f"open the gate of slot {ref.namespace}/{ref.slot} (Node {node_name})"
        with _mapped(what):
            group = self._group(ref.namespace, group_name)
            try:
                self.kube.uncordon(node_name)
                if spec.get("taintsToRemove"):
                    self.kube.remove_taints(node_name, spec["taintsToRemove"])
                node_taints = _spec(group).get("nodeTaints") or []
                if node_taints:
                    self.kube.stamp_taints(node_name, node_taints)
                self.kube.stamp_slot_identity(
                    node_name,
                    group=group_name,
                    slot=ref.slot,
                    provider_id=str(spec.get("providerID") or names.provider_id(ref.namespace, ref.slot)),
                )
            except NotFound:
                # The Node vanished after the gate passed: the next observation tells the workflow.
                activity.logger.info("%s: the Node does not exist", what)

    @activity.defn(name=c.Act.SLOT_EVENT)
    def slot_event(self, ev: c.SlotEvent) -> None:
        """An Event on the slot, for what has no claim move of its own; a slot that is gone makes it moot."""
        what = f"event {ev.reason} on slot {ev.namespace}/{ev.slot}"
        with _mapped(what):
            try:
                uid = str(_meta(self.kube.get_raw(SLOTS, ev.namespace, ev.slot)).get("uid") or "")
            except NotFound:
                activity.logger.info("%s: the slot is gone; no Event", what)
                return
            ref = ObjectRef(names.KIND_NODE, ev.namespace, ev.slot, uid)
            message = f"{ev.message}{self._last_words(ev.namespace, ev.last_words_of)}"
            self.kube.create_event(
                ref, ev.reason, message, warning=ev.warning, now=self.clock(), occurrence=_occurrence(), fact=ev.fact
            )

    # --- the drain before a power-off --------------------------------------------------------------------
    def _claim_annotations(self, namespace: str, claim: str) -> dict[str, str]:
        if not claim:
            return {}
        try:
            return dict(_meta(self.kube.get_raw(CLAIMS, namespace, claim)).get("annotations") or {})
        except NotFound:
            return {}

    def _drain_bound(self, namespace: str, slot: Mapping[str, Any]) -> int:
        """The group's drainTimeout in seconds; unset (or unreadable: the CRD refuses a bad one) is the default."""
        group = self._group(namespace, str(_spec(slot).get("group") or "")) or {}
        raw = _spec(group).get("drainTimeout")
        try:
            bound = parse_duration(raw) if raw else DEFAULT_DRAIN_TIMEOUT
        except ValueError:
            bound = DEFAULT_DRAIN_TIMEOUT
        return int(bound.total_seconds())

    @activity.defn(name=c.Act.DRAIN)
    def drain_slot(self, req: c.DrainRequest) -> c.DrainRound:
        """One round of the drain of the slot's kubelet Node (no Node is nothing to drain). A forced drain that
        found the node empty takes the force annotation off the slot: it was for this power-off only."""
        what = f"drain slot {req.namespace}/{req.slot}"
        slot = self._slot(req.namespace, req.slot)
        node_name = self._node_name(slot, req.namespace, req.slot)
        with _mapped(what):
            bound = self._drain_bound(req.namespace, slot)
            force = forced(_meta(slot).get("annotations"), self._claim_annotations(req.namespace, req.claim))
            if self.kube.get_node(node_name) is None:
                return c.DrainRound(forced=force, bound_seconds=bound)
            done = drain_round(self.kube, node_name, forced=force, bound_seconds=bound)
            if force and done.done and names.ANNOTATION_FORCE_DRAIN in (_meta(slot).get("annotations") or {}):
                patch = {"metadata": {"annotations": {names.ANNOTATION_FORCE_DRAIN: None}}}
                self.kube.patch_raw(SLOTS, req.namespace, req.slot, patch)
        return done

    @activity.defn(name=c.Act.DRAIN_BLOCKED)
    def drain_blocked(self, req: c.DrainBlocked) -> None:
        """The Warning of a drain past its bound, on the claim (when there is one) and the slot: it names the Pods
        in the way and the budget or annotation that holds each, read now (so no name is in the history)."""
        what = f"say why the drain of slot {req.namespace}/{req.slot} is blocked"
        slot = self._slot(req.namespace, req.slot)
        node_name = self._node_name(slot, req.namespace, req.slot)
        with _mapped(what):
            words = blocked_words(self.kube, node_name) or "no Pod is left now"
            message = (
                f"the drain before the power-off has waited {req.waited} for {req.left} "
                f"{'Pod' if req.left == 1 else 'Pods'}: {words}. The machine "
                f"stays on and the drain goes on; annotate the claim or slot {names.ANNOTATION_FORCE_DRAIN}=true "
                "to delete them instead"
            )
            refs = [ObjectRef(names.KIND_NODE, req.namespace, req.slot, str(_meta(slot).get("uid") or ""))]
            if req.claim:
                try:
                    claim = self.kube.get_raw(CLAIMS, req.namespace, req.claim)
                    uid = str(_meta(claim).get("uid") or "")
                    refs.insert(0, ObjectRef(names.KIND_NODECLAIM, req.namespace, req.claim, uid))
                except NotFound:
                    pass
            for ref in refs:
                self.kube.create_event(
                    ref,
                    names.EventReason.DRAIN_BLOCKED,
                    message,
                    warning=True,
                    now=self.clock(),
                    occurrence=_occurrence(),
                    fact=req.fact,
                )

    # --- the group ---------------------------------------------------------------------------------------
    @activity.defn(name=c.Act.LOAD_GROUP)
    def load_group(self, ref: c.GroupRef) -> c.GroupView:
        """The group as Kubernetes has it: bounds, slots with their observations, claims, a template node.

        Slots and claims are found by `spec.group`, not by label: a hand-written slot may carry no labels.
        Nothing read here can fail the group: a Group whose spec cannot be used comes back with its `problem`,
        a slot that cannot power its machine with its own, and a claim resource that cannot be run is left out
        (the watchers put a condition and a Warning Event on each).
        """
        with _mapped(f"load group {ref.namespace}/{ref.group}"):
            group = self._group(ref.namespace, ref.group)
            if group is None:
                return c.GroupView(ref.namespace, ref.group, exists=False)
            slots = [s for s in self.kube.list_raw(SLOTS, ref.namespace)[0] if _spec(s).get("group") == ref.group]
            claims = [cl for cl in self.kube.list_raw(CLAIMS, ref.namespace)[0] if _spec(cl).get("group") == ref.group]
            nodes = {str(_meta(n).get("name")): n for n in self.kube.list_nodes()}
            # The lifecycle Jobs, so a claim taken over adopts its own (a lost run's Job may still be running).
            jobs = self.kube.list_raw(JOBS, ref.namespace, f"{names.LABEL_MANAGED_BY}={names.MANAGED_BY}")[0]
        now = self.clock()
        taints = readiness_taints(group)
        slot_views: list[c.SlotView] = []
        template: JSON | None = None
        template_ready = False
        for slot in sorted(slots, key=lambda s: str(_meta(s).get("name"))):
            slot_name = str(_meta(slot).get("name"))
            node_name = str(_spec(slot).get("kubernetesNodeName") or "")
            node = nodes.get(node_name) if node_name else None
            observation = observe(node, taints, now)
            pid = str(
                _spec(node).get("providerID")
                or _spec(slot).get("providerID")
                or names.provider_id(ref.namespace, slot_name)
            )
            # Positional: the report's history fields are only read here, and are written by one module alone.
            slot_views.append(
                c.SlotView(
                    slot_name,
                    node_name,
                    observation,
                    _count(_status(slot).get("activationsLast24H")),
                    pid,
                    last_claim_of(slot_name, _status(slot).get("lastClaim")),
                    views.slot_problem(slot),
                    views.attempts_reset_at(slot),
                )
            )
            ready = observation.power == names.PowerState.ON
            if node is not None and (template is None or (ready and not template_ready)):
                template, template_ready = template_of(node, taints, now), ready
            elif node is None and template is None:
                template = template_from_status(slot_name, node_name, _status(slot).get("nodeTemplate"))
        found = views.group_spec(group)
        claim_views = [
            _with_jobs(views.claim_view(cl, now), cl, jobs, now)
            for cl in sorted(claims, key=lambda x: str(_meta(x).get("name")))
        ]
        common: dict[str, Any] = {
            "namespace": ref.namespace,
            "name": ref.group,
            "exists": True,
            "slots": tuple(slot_views),
            "claims": tuple(v for v in claim_views if v is not None),
            "template": template,
        }
        if isinstance(found, str):
            return c.GroupView(**common, problem=found)
        return c.GroupView(
            **common,
            min_size=found.min_size,
            max_size=found.max_size,
            max_provision_seconds=(found.max_node_provision_time or timedelta()).total_seconds(),
        )

    @activity.defn(name=c.Act.RECORD_SCALE)
    def record_scale(self, scale: c.ScaleRecord) -> None:
        """Group.status.lastScaleAt/lastScaleAction: the group workflow is their one writer."""
        what = f"record the last scale of group {scale.namespace}/{scale.group}"
        with _mapped(what):
            try:
                self.kube.patch_group_status(
                    scale.namespace,
                    scale.group,
                    {"lastScaleAt": scale.at.strftime("%Y-%m-%dT%H:%M:%SZ"), "lastScaleAction": scale.action},
                )
            except NotFound:
                activity.logger.info("%s: the Group is gone", what)


def _with_jobs(view: c.ClaimView | None, claim: JSON, jobs: list[JSON], now: datetime) -> c.ClaimView | None:
    """A claim's view with its own Jobs in its record (a claim no run ever recorded has made none)."""
    if view is None or view.record is None:
        return view
    return replace(view, record=replace(view.record, jobs=views.claim_jobs(claim, jobs, now)))


def _slot_owner(slot: str, uid: str) -> OwnerReference:
    """The slot as a claim's owner, not its controller (the claim's workflow is): deleting the slot takes it along."""
    return OwnerReference(api_version=names.API_VERSION, kind=names.KIND_NODE, name=slot, uid=uid)


def _claim_labels(slot: str, group: str) -> dict[str, str]:
    """The labels of a claim: its slot's and group's names, bounded to label values (`kubectl get -l` finds it)."""
    return {names.LABEL_NODE: names.label_value(slot), names.LABEL_GROUP: names.label_value(group)}


def _rfc3339(when: datetime | None) -> str | None:
    return None if when is None else when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def last_claim_of(slot: str, doc: Any) -> c.ClaimDigest | None:
    """Node.status.lastClaim as the group keeps it: what seeds the next attempt and rules out adoption. Its
    `message` is left on the slot: it may end with a failed Job's last words, which no history holds."""
    if not isinstance(doc, dict) or not doc.get("name"):
        return None
    try:
        digest = ClaimDigest.model_validate(doc)
    except ValidationError:
        log.warning("slot %s: unreadable status.lastClaim ignored", slot)
        return None
    return c.ClaimDigest(
        name=digest.name,
        slot=slot,
        group=digest.group or "",
        phase=str(digest.phase or "pending"),
        attempt=digest.attempt or 1,
        call=str(digest.call or ""),
        reason=str(digest.reason or ""),
        requested_at=digest.requested_at,
        deadline_at=digest.deadline_at,
        finished_at=digest.finished_at,
        machine_off=True,
        workflow_done=True,
    )
