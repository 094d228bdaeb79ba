"""Leader election over a coordination.k8s.io/v1 Lease, so two `watch` replicas never both write reports.

Every change of the Lease is a compare-and-set on its resourceVersion: of two replicas racing for it, one
write lands and the other gets a Conflict and stays a follower. The holder renews; another replica takes the
Lease over once it has not been renewed for its duration, or at once when the holder released it on stop.

A leader renews with one write guarded by the resourceVersion its own last write returned, not a read and a
write: the Lease is ours until someone else's write, and that write changes the version, so the renewal then gets a
Conflict and the tick reads the Lease as a follower would (an idle leader's Lease requests halve, issue 34).

The leader stops acting on its own before anyone may take over: it counts itself leader only until
`renew_deadline` (two thirds of the duration) after its last successful renewal, so a leader cut off from the
API server has stopped writing before the Lease expires for the others.

Time is an argument (`tick(now)`), so tests hand the Lease over without sleeping.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kube.adapter import Kube
from kube.errors import Conflict, KubeError, NotFound
from kube.objects import meta, spec
from watchers.cluster import parse_time

log = logging.getLogger(__name__)

RELEASE_ATTEMPTS = 3


def micro_time(when: datetime) -> str:
    """metav1.MicroTime: RFC 3339 with microseconds, UTC."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaderElector:
    kube: Kube
    namespace: str
    name: str
    identity: str
    duration: timedelta = timedelta(seconds=15)
    leading: bool = False
    renewed_at: datetime | None = None
    transitions: int = 0  # how many times this replica became leader
    held_version: str = ""  # the Lease's resourceVersion our own last write returned ("" when unknown)

    @property
    def renew_deadline(self) -> timedelta:
        return self.duration * 2 / 3

    def _spec(self, now: datetime, **extra: Any) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.duration.total_seconds())),
            "renewTime": micro_time(now),
            **extra,
        }

    def tick(self, now: datetime) -> bool:
        """Acquire, renew or wait for the Lease at `now`; True while this replica is the leader."""
        try:
            got = self._try(now)
        except KubeError as exc:
            log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            got = self.leading and self.renewed_at is not None and now - self.renewed_at < self.renew_deadline
        if got and not self.leading:
            self.transitions += 1
            log.info("lease %s/%s: %s is the leader", self.namespace, self.name, self.identity)
        elif self.leading and not got:
            log.info("lease %s/%s: %s is no longer the leader", self.namespace, self.name, self.identity)
        self.leading = got
        return got

    def _wrote(self, lease: Any, now: datetime) -> bool:
        """Book a write of ours that landed: renewed at `now`, and the version the next renewal is guarded by."""
        self.held_version = str(meta(lease).get("resourceVersion") or "") if isinstance(lease, dict) else ""
        self.renewed_at = now
        return True

    def _try(self, now: datetime) -> bool:
        if self.leading and self.held_version:
            try:
                return self._wrote(self.kube.patch_lease(self.namespace, self.name, self._spec(now),
                                                         self.held_version), now)  # fmt: skip
            except (Conflict, NotFound):
                pass  # written (or deleted) by someone else since: read it, as a follower would
        self.held_version = ""
        lease = self.kube.get_lease(self.namespace, self.name)
        if lease is None:
            created = self.kube.create_lease(
                self.namespace, self.name, self._spec(now, acquireTime=micro_time(now), leaseTransitions=0)
            )
            if created is None:
                return False
            return self._wrote(created, now)
        held = spec(lease)
        holder = str(held.get("holderIdentity") or "")
        rv = str(meta(lease).get("resourceVersion") or "")
        if holder == self.identity:
            try:
                return self._wrote(self.kube.patch_lease(self.namespace, self.name, self._spec(now), rv), now)
            except Conflict:
                return False
        renewed = parse_time(held.get("renewTime"))
        lasts = timedelta(seconds=float(held.get("leaseDurationSeconds") or self.duration.total_seconds()))
        if holder and renewed is not None and now <= renewed + lasts:
            return False
        transitions = int(held.get("leaseTransitions") or 0) + (1 if holder else 0)
        try:
            taken = self.kube.patch_lease(
                self.namespace,
                self.name,
                self._spec(now, acquireTime=micro_time(now), leaseTransitions=transitions),
                rv,
            )
        except Conflict:
            return False
        return self._wrote(taken, now)

    def release(self, now: datetime) -> None:
        """Give the Lease up on stop, so a follower takes over at its next tick instead of after the duration."""
        was = self.leading
        self.leading, self.held_version = False, ""
        if not was:
            return
        try:
            # A renewal still in flight on another thread may land between the read and the write: read again.
            for _ in range(RELEASE_ATTEMPTS):
                lease = self.kube.get_lease(self.namespace, self.name)
                if lease is None or spec(lease).get("holderIdentity") != self.identity:
                    return
                rv = str(meta(lease).get("resourceVersion") or "")
                try:
                    self.kube.patch_lease(
                        self.namespace, self.name, {"holderIdentity": None, "renewTime": micro_time(now)}, rv
                    )
                except Conflict:
                    continue
                log.info("lease %s/%s released by %s", self.namespace, self.name, self.identity)
                return
            log.warning("lease %s/%s: still changing after %d tries; left to expire", self.namespace, self.name,
                        RELEASE_ATTEMPTS)  # fmt: skip
        except KubeError as exc:  # the others take over after the duration instead
            log.warning("lease %s/%s not released: %s", self.namespace, self.name, exc)
