"""The group's whole state: its bounds, its slots, and the claims whose workflows still run.

The group is the single authority on its size: target size is a count over `claims`, computed, never stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from api import contracts as c
from api.names import ClaimPhase, provider_id
from domain import law
from domain.timings import TIMINGS

# A failed claim stays visible to cluster-autoscaler (errorInfo) for longer than one of its loops (10 s by
# default, minutes when it backs off), so it can see the failure and stop waiting for that node.

# cluster-autoscaler's error classes: 1 (OutOfResources) makes it back off the whole group, 99 (Other) does not.
ERROR_CLASS_OUT_OF_RESOURCES = 1
ERROR_CLASS_OTHER = 99
# A slot whose machine failed its attempts in a row is capacity the group does not have right now.
OUT_OF_RESOURCES: dict[str, str] = {"AttemptLimitExceeded": "no-capacity"}
ERROR_CODES: dict[str, str] = {
    "DeadlineExceeded": "boot-timeout",
    "StartupJobFailed": "startup-job-failed",
    "StartupJobTimeout": "startup-job-timeout",
    "ReadinessGateTimeout": "readiness-timeout",
    "MachineGone": "machine-gone",
    "Superseded": "superseded",
    "SlotDeleted": "slot-deleted",
    "StuckTransition": "stuck-transition",
}


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
    draining_claim: str = ""
    releasing: bool = False
    last_outcome: c.ClaimDigest | None = None

    @property
    def ever_claimed(self) -> bool:
        return self.last_outcome is not None or bool(self.live_claim or self.draining_claim)

    @property
    def free(self) -> bool:
        """No claim, no drain, no release: the slot can take a new claim."""
        return self.exists and not (self.live_claim or self.draining_claim or self.releasing)


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
    template: dict[str, Any] | None = None
    inbox: list[c.SlotObservation] = field(default_factory=list)
    reload_requested: bool = False
    updates: int = 0
    updates_per_run: int = 1000  # well below Temporal's 2000 Updates per run: a burst never meets the limit
    claim_counter: int = 0

    # --- derived -----------------------------------------------------------------------------------------
    def target_size(self) -> int:
        """Live claims not marked for deletion: what cluster-autoscaler asked for and still wants."""
        return sum(1 for d in self.claims.values() if law.is_live(d.phase) and not d.marked)

    def phase_counts(self) -> dict[str, int]:
        """Claims the group tracks, by phase (every phase present, so a gauge drops to zero)."""
        counts = {str(p): 0 for p in ClaimPhase}
        for d in self.claims.values():
            counts[d.phase] = counts.get(d.phase, 0) + 1
        return counts

    def pending(self) -> list[c.ClaimDigest]:
        """Cancellable claims, newest first (DecreaseTargetSize takes these)."""
        found = [d for d in self.claims.values() if d.phase == ClaimPhase.PENDING and not d.marked]
        return sorted(found, key=lambda d: (d.requested_at or datetime.min, d.name), reverse=True)

    def slot_of(self, node: str) -> SlotBook | None:
        """A slot by what cluster-autoscaler calls a node: providerID, kubelet node name or slot name."""
        for slot in self.slots.values():
            if node in (slot.provider_id, slot.node_name, slot.name):
                return slot
        return None

    def remember(self, digest: c.ClaimDigest) -> None:
        """Fold a claim's report into the slot books (the claim workflow is the authority on its phase)."""
        slot = self.slots.get(digest.slot)
        held = self.claims.get(digest.name)
        if held is not None and held.marked and not digest.marked:
            digest = replace(digest, marked=True)  # a mark is never undone by a report sent before it arrived
        if digest.workflow_done:
            self.claims.pop(digest.name, None)
        else:
            self.claims[digest.name] = digest
        if slot is None:
            return
        if held is not None and held.phase == ClaimPhase.PENDING and digest.phase == ClaimPhase.BOOTING:
            slot.activations += 1  # counted here until the next reload reads the report's own number
        if law.is_live(digest.phase) and not digest.workflow_done:
            slot.live_claim = digest.name
        else:
            if slot.live_claim == digest.name:
                slot.live_claim = ""
            slot.last_outcome = digest
            if not digest.machine_off and not digest.workflow_done:
                slot.draining_claim = digest.name
            elif slot.draining_claim == digest.name:
                slot.draining_claim = ""
        if digest.phase == ClaimPhase.FAILED and all(f.name != digest.name for f in self.failures):
            self.failures.append(digest)

    def forget_failures(self, now: datetime) -> None:
        self.failures = [
            f for f in self.failures if f.finished_at is None or now - f.finished_at < TIMINGS.failure_memory
        ]

    def instances(self) -> list[c.Instance]:
        """Every slot with a live claim, a drain, a release or a machine on, as cluster-autoscaler sees it."""
        out: list[c.Instance] = []
        failed = {f.slot: f for f in self.failures}
        for slot in sorted(self.slots.values(), key=lambda s: s.name):
            claim = self.claims.get(slot.live_claim) if slot.live_claim else None
            if claim is not None:
                state = "deleting" if claim.marked else ("running" if claim.phase == ClaimPhase.READY else "creating")
                out.append(c.Instance(slot.provider_id, slot.name, claim.name, state))
            elif slot.draining_claim or slot.releasing:
                out.append(c.Instance(slot.provider_id, slot.name, slot.draining_claim, "deleting"))
            elif slot.name in failed:
                f = failed[slot.name]
                out.append(
                    c.Instance(
                        slot.provider_id,
                        slot.name,
                        f.name,
                        "creating",
                        error_code=OUT_OF_RESOURCES.get(f.reason) or ERROR_CODES.get(f.reason, "boot-failed"),
                        error_class=ERROR_CLASS_OUT_OF_RESOURCES if f.reason in OUT_OF_RESOURCES else ERROR_CLASS_OTHER,
                        error_message=f"claim {f.name} failed: {f.reason}",
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
