"""Every name and number shared across packages, in one place so no two modules spell a label twice."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from enum import StrEnum

# --- API group ------------------------------------------------------------------------------------------
GROUP = "infra.homecluster.dev"
VERSION = "v2alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

KIND_GROUP = "Group"
KIND_NODE = "Node"
KIND_NODECLAIM = "NodeClaim"
PLURAL_GROUPS = "groups"
PLURAL_NODES = "nodes"
PLURAL_NODECLAIMS = "nodeclaims"

# --- labels, annotations, finalizers -------------------------------------------------------------------
LABEL_GROUP = f"{GROUP}/group"
LABEL_NODE = f"{GROUP}/node"
LABEL_NODECLAIM = f"{GROUP}/nodeclaim"
LABEL_JOB_TYPE = "type"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "homelab-autoscaler"

ANNOTATION_CLAIM_CALL = f"{GROUP}/call"
# Set (to an RFC 3339 time) on a slot to restart its boot-attempt streak: the claims before it no longer count.
ANNOTATION_RESET_ATTEMPTS = f"{GROUP}/reset-attempts"
ANNOTATION_TEMPLATE_SNAPSHOT_AT = f"{GROUP}/template-snapshot-at"
# Set (to an RFC 3339 time) on a slot or its Group to start a new period of the usage figures once that time has come.
ANNOTATION_RESET_USAGE = f"{GROUP}/reset-usage"
# On a shutdown Job: its number in its claim's (or release's) shutdown streak, read back by a run taking over.
ANNOTATION_SHUTDOWN_ATTEMPT = f"{GROUP}/shutdown-attempt"
# On an Event: the fact it says, when more than one run may say it; one Event per object, reason and fact.
ANNOTATION_EVENT_FACT = f"{GROUP}/fact"

# Set to "true" on a slot or its claim by a person: the drain before its power-off deletes the Pods that block it
# (a budget, a do-not-disrupt annotation) instead of waiting; the operator removes it from the slot once used.
ANNOTATION_FORCE_DRAIN = f"{GROUP}/force-drain"
# The autoscalers' own "leave this Pod alone" annotations, honoured alike: either blocks a power-off.
ANNOTATION_SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
ANNOTATION_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
# A static Pod's mirror on the API server: the kubelet owns it, an eviction cannot move it.
ANNOTATION_MIRROR_POD = "kubernetes.io/config.mirror"

FINALIZER_CLAIM = f"{GROUP}/claim"

PROVIDER_ID_SCHEME = "homelab"

# On the CRDs and the namespace (issue 44): `kubectl delete -k <overlay> -l 'homelab-autoscaler.dev/uninstall!=keep'`
# removes the install and keeps them, and so every Group, slot and claim (docs/install.md, "Uninstalling").
LABEL_UNINSTALL = "homelab-autoscaler.dev/uninstall"
UNINSTALL_KEEP = "keep"

# cluster-autoscaler's InstanceErrorClass (cloudprovider.OutOfResourcesErrorClass, OtherErrorClass): a failed boot is
# "other" (99); cluster-autoscaler backs the group off either way, and "out of resources" (1) also marks it full.
ERROR_CLASS_OUT_OF_RESOURCES = 1
ERROR_CLASS_OTHER = 99
ERROR_CLASS_WORDS = {
    ERROR_CLASS_OUT_OF_RESOURCES: "out of resources",
    ERROR_CLASS_OTHER: "other error: cluster-autoscaler backs the group off",
}


def error_class_words(error_class: int) -> str:
    """An instance error's class as cluster-autoscaler names it, in words beside its number ("class 99" alone said
    nothing to a reader)."""
    return f"class {error_class}, {ERROR_CLASS_WORDS.get(error_class, 'a class cluster-autoscaler does not name')}"


# --- bounded names (the API server's limits) -----------------------------------------------------------
# A slot's or a Group's name may be a whole DNS-1123 subdomain (253 characters), but a label value holds 63 and
# a Job name 63 (it becomes a label of its Pods). Every name the operator derives from another is bounded the
# way Kubernetes bounds generated names: a readable prefix, then a short hash of the whole name, so it is
# deterministic (a retried activity finds its object), distinct for distinct names, and short names are kept.
NAME_MAX = 253  # DNS-1123 subdomain: object names, Event names
LABEL_VALUE_MAX = 63  # IsValidLabelValue
JOB_NAME_MAX = 63  # ValidateJob: a Job's name is the job-name label of its Pods
NAME_HASH_LENGTH = 10  # hex digits of SHA-256 (40 bits) after a truncated prefix


def bounded(name: str, limit: int) -> str:
    """`name` itself when it fits `limit`, else its first characters, '-', and the hash of all of it.

    The prefix ends on an alphanumeric character, so a valid subdomain or label value stays one.
    """
    if limit <= NAME_HASH_LENGTH + 1:
        raise ValueError(f"a bounded name needs room for its hash: limit {limit}")
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:NAME_HASH_LENGTH]
    prefix = name[: limit - NAME_HASH_LENGTH - 1].rstrip("-._")
    return f"{prefix}-{digest}" if prefix else digest


def label_value(name: str) -> str:
    """The value of a label that names an object (slot, group, claim): the name, bounded to 63 characters.

    Whoever selects or matches by such a label compares with this, never with the name itself.
    """
    return bounded(name, LABEL_VALUE_MAX)


def provider_id(namespace: str, slot: str) -> str:
    """The providerID the kubelet Node of a slot carries, and the instance id cluster-autoscaler sees."""
    return f"{PROVIDER_ID_SCHEME}://{namespace}/{slot}"


# --- enumerations --------------------------------------------------------------------------------------
class ClaimPhase(StrEnum):
    """NodeClaim.status.phase. pending/booting/ready are live; failed/completed are terminal."""

    PENDING = "pending"
    BOOTING = "booting"
    READY = "ready"
    FAILED = "failed"
    COMPLETED = "completed"


class Report(StrEnum):
    """Node.status.phase: the report derived by the law, never an input."""

    OFF = "off"
    PENDING = "pending"
    BOOTING = "booting"
    READY = "ready"
    DRAINING = "draining"


class PowerState(StrEnum):
    """Observed power: kubelet Ready=True means on."""

    ON = "on"
    OFF = "off"


class UsageState(StrEnum):
    """What a slot's time is counted as in its usage figures (`status.usage`): the report and the observed power.

    `on` and `draining` are the time its kubelet was Ready (observed on); `off` and `booting` the rest. `booting`
    is a machine wanted and not up yet (its kubelet not Ready): a boot's own draw is the slot's `bootWattHours`.
    """

    ON = "on"
    OFF = "off"
    BOOTING = "booting"
    DRAINING = "draining"


class NodeState(StrEnum):
    """States of the node state machine; the law seeds the start state."""

    SHUTDOWN = "shutdown"
    STARTINGUP = "startingup"
    READY = "ready"
    SHUTTINGDOWN = "shuttingdown"


class Operation(StrEnum):
    """The lifecycle operation the law fires."""

    START_NODE = "StartNode"
    SHUTDOWN_NODE = "ShutdownNode"


class NodeEvent(StrEnum):
    """Events of the node state machine."""

    START_NODE = "StartNode"
    SHUTDOWN_NODE = "ShutdownNode"
    JOB_COMPLETED = "JobCompleted"
    JOB_FAILED = "JobFailed"
    JOB_TIMEOUT = "JobTimeout"


class JobType(StrEnum):
    """The value of the `type` label on lifecycle Jobs."""

    STARTUP = "startup"
    SHUTDOWN = "shutdown"


class ClaimCall(StrEnum):
    """What made a claim: the provider call, an adoption, or a person with kubectl."""

    INCREASE_SIZE = "IncreaseSize"
    ADOPTED = "Adopted"
    MANUAL = "Manual"


class ClaimReason(StrEnum):
    """NodeClaim.status.reason: why a claim ended (or, for Adopted, how it began)."""

    DEADLINE_EXCEEDED = "DeadlineExceeded"
    ATTEMPT_LIMIT_EXCEEDED = "AttemptLimitExceeded"
    STARTUP_JOB_FAILED = "StartupJobFailed"
    STARTUP_JOB_TIMEOUT = "StartupJobTimeout"
    READINESS_GATE_TIMEOUT = "ReadinessGateTimeout"
    MACHINE_GONE = "MachineGone"
    SUPERSEDED = "Superseded"
    SLOT_DELETED = "SlotDeleted"
    # What retrying cannot fix, named after its cause (activities raise these as non-retryable errors).
    INVALID_POD_SPEC = "InvalidPodSpec"
    JOB_REFUSED = "JobRefused"
    CLAIM_REFUSED = "ClaimRefused"
    OPERATOR_ERROR = "OperatorError"
    NODE_DELETED = "NodeDeleted"
    CANCELLED_BY_DECREASE_TARGET_SIZE = "CancelledByDecreaseTargetSize"
    MAX_SIZE_REACHED = "MaxSizeReached"  # a hand-applied claim the group had no room for: cancelled, nothing bought
    DELETED_BY_HAND = "DeletedByHand"
    ADOPTED = "Adopted"
    # A claim no group can take: it names a slot its group does not have, or a group that does not exist.
    SLOT_NOT_FOUND = "SlotNotFound"
    GROUP_NOT_FOUND = "GroupNotFound"


# NodeClaim.status fields its workflow writes (the claim's record); `revision` numbers the writes themselves. A
# person's edit of one of them is overwritten with the record, but for the shutdown streak's reset (an input).
OWNED_CLAIM_STATUS = (
    "phase",
    "reason",
    "message",
    "attempt",
    "shutdownAttempts",
    "lastShutdownAttemptAt",
    "finishedAt",
    "conditions",
)


class ConditionType(StrEnum):
    """Condition types written on claims, slots and groups."""

    READY = "Ready"
    MACHINE_COMMITTED = "MachineCommitted"
    MACHINE_OBSERVED_OFF = "MachineObservedOff"
    MARKED_FOR_DELETION = "MarkedForDeletion"
    # on slots and groups: whether the object's spec can be used, and whether a slot may take a new claim
    VALID = "Valid"
    CLAIMABLE = "Claimable"
    SHUTDOWN_ATTEMPT_LIMIT_REACHED = "ShutdownAttemptLimitReached"
    # autoscaler marker conditions on the slot report
    SCALE_UP_IN_FLIGHT = "ScaleUpInFlight"
    SCALE_DOWN_IN_FLIGHT = "ScaleDownInFlight"
    GROUP_HEALTHY = "Healthy"


class EventReason(StrEnum):
    """Kubernetes Event reasons: one per claim move, plus warnings that have no move of their own."""

    CLAIM_CREATED = "ClaimCreated"
    CLAIM_BOOTING = "ClaimBooting"
    CLAIM_READY = "ClaimReady"
    CLAIM_FAILED = "ClaimFailed"
    CLAIM_CANCELLED = "ClaimCancelled"
    CLAIM_COMPLETED = "ClaimCompleted"
    CLAIM_SUPERSEDED = "ClaimSuperseded"
    READINESS_GATE_TIMEOUT = "ReadinessGateTimeout"
    SCALE_DOWN_STARTED = "ScaleDownStarted"
    SHUTDOWN_ATTEMPT_LIMIT_REACHED = "ShutdownAttemptLimitReached"
    SHUTDOWN_JOB_FAILED = "ShutdownJobFailed"
    SHUTDOWN_JOB_TIMEOUT = "ShutdownJobTimeout"
    SHUTDOWN_NOT_OBSERVED = "ShutdownNotObserved"
    MACHINE_OFF_UNSEEN = "MachineOffUnseen"
    INVALID_SPEC = "InvalidSpec"
    MACHINE_ADOPTED = "MachineAdopted"
    MACHINE_RELEASED = "MachineReleased"
    # A run started from a resource whose workflow was lost; a person's edit of a claim's status.
    CLAIM_TAKEN_OVER = "ClaimTakenOver"
    SHUTDOWN_STREAK_RESET = "ShutdownStreakReset"
    STATUS_OVERWRITTEN = "StatusOverwritten"
    # A slot's usage figures started a new period (the reset-usage annotation); an annotation that is no time.
    USAGE_RESET = "UsageReset"
    INVALID_ANNOTATION = "InvalidAnnotation"
    # A workflow whose task failed for good was ended, so the operator takes it over from this object.
    WORKFLOW_STUCK = "WorkflowStuck"
    # The drain before a power-off: still in the way past its bound (which Pods, which budget), or forced by a person.
    DRAIN_BLOCKED = "DrainBlocked"
    DRAIN_FORCED = "DrainForced"


class Failure(StrEnum):
    """Types of the non-retryable errors activities raise: what no retry can fix, named so workflows can act."""

    SLOT_DELETED = "SlotDeleted"  # the slot resource is gone
    INVALID_POD_SPEC = "InvalidPodSpec"  # the slot's pod spec cannot make a Job (says which field, never its value)
    NOT_FOUND = "NotFound"  # the object the write was for is gone
    INVALID = "Invalid"  # the API server refused the write as invalid (422)
    JOB_REFUSED = "JobRefused"  # the API server refused a lifecycle Job (its name, labels or schema)
    CLAIM_REFUSED = "ClaimRefused"  # the API server refused the claim resource itself


class TaintEffect(StrEnum):
    """The three taint effects the API server accepts."""

    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class PowerOffNodePolicy(StrEnum):
    """What happens to the kubelet Node once its machine is verified off."""

    DELETE = "Delete"
    KEEP = "Keep"


class GroupHealth(StrEnum):
    """Group.status.health, derived from the slots' reports."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"
    OFFLINE = "offline"
    UNKNOWN = "unknown"


# --- numbers (DESIGN.md "Numbers") ---------------------------------------------------------------------
JOB_TIMEOUT = timedelta(minutes=5)
CLAIM_TTL_SECONDS_AFTER_FINISHED = 3600
JOB_BACKOFF_LIMIT = 0
JOB_TTL_SECONDS_AFTER_FINISHED = 600

DEFAULT_READINESS_TAINTS: tuple[tuple[str, str], ...] = (("node.cilium.io/agent-not-ready", "NoExecute"),)
