"""The group's whole state: its bounds, its slots, the claims whose workflows still run, and its outboxes.

The group is the single authority on its size: target size is a count over `claims`, computed, never stored.
It is carried across continue-as-new (a field a continued run no longer knows is left out).

Bookkeeping is synchronous: an Update decides and books its claims (and the signals it owes) here without
awaiting anything; the run loop then starts the booked claims and sends the booked signals. That makes every
size change atomic whatever the number of concurrent callers, and one workflow task can take many of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from api import contracts as c
from api.names import ClaimPhase, ClaimReason, provider_id
from domain import claims, law
from domain.timings import TIMINGS

# A failed claim stays visible to cluster-autoscaler (errorInfo) for longer than one of its loops (10 s by
# default, minutes when it backs off), so it can see the failure and stop waiting for that node.

# cluster-autoscaler's error classes: 1 (OutOfResources) makes it back off the whole group, 99 (Other) does not.
ERROR_CLASS_OUT_OF_RESOURCES = 1
ERROR_CLASS_OTHER = 99
# A slot whose machine failed its attempts in a row is capacity the group does not have right now.
OUT_OF_RESOURCES: dict[ClaimReason, str] = {ClaimReason.ATTEMPT_LIMIT_EXCEEDED: "no-capacity"}
# The stable error code cluster-autoscaler sees for every other reason a claim can fail with.
ERROR_CODES: dict[ClaimReason, str] = {
    ClaimReason.DEADLINE_EXCEEDED: "boot-timeout",
    ClaimReason.STARTUP_JOB_FAILED: "startup-job-failed",
    ClaimReason.STARTUP_JOB_TIMEOUT: "startup-job-timeout",
    ClaimReason.READINESS_GATE_TIMEOUT: "readiness-timeout",
    ClaimReason.MACHINE_GONE: "machine-gone",
    ClaimReason.SUPERSEDED: "superseded",
    ClaimReason.SLOT_DELETED: "slot-deleted",
    ClaimReason.INVALID_POD_SPEC: "invalid-pod-spec",
    ClaimReason.JOB_REFUSED: "job-refused",
    ClaimReason.CLAIM_REFUSED: "claim-refused",
    ClaimReason.OPERATOR_ERROR: "operator-error",
    ClaimReason.SLOT_NOT_FOUND: "slot-not-found",
    ClaimReason.GROUP_NOT_FOUND: "group-not-found",
}
# Reasons a claim ends with that are no failed boot (a release, a hand deletion, an adoption): no error code.
NOT_BOOT_FAILURES: frozenset[ClaimReason] = frozenset(
    {
        ClaimReason.NODE_DELETED,
        ClaimReason.CANCELLED_BY_DECREASE_TARGET_SIZE,
        ClaimReason.MAX_SIZE_REACHED,
        ClaimReason.DELETED_BY_HAND,
        ClaimReason.ADOPTED,
    }
)


def error_of(reason: str) -> tuple[str, int]:
    """cluster-autoscaler's error code and class for a failed claim's reason."""
    try:
        known = ClaimReason(reason)
    except ValueError:
        return "boot-failed", ERROR_CLASS_OTHER
    if known in OUT_OF_RESOURCES:
        return OUT_OF_RESOURCES[known], ERROR_CLASS_OUT_OF_RESOURCES
    return ERROR_CODES.get(known, "boot-failed"), ERROR_CLASS_OTHER


@dataclass
class Outgoing:
    """A signal the group owes a workflow: booked by a handler, sent by the run loop."""

    workflow_id: str
    signal: c.ClaimSignal | c.ReleaseSignal  # carried across continue-as-new as its wire name
    arg: Any = None


@dataclass
class SlotBook:
    """One slot as the group knows it."""

    name: str
    node_name: str
    provider_id: str
    observation: c.Observation = field(default_factory=c.Observation)
    activations: int = 0
    exists: bool = True
    live_claim: str = ""
    releasing: bool = False
    last_outcome: c.ClaimDigest | None = None
    problem: str = ""  # the slot's spec cannot power its machine: no claim is placed on it
    attempts_reset_at: datetime | None = None
    release: c.ReleaseSeed | None = None  # a release booked, not yet started
    release_after: datetime | None = None  # not before: its previous run of the same id is still closing
    release_restarts: int = 0

    @property
    def ever_claimed(self) -> bool:
        return self.last_outcome is not None or bool(self.live_claim)

    @property
    def free(self) -> bool:
        """No claim, no release: the slot can take a new claim."""
        return self.exists and not (self.live_claim or self.releasing)

    def claimability(self) -> claims.Claimability:
        """Whether a claim placed here could boot (its spec is usable, its next attempt within the limit)."""
        return claims.claimability(self.last_outcome, self.attempts_reset_at, self.problem)

    def next_attempt(self) -> int:
        return claims.seed_attempt(self.last_outcome, self.attempts_reset_at)

    def release_due(self, now: datetime) -> bool:
        return self.release is not None and (self.release_after is None or self.release_after <= now)

    def release_refused(self, seed: c.ReleaseSeed, now: datetime) -> None:
        """The slot's previous release still runs (closing, or left by a lost run): start this one later."""
        self.release, self.release_restarts = seed, self.release_restarts + 1
        wait = TIMINGS.release_restart_first * 2 ** min(self.release_restarts - 1, 16)
        self.release_after = now + min(wait, TIMINGS.reload_interval)

    def release_started(self) -> None:
        self.release_after, self.release_restarts = None, 0

    def heard_on_after(self, seen: c.Observation | None) -> bool:
        """The group holds a newer view than an owner's last (`seen`), and it shows the machine on."""
        return seen is not None and self.exists and self.observation.power == "on" and seen.older_than(self.observation)

    def record_outcome(self, digest: c.ClaimDigest) -> None:
        """The slot's last outcome moves only forward in time: an older claim's late report never replaces it."""
        held = self.last_outcome
        if held is None or held.name == digest.name or _order(digest) >= _order(held):
            self.last_outcome = digest


EPOCH = datetime.min.replace(tzinfo=UTC)


def _booked(seed: c.ClaimSeed) -> c.ClaimDigest:
    """What the group knows of a claim it has just decided, before its workflow reports."""
    return c.ClaimDigest(
        name=seed.name,
        slot=seed.slot,
        group=seed.group,
        phase=seed.phase,
        attempt=seed.attempt,
        call=seed.call,
        reason=seed.reason,
        marked=bool(seed.marked_reason),
        requested_at=seed.requested_at,
        deadline_at=seed.deadline_at,
        ttl_seconds=seed.ttl_seconds,
    )


def _order(d: c.ClaimDigest) -> tuple[datetime, str]:
    """Newest last: by requestedAt, then name (the one-live-claim rule's order)."""
    return (d.requested_at or EPOCH, d.name)


@dataclass
class GroupState:
    namespace: str
    name: str
    loaded: bool = False
    exists: bool = True
    min_size: int = 0
    max_size: int = 0
    max_provision_seconds: float = 0.0
    slots: dict[str, SlotBook] = field(default_factory=dict)
    claims: dict[str, c.ClaimDigest] = field(default_factory=dict)
    failures: list[c.ClaimDigest] = field(default_factory=list)
    # Since 0.4.0 (Patch.ERRORED_INSTANCE_NEVER_COMES_BACK, set by each run): a listed failure stays listed while its
    # machine is released (hidden during the release, it came back when the release ended, past maxSize: the soak
    # found target 5 of max 4), and a live claim on its slot replaces it for good (it came back when that claim ended).
    errored_never_back: bool = False
    template: dict[str, Any] | None = None
    inbox: list[c.SlotObservation] = field(default_factory=list)
    reload_requested: bool = False
    updates: int = 0
    updates_per_run: int = 1000  # well below Temporal's 2000 Updates per run: a burst never meets the limit
    claim_counter: int = 0
    problem: str = ""  # the Group's spec cannot be used: no claim is placed until it is fixed
    to_start: list[c.ClaimSeed] = field(default_factory=list)
    outbox: list[Outgoing] = field(default_factory=list)
    collect: dict[str, datetime] = field(default_factory=dict)  # terminal claim -> when its resource is collected
    scale: c.ScaleRecord | None = None  # the last size change, not yet written to Group.status
    # Claims whose workflow sent its final report, and when: a reload read before that may still list the
    # resource (not yet projected, collected or let go), and such a claim is never taken over again.
    ended: dict[str, datetime] = field(default_factory=dict)

    # --- derived -----------------------------------------------------------------------------------------
    def target_size(self) -> int:
        """Live claims not marked for deletion, and the failed ones still listed with their error.

        cluster-autoscaler backs a group off only while its scale-up is in flight (target above the machines that
        came): a failed instance that left the target at once ended that scale-up as a success, and the group was
        asked again at once, until its slots ran out of attempts. An errored instance stays in the target, like a
        cloud's failed VM, until cluster-autoscaler deletes it.
        """
        live = sum(1 for d in self.claims.values() if law.is_live(d.phase) and not d.marked)
        return live + len(self.listed_failures())

    def listed_failures(self) -> list[c.ClaimDigest]:
        """The failed claims listed as errored instances: remembered, on a slot that exists and has no live claim
        or release (a deleted slot is no instance: cluster-autoscaler could not delete it). Each counts in the target
        until cluster-autoscaler deletes it (DeleteNodes) or decreases the target past it."""
        latest = {f.slot: f for f in self.failures}  # a slot's newest failure is the one listed
        out: list[c.ClaimDigest] = []
        for name, f in sorted(latest.items()):
            slot = self.slots.get(name)
            if slot is None or not slot.exists or slot.live_claim:
                continue
            if slot.releasing and not self.errored_never_back:
                continue
            out.append(f)
        return out

    def phase_counts(self) -> dict[str, int]:
        """Claims the group tracks, by phase (every phase present, so a gauge drops to zero)."""
        counts = {str(p): 0 for p in ClaimPhase}
        for d in self.claims.values():
            counts[d.phase] = counts.get(d.phase, 0) + 1
        return counts

    def pending(self) -> list[c.ClaimDigest]:
        """Cancellable claims, newest first (DecreaseTargetSize takes these)."""
        found = [d for d in self.claims.values() if d.phase == ClaimPhase.PENDING and not d.marked]
        return sorted(found, key=_order, reverse=True)

    def slot_of(self, node: str) -> SlotBook | None:
        """A slot by what cluster-autoscaler calls a node: providerID, kubelet node name or slot name."""
        for slot in self.slots.values():
            if node in (slot.provider_id, slot.node_name, slot.name):
                return slot
        return None

    def next_collection(self) -> datetime | None:
        return min(self.collect.values(), default=None)

    # --- bookkeeping -------------------------------------------------------------------------------------
    def send(self, workflow_id: str, signal: c.ClaimSignal | c.ReleaseSignal, arg: Any = None) -> None:
        self.outbox.append(Outgoing(workflow_id, signal, arg))

    def book_claim(self, seed: c.ClaimSeed) -> None:
        """A claim counts from the moment it is decided: the target, the slot and the outbox all see it now."""
        self.to_start.append(seed)
        self.remember(_booked(seed))

    def start_superseded(self, seed: c.ClaimSeed) -> None:
        """A taken-over claim that a newer live claim on its slot outranks at once: its resource exists, so unlike
        a claim only the group knew of it is started and told it is superseded, and its workflow ends it (the
        resource is then collected by its TTL) instead of leaving it pending with no workflow behind it.
        """
        self.to_start.append(seed)
        self._supersede(_booked(seed), self.slots[seed.slot].live_claim)

    def _supersede(self, older: c.ClaimDigest, newest: str) -> None:
        """Book a started claim as superseded by `newest`; its workflow hears it next and hands the machine over."""
        self.claims[older.name] = replace(older, phase=ClaimPhase.FAILED, reason=ClaimReason.SUPERSEDED)
        self.send(c.claim_workflow_id(self.namespace, older.name), c.ClaimSignal.SUPERSEDED, newest)

    def mark(self, digest: c.ClaimDigest, reason: ClaimReason) -> None:
        """Book a scale-down of a live claim: it leaves the target now; its workflow hears it next (or starts
        with it, when it has not started yet).
        """
        self.claims[digest.name] = replace(digest, marked=True)
        for i, seed in enumerate(self.to_start):
            if seed.name == digest.name:
                self.to_start[i] = replace(seed, marked_reason=seed.marked_reason or reason)
                return
        self.send(
            c.claim_workflow_id(self.namespace, digest.name), c.ClaimSignal.MARK_FOR_DELETION, c.MarkRequest(reason)
        )

    def remember(self, digest: c.ClaimDigest) -> None:
        """Fold a claim's report into the slot books (the claim workflow is the authority on its phase).

        A claim's final report also brings its last view of the machine: the newer of it and the group's is kept,
        and a machine the group saw on after the claim last looked is released by law 3.
        """
        slot = self.slots.get(digest.slot)
        held = self.claims.get(digest.name)
        if held is not None and held.marked and not digest.marked:
            digest = replace(digest, marked=True)  # a mark is never undone by a report sent before it arrived
        if held is not None and held.reason == ClaimReason.SUPERSEDED and not digest.workflow_done:
            return  # superseded here already: a report it sent before it heard so changes nothing
        if digest.workflow_done:
            self.claims.pop(digest.name, None)
            if not digest.collected:
                ended = digest.finished_at or digest.requested_at or EPOCH
                self.collect[digest.name] = ended + timedelta(seconds=digest.ttl_seconds)
        else:
            self.claims[digest.name] = digest
        if digest.phase == ClaimPhase.FAILED and all(f.name != digest.name for f in self.failures):
            self.failures.append(digest)
        if slot is None:
            return
        if held is not None and held.phase == ClaimPhase.PENDING and digest.phase == ClaimPhase.BOOTING:
            slot.activations += 1  # counted here until the next reload reads the report's own number
        if law.is_live(digest.phase) and not digest.workflow_done:
            if not slot.live_claim or slot.live_claim == digest.name or self._newer(digest, slot.live_claim):
                slot.live_claim = digest.name
            if self.errored_never_back:  # a live claim on the slot replaces its errored instance for good
                self.failures = [f for f in self.failures if f.slot != slot.name or f.name == digest.name]
            self.supersede_older(slot.name)
            return
        if slot.live_claim == digest.name:
            slot.live_claim = ""
        slot.record_outcome(digest)
        if not digest.workflow_done or digest.hand_over:
            return
        if not digest.machine_off or digest.startup_job:
            self.book_release(slot, digest)
        elif digest.observation is not None:  # the final report: its last view of the machine
            if slot.heard_on_after(digest.observation) and not slot.live_claim:
                self.book_release(slot)
            elif digest.observation is not None:
                slot.observation = digest.observation.replacing(slot.observation)[0]

    def claim_lost(self, workflow_id: str) -> None:
        """A signal found no run of this live claim's workflow: it was lost (terminated by hand, or with Temporal's
        state) while this group's run survived. The group forgets it and reloads, which takes the claim over from
        its resource. A claim booked but not started yet, or one that has reported its end, is not lost."""
        name = next((n for n, d in self.claims.items() if c.claim_workflow_id(self.namespace, n) == workflow_id), "")
        digest = self.claims.get(name)
        if digest is None or not law.is_live(digest.phase) or any(seed.name == name for seed in self.to_start):
            return
        del self.claims[name]
        slot = self.slots.get(digest.slot)
        if slot is not None and slot.live_claim == name:
            slot.live_claim = ""
        self.reload_requested = True

    def _newer(self, digest: c.ClaimDigest, other: str) -> bool:
        held = self.claims.get(other)
        return held is None or _order(digest) >= _order(held)

    def supersede_older(self, slot_name: str) -> None:
        """The newest live claim owns the slot; every older live one is superseded (it hands the machine over)."""
        live = [d for d in self.claims.values() if d.slot == slot_name and law.is_live(d.phase) and not d.workflow_done]
        if len(live) < 2:
            return
        live.sort(key=_order)
        newest = live[-1]
        for older in live[:-1]:
            unstarted = [seed for seed in self.to_start if seed.name == older.name]
            if unstarted:  # never started: it never was, as far as anything outside the group knows
                self.to_start.remove(unstarted[0])
                self.claims.pop(older.name, None)
                continue
            self._supersede(older, newest.name)
        slot = self.slots.get(slot_name)
        if slot is not None:
            slot.live_claim = newest.name

    def book_release(self, slot: SlotBook, digest: c.ClaimDigest | None = None) -> None:
        """Law 3: the machine of a slot with no live claim is released (a claim's startup Job waited out first)."""
        if slot.releasing or slot.problem:
            return
        slot.releasing = True
        slot.release = c.ReleaseSeed(
            self.namespace,
            slot.name,
            self.name,
            claim=digest.name if digest else "",
            startup_job=digest.startup_job if digest else "",
            powered=digest.powered if digest else False,
        )

    def forget_failures(self, now: datetime) -> None:
        self.failures = [
            f for f in self.failures if f.finished_at is None or now - f.finished_at < TIMINGS.failure_memory
        ]
        # A read outlives no reload interval (its activity's timeouts are far shorter).
        self.ended = {name: at for name, at in self.ended.items() if now - at < TIMINGS.reload_interval}

    def instances(self) -> list[c.Instance]:
        """Every slot with a live claim, a release or a machine on, as cluster-autoscaler sees it."""
        out: list[c.Instance] = []
        failed = {f.slot: f for f in self.listed_failures()}
        for slot in sorted(self.slots.values(), key=lambda s: s.name):
            claim = self.claims.get(slot.live_claim) if slot.live_claim else None
            if claim is not None:
                state = "deleting" if claim.marked else ("running" if claim.phase == ClaimPhase.READY else "creating")
                out.append(c.Instance(slot.provider_id, slot.name, claim.name, state))
            elif slot.releasing and slot.name not in failed:
                out.append(c.Instance(slot.provider_id, slot.name, "", "deleting"))
            elif slot.name in failed:
                f = failed[slot.name]
                code, error_class = error_of(f.reason)
                out.append(
                    c.Instance(
                        slot.provider_id,
                        slot.name,
                        f.name,
                        "creating",
                        error_code=code,
                        error_class=error_class,
                        error_message=f"claim {f.name} failed: {f.reason}" + (f": {f.message}" if f.message else ""),
                    )
                )
            elif slot.observation.power == "on":
                out.append(c.Instance(slot.provider_id, slot.name, "", "running"))
        return out


def new_slot(namespace: str, view: c.SlotView) -> SlotBook:
    return SlotBook(
        name=view.name,
        node_name=view.node_name,
        provider_id=view.provider_id or provider_id(namespace, view.name),
        observation=view.observation,
        activations=view.activations_last_24h,
    )
