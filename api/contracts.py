"""What travels between workflows, activities, watchers and the provider: ids, names and small records.

These records land in workflow histories, so they carry names and observed facts only: never a pod spec, a
command line or a Secret reference. Activities read those from the resources themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from api.names import JOB_NAME_MAX, bounded

TASK_QUEUE = "homelab-autoscaler"

# Custom search attributes (registered on the server before any worker starts).
SA_GROUP = "HomelabGroup"
SA_SLOT = "HomelabSlot"
SA_PHASE = "ClaimPhase"
SA_REASON = "ClaimReason"
SA_ATTEMPT = "ClaimAttempt"
SEARCH_ATTRIBUTES: dict[str, str] = {
    SA_GROUP: "Keyword",
    SA_SLOT: "Keyword",
    SA_PHASE: "Keyword",
    SA_REASON: "Keyword",
    SA_ATTEMPT: "Int",
}


def group_workflow_id(namespace: str, group: str) -> str:
    return f"group/{namespace}/{group}"


def claim_workflow_id(namespace: str, claim: str) -> str:
    return f"nodeclaim/{namespace}/{claim}"


def release_workflow_id(namespace: str, slot: str) -> str:
    return f"release/{namespace}/{slot}"


def workflow_id_parts(workflow_id: str) -> tuple[str, str]:
    """Namespace and name of one of the ids above; ("", "") for an id of another shape."""
    parts = workflow_id.split("/", 2)
    return (parts[1], parts[2]) if len(parts) == 3 else ("", "")


# Owners of lifecycle Jobs (claims, release episodes) are kept to 50 characters: their own name is then a valid
# label value, and `<owner>-startup` / `<owner>-shutdown-<n>` stay whole within a Job name's 63 for n < 1000.
OWNER_NAME_MAX = JOB_NAME_MAX - len("-shutdown-999")
RELEASE_MARK = "-release-"  # in every release episode's name, and so in the names of its Jobs


def claim_name(slot: str, entropy: str) -> str:
    """A claim's name: its slot and six hex digits (from `workflow.uuid4()`: deterministic on replay).

    A slot too long for that keeps a prefix and a hash of its name before the six digits, so claims of two long
    slots never share a name and the claim still fits a label value and its Jobs' names.
    """
    tail = f"-{entropy[:6]}"
    return f"{bounded(slot, OWNER_NAME_MAX - len(tail))}{tail}"


def release_episode(slot: str, entropy: str) -> str:
    """A law-3 release's own name, `<slot>-release-<5 hex>`, the owner of its shutdown Jobs.

    The watchers know a release's Job by the mark, so a long slot is bounded before it, never the mark.
    """
    tail = f"{RELEASE_MARK}{entropy[:5]}"
    return f"{bounded(slot, OWNER_NAME_MAX - len(tail))}{tail}"


def job_sequence(name: str, job_type: str) -> int:
    """The number in a lifecycle Job's name (`-<type>` is 1, `-<type>-<n>` is n); 0 for a name of another form."""
    head, sep, tail = name.rpartition(f"-{job_type}")
    if sep and head and not tail:
        return 1
    head, sep, number = name.rpartition(f"-{job_type}-")
    return int(number) if sep and head and number.isdigit() else 0


def job_name(owner: str, job_type: str, sequence: int) -> str:
    """Deterministic Job names: a retried activity finds its Job instead of making a second one.

    Always a valid Job name (≤ 63): an owner too long for its suffix (a hand-applied claim) is bounded first,
    so the operation stays readable at the end of the name.
    """
    suffix = f"-{job_type}" if sequence <= 1 else f"-{job_type}-{sequence}"
    return f"{bounded(owner, JOB_NAME_MAX - len(suffix))}{suffix}"


# --- observations -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Observation:
    """What the cluster shows about one slot's machine at `observed_at` (the observer's clock).

    `gate_open` is the readiness gate's question (Ready and free of the group's readiness taints, whether or
    not cordoned); `usable` is the law's predicate (the same, and not cordoned).
    """

    power: str = "off"
    usable: bool = False
    exists: bool = False
    gate_open: bool = False
    observed_at: datetime | None = None
    resource_version: str = ""

    def older_than(self, held: Observation) -> bool:
        """True when both are stamped and this one was made before `held`: a stale signal delivered late."""
        return self.observed_at is not None and held.observed_at is not None and self.observed_at < held.observed_at

    def replacing(self, held: Observation) -> tuple[Observation, bool]:
        """What a holder keeps when this arrives (a stale one is dropped), and whether a decision input changed."""
        if self.older_than(held):
            return held, False
        return self, not self.same_facts(held)

    def same_facts(self, other: Observation | None) -> bool:
        """Equal in everything a decision reads (the stamp aside): the watchers' debounce uses this."""
        return other is not None and (self.power, self.usable, self.exists, self.gate_open) == (
            other.power,
            other.usable,
            other.exists,
            other.gate_open,
        )

    def same_for_claim(self, other: Observation | None) -> bool:
        """Equal in what a claim waits on: power and the readiness gate. Whether the node is registered or
        usable it reads when it needs to (its registration wait polls; usability it reads only at launch, from its
        seed), so a change of those alone wakes no claim: a signal is a workflow task."""
        return other is not None and (self.power, self.gate_open) == (other.power, other.gate_open)


@dataclass(frozen=True)
class SlotObservation:
    slot: str
    observation: Observation


# --- claim records ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str


@dataclass(frozen=True)
class SlotRef:
    namespace: str
    slot: str


@dataclass(frozen=True)
class ConditionRecord:
    """One condition as a claim resource holds it (its clock is `since`, the lastTransitionTime)."""

    type: str
    status: bool
    since: datetime
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class JobRecord:
    """One of a claim's own lifecycle Jobs as the cluster holds it (found by its owner, else its labels): what a run
    taking the claim over adopts instead of firing a Job of its own beside it. Names and numbers only."""

    name: str
    job_type: str
    state: str  # JOB_RUNNING, JOB_SUCCEEDED or JOB_FAILED
    reason: str = ""  # the Job's own reason for failing (DeadlineExceeded: a timeout)
    age_seconds: float = 0.0  # since its creation, when it was read (the reader's clock and the API server's agree)
    attempt: int = 0  # a shutdown Job's number in its streak, as its creator annotated it (0: not said)
    sequence: int = 0  # the number in its name (`-shutdown-<n>`; 1 for the first)


@dataclass(frozen=True)
class ClaimRecord:
    """What a claim resource holds of the runs that wrote it: a run started from the resource (a claim taken over
    after its workflow was lost) continues this record instead of starting one of its own."""

    revision: int = 0
    message: str = ""
    shutdown_attempts: int = 0
    last_shutdown_attempt_at: datetime | None = None
    finished_at: datetime | None = None
    conditions: tuple[ConditionRecord, ...] = ()
    # The claim's own lifecycle Jobs (a lost run's startup or shutdown Job may still be running).
    jobs: tuple[JobRecord, ...] = ()

    def condition(self, kind: str) -> ConditionRecord | None:
        return next((cond for cond in self.conditions if cond.type == kind), None)


@dataclass(frozen=True)
class ClaimSeed:
    """Everything a NodeClaimWorkflow starts from; the group decides all of it before the child starts."""

    namespace: str
    name: str
    slot: str
    group: str
    call: str
    attempt: int
    requested_at: datetime
    deadline_at: datetime | None
    max_provision_seconds: float
    ttl_seconds: int
    phase: str = "pending"
    reason: str = ""
    create_resource: bool = True
    reads_per_run: int = 500  # liveness reads before a ready claim continues as new (about 41 h at one per 5 min)
    # What the group saw of the slot when it booked the claim (the law reads it at launch), and the reason of a
    # mark that came with the claim (a hand-applied claim already being deleted).
    observation: Observation = field(default_factory=Observation)
    marked_reason: str = ""
    # The record a run started from a resource continues (None: a claim with no status yet), and for a claim no
    # group can take (its slot or group does not exist) the reason and message it fails with.
    record: ClaimRecord | None = None
    refused_reason: str = ""
    refused_message: str = ""


@dataclass(frozen=True)
class ClaimDigest:
    """The outcome of one claim as its group and the slot report keep it (also Node.status.lastClaim)."""

    name: str
    slot: str
    group: str
    phase: str
    attempt: int
    call: str
    reason: str = ""
    marked: bool = False
    requested_at: datetime | None = None
    deadline_at: datetime | None = None
    finished_at: datetime | None = None
    machine_off: bool = False
    workflow_done: bool = False
    # Read by the 0.2 line only, which takes a digest without it for a generation-2 claim's (one that drains and
    # collects itself): written as 3 while a group of that line may read it (a rollback, a rolling update), then gone.
    generation: int = 3
    # What the group needs to finish the claim's episode (a claim ends at its terminal phase and leaves the release
    # of its machine and the collection of its resource to its group).
    ttl_seconds: int = 3600
    hand_over: bool = False  # superseded or slot deleted: the machine is someone else's (or nobody's) to act on
    powered: bool = False  # its startup Job succeeded (or it took a machine already on): maybe on though unseen
    startup_job: str = ""  # a startup Job still running when the claim ended: a boot is reversed, not cut
    collected: bool = False  # the claim resource is already gone (cancelled, deleted by hand): nothing to collect
    # The claim's last view of its machine, on its final report only: an observation the group holds that is
    # newer (one sent on to the claim while it was ending) is what the claim never heard.
    observation: Observation | None = None
    # The terminal claim's message as its workflow wrote it (a failed Job's exit code and reason, never the Pod's
    # words): cluster-autoscaler's error message for the instance says it.
    message: str = ""


@dataclass(frozen=True)
class MarkRequest:
    """Why a live claim is asked to end: the reason its completion will carry."""

    reason: str


@dataclass(frozen=True)
class JobFinished:
    job: str
    succeeded: bool
    reason: str = ""  # the Job's own reason for failing (DeadlineExceeded: its activeDeadlineSeconds ran out)


@dataclass(frozen=True)
class ClaimIdentity:
    """What a claim the group creates carries besides its status: the slot and group labels (bounded names), the
    slot as a non-controller owner (deleting the slot takes the claim along), and `spec.deadlineAt` while it boots."""

    slot: str
    group: str
    deadline_at: datetime | None = None


@dataclass(frozen=True)
class StatusWrite:
    """A projection of claim state onto the resource, then one Event once the write landed."""

    namespace: str
    name: str
    status: dict[str, Any] = field(default_factory=dict)
    spec: dict[str, Any] | None = None
    event_reason: str = ""
    event_message: str = ""
    warning: bool = False
    release_finalizer: bool = False  # the claim's last write: nothing more will be done for its machine
    revision: int = 0  # the workflow's number for this projection: a stored later one is never overwritten
    # The run records one projection at a time, so a revision the resource holds at or above this one is another
    # run's (a lost one): the write lands above it, never skipped. The activity returns the number.
    above_held: bool = False
    # A failed Job whose Pod's termination message the activity reads and adds (after `LAST_WORDS_MARK`) to the
    # status message and the Event: the workflow names the Job, the text never enters its history.
    last_words_of: str = ""
    # The fact the Event says, when more than one run may say it (a spent streak, a scale-down's
    # start): an Event of the object with the same reason and fact is that Event already, and none is added.
    event_fact: str = ""
    # What every live claim carries (labels, its slot as owner, a deadline), for a claim a run holds
    # for the first time (applied by hand, or taken over): written where the object lacks it.
    identity: ClaimIdentity | None = None


@dataclass(frozen=True)
class StatusEdit:
    """A person's edit of a claim's status, as the watchers saw it land (the revision did not move): the stored
    operator-owned fields, for the claim to act on (a streak reset) or to overwrite with its record."""

    revision: int
    status: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SlotEvent:
    """An Event on a slot (the machine), for what has no claim move of its own."""

    namespace: str
    slot: str
    reason: str
    message: str
    warning: bool = False
    last_words_of: str = ""  # a failed Job whose termination message the activity adds to the Event (see StatusWrite)
    fact: str = ""  # what the Event says when more than one run may say it (see StatusWrite.event_fact)


# --- the drain before a power-off ---------------------------------------------------------------------------
@dataclass(frozen=True)
class DrainRequest:
    """Drain the slot's kubelet Node; `claim` (empty for law 3) is where a force annotation and a Warning also go."""

    namespace: str
    slot: str
    claim: str = ""


@dataclass(frozen=True)
class DrainRound:
    """What one round of a drain left, as counts only: no Pod's name or spec ever lands in a history.

    `left` Pods still to go (being evicted or terminating), of which `refused` a budget refused this round and
    `held` an annotation holds; `bound_seconds` the group's drain timeout; `forced` a person's annotation.
    """

    left: int = 0
    evicted: int = 0
    refused: int = 0
    held: int = 0
    forced: bool = False
    bound_seconds: int = 600

    @property
    def done(self) -> bool:
        return self.left == 0


@dataclass(frozen=True)
class DrainBlocked:
    """Say once that a drain is past its bound: how long it waited and how many Pods are left (the activity
    reads and names them); `fact` makes a repeat by another run of the same power-off no Event."""

    namespace: str
    slot: str
    claim: str
    waited: str
    left: int
    fact: str = ""


# --- jobs -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobRequest:
    """Create a lifecycle Job for a slot; `claim` empty means a law-3 release, owned by the slot alone."""

    namespace: str
    slot: str
    job_type: str
    sequence: int = 1
    claim: str = ""
    name: str = ""  # the Job's name when the caller chose it (a release names its episode); else job_name()
    attempt: int = 0  # a shutdown Job's number in its streak, annotated on the Job (a run taking over reads it)


@dataclass(frozen=True)
class JobRef:
    namespace: str
    name: str


@dataclass(frozen=True)
class GroupTell:
    """A claim's digest for its group's `claim_changed` signal (`Act.TELL_GROUP`)."""

    namespace: str
    group: str
    digest: ClaimDigest


# What happened to a failed lifecycle Job when no container's terminated state says it (the other reasons are
# Kubernetes' own: a container's terminated or waiting reason, a Pod's status reason).
CAUSE_JOB_GONE = "JobGone"
CAUSE_NO_POD = "NoPod"
CAUSE_NOT_TERMINATED = "NotTerminated"
CAUSE_DEADLINE = "DeadlineExceeded"


@dataclass(frozen=True)
class JobExit:
    """How a failed lifecycle Job's Pod ended, in Kubernetes' own words and numbers: its container's exit code and
    terminated (or waiting) reason, or one of the `CAUSE_*`. All a workflow history holds of a Job's failure: the
    termination message (a script's last words, which may hold its secrets) stays in the cluster."""

    reason: str
    exit_code: int | None = None
    signal: int | None = None
    pod: str = ""
    deadline_seconds: int | None = None

    def said(self) -> str:
        """One line for people: `exit code 1 (Error)`, or what happened instead."""
        if self.reason == CAUSE_JOB_GONE:
            return "its Job is gone (deleted, or collected after its ttlSecondsAfterFinished)"
        if self.reason == CAUSE_NO_POD:
            return "no Pod of its Job is left to say why (see `kubectl describe job`)"
        head = ""
        if self.reason == CAUSE_DEADLINE:
            limit = f" ({self.deadline_seconds} s)" if self.deadline_seconds else ""
            head = f"ran longer than its activeDeadlineSeconds{limit} and was stopped"
        if self.exit_code is not None:
            signal = f", signal {self.signal}" if self.signal else ""
            said = f"exit code {self.exit_code}{signal}"
            if self.reason != CAUSE_DEADLINE:
                said += f" ({self.reason})"
            return f"{head}; {said}" if head else said
        if self.reason == CAUSE_NOT_TERMINATED:
            return head or f"its Pod {self.pod} never ended"
        if self.reason != CAUSE_DEADLINE:
            return f"{self.reason} (Pod {self.pod})" if self.pod else self.reason
        return head


# Where the activity that records a Job's failure puts the termination message it read: after the workflow's own
# message, behind this mark, which no workflow writes. Readers that feed a workflow cut the message there.
LAST_WORDS_MARK = "; its Pod said: "


JOB_RUNNING = "running"
JOB_SUCCEEDED = "succeeded"
JOB_FAILED = "failed"
JOB_MISSING = "missing"


@dataclass(frozen=True)
class JobStatus:
    name: str
    state: str
    reason: str = ""


# --- group view -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupRef:
    namespace: str
    group: str


@dataclass(frozen=True)
class SlotView:
    name: str
    node_name: str
    observation: Observation
    activations_last_24h: int = 0
    provider_id: str = ""
    last_claim: ClaimDigest | None = None  # from Node.status.lastClaim: a slot that has had a claim is not adopted
    problem: str = ""  # why the slot's spec cannot power its machine (a field path, never a value); "" when fine
    attempts_reset_at: datetime | None = None  # the reset-attempts annotation: earlier claims leave the streak


@dataclass(frozen=True)
class ClaimView:
    """A claim resource as the group finds it when it (re)loads: to adopt hand-applied claims."""

    name: str
    slot: str
    phase: str
    attempt: int
    call: str
    marked: bool
    requested_at: datetime | None = None
    deadline_at: datetime | None = None
    finished_at: datetime | None = None
    reason: str = ""
    ttl_seconds: int = 3600
    max_provision_seconds: float = 0.0
    has_attempt: bool = False  # status.attempt was written: the claim's own number (a lost run), not a seed
    record: ClaimRecord | None = None  # what its status holds (None: no status yet, a claim applied by hand)


@dataclass(frozen=True)
class GroupView:
    """A group as read from Kubernetes: its bounds, its slots, and the claims that exist for them."""

    namespace: str
    name: str
    exists: bool
    min_size: int = 0
    max_size: int = 0
    max_provision_seconds: float = 0.0
    slots: tuple[SlotView, ...] = ()
    claims: tuple[ClaimView, ...] = ()
    template: dict[str, Any] | None = None
    problem: str = ""  # why the Group's spec cannot be used (field and value); "" when fine


@dataclass(frozen=True)
class ReleaseSeed:
    """Law 3: a machine on with no claim in a slot that has had one; power it off."""

    namespace: str
    slot: str
    group: str
    # The end of a claim's episode (the claim that owned the machine, a startup Job of it still
    # to wait out, and whether that claim's Job powered the machine, which its kubelet may never have shown).
    claim: str = ""
    startup_job: str = ""
    powered: bool = False


@dataclass(frozen=True)
class ScaleRecord:
    """Group.status.lastScaleAt / lastScaleAction: the group's last size change, as cluster-autoscaler asked."""

    namespace: str
    group: str
    at: datetime
    action: str


@dataclass(frozen=True)
class SlotReleased:
    slot: str
    machine_off: bool
    # The release's last view of the machine: one the group holds that is newer is what the release never heard.
    observation: Observation | None = None


# Error types of the group's Updates (ApplicationError.type); the provider maps them to gRPC codes.
ERR_INVALID_ARGUMENT = "InvalidArgument"
ERR_FAILED_PRECONDITION = "FailedPrecondition"
ERR_NOT_FOUND = "NotFound"
ERR_NO_CAPACITY = "NoCapacity"  # no slot of the group can take a claim now (each slot's condition says why)


@dataclass(frozen=True)
class Instance:
    """One node of a group as cluster-autoscaler sees it."""

    id: str
    slot: str
    claim: str
    state: str  # creating | running | deleting
    error_code: str = ""
    error_class: int = 0
    error_message: str = ""


def mid_boot(instances: list[Instance], slot: str) -> bool:
    """Whether `slot` is booting among a group's instances: creating, and not a failed claim's errored instance."""
    return any(i.slot == slot and i.state == "creating" and not i.error_code for i in instances)


class Act:
    """Activity names: workflows call activities by name, so no Kubernetes code is imported into a workflow."""

    CREATE_CLAIM = "create_claim"
    CREATE_CLAIM_HELD = "create_claim_held"  # created with its finalizer: one write, no separate commit
    RECORD_CLAIM = "record_claim"
    ADD_FINALIZER = "add_claim_finalizer"
    RELEASE_CLAIM = "release_claim"
    DELETE_CLAIM = "delete_claim"
    CREATE_JOB = "create_job"
    READ_JOB = "read_job"
    READ_JOB_EXIT = "read_job_exit"  # how a failed Job's Pod ended: exit code and reason, never its message
    OBSERVE_SLOT = "observe_slot"
    CORDON = "cordon_slot"
    UNCORDON = "uncordon_slot"
    OPEN_GATE = "open_gate"
    SLOT_EVENT = "slot_event"
    LOAD_GROUP = "load_group"
    RECORD_SCALE = "record_scale"
    DRAIN = "drain_slot"  # one round of the drain before a power-off: evict what may go, count what is left
    DRAIN_BLOCKED = "drain_blocked"  # the Warning that names the Pods and budgets in the way (read, never carried)
    TELL_GROUP = "tell_group"  # a claim's move to its group: a signal sent by the worker, not a workflow command


# --- the Temporal boundary: handler names ------------------------------------------------------------------
# Every workflow type, signal, update and query by its wire name, one table per workflow, so callers never spell
# one. A running workflow is reached by these names, and histories record them: a value here is never changed
# (docs/upgrades.md). tests/test_boundary.py checks the tables against the handlers and finds bare names.
class WorkflowName(StrEnum):
    GROUP = "GroupWorkflow"
    CLAIM = "NodeClaimWorkflow"
    RELEASE = "ReleaseWorkflow"


class GroupSignal(StrEnum):
    CLAIM_CHANGED = "claim_changed"
    OBSERVE_SLOT = "observe_slot"
    REFRESH = "refresh"
    RELEASE_FINISHED = "release_finished"


class GroupUpdate(StrEnum):
    INCREASE_SIZE = "increase_size"
    DECREASE_TARGET_SIZE = "decrease_target_size"
    DELETE_NODES = "delete_nodes"
    WAIT_LOADED = "wait_loaded"  # the provider's first call: returns once the group has read its resources


class GroupQuery(StrEnum):
    TARGET_SIZE = "target_size"
    INSTANCES = "instances"
    SNAPSHOT = "snapshot"


class ClaimSignal(StrEnum):
    OBSERVE = "observe"
    JOB_FINISHED = "job_finished"
    MARK_FOR_DELETION = "mark_for_deletion"
    SUPERSEDED = "superseded"
    SLOT_DELETED = "slot_deleted"
    STATUS_EDITED = "status_edited"


class ClaimUpdate(StrEnum):
    RESET_SHUTDOWN_STREAK = "reset_shutdown_streak"


class ClaimQuery(StrEnum):
    STATUS = "status"
    DIGEST = "digest"


class ReleaseSignal(StrEnum):
    OBSERVE = "observe"
    JOB_FINISHED = "job_finished"
    ABORT = "abort"


class ReleaseUpdate(StrEnum):
    RESET_SHUTDOWN_STREAK = "reset_shutdown_streak"


# Any signal one workflow or a watcher may send (its receiver's table says which it takes).
AnySignal = GroupSignal | ClaimSignal | ReleaseSignal

# Every handler table, by the workflow that declares the handlers and by kind (the names temporalio's workflow
# definition uses), so tests/test_boundary.py can hold each table against the class's handlers.
HANDLER_TABLES: dict[WorkflowName, dict[str, type[StrEnum]]] = {
    WorkflowName.GROUP: {"signals": GroupSignal, "updates": GroupUpdate, "queries": GroupQuery},
    WorkflowName.CLAIM: {"signals": ClaimSignal, "updates": ClaimUpdate, "queries": ClaimQuery},
    WorkflowName.RELEASE: {"signals": ReleaseSignal, "updates": ReleaseUpdate},
}
