"""Chaos inside the simulated cluster: API faults at a rate, dropped watches, compactions, and a control surface.

`Chaos` makes a seeded fraction of the API requests fail as a busy or restarting API server does (500, 503,
429, 409, or an answer slower than the client waits), ends every open watch now and then, and compacts the
history so a resumed watch gets 410 Gone. The chaos suite (tests/chaos.py) drives it from another process
through `/_sim/...` (never faulted): `/_sim/state` is the cluster's truth (machines' real power, claims, Jobs),
`/_sim/chaos` changes the rates, `/_sim/store` stores an object as it is (an object an older API server took).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

from homelab_sim.emulator import Fault, KubeEmulator, RequestInfo
from homelab_sim.homelab import Homelab

Obj = dict[str, Any]
CRD = "infra.homecluster.dev/v2alpha1"

# What a failing request answers: the transient errors a client must retry, and a reply too slow to wait for.
TRANSIENT: tuple[tuple[int, str], ...] = (
    (500, "InternalError"),
    (503, "ServiceUnavailable"),
    (429, "TooManyRequests"),
    (409, "Conflict"),
)


@dataclass
class ChaosSettings:
    seed: int = 0
    fault_rate: float = 0.0  # the fraction of API requests (watches included) that fail
    slow_seconds: float = 12.0  # how long a "timeout" takes to answer (past a client's request timeout)
    drop_watches_every: float = 0.0  # seconds between two ends of every open watch (0: never)
    compact_every: float = 0.0  # seconds between two compactions (0: never)


class Chaos:
    """Faults and watch drops on one emulator; `stats` counts what was done."""

    def __init__(self, emulator: KubeEmulator, homelab: Homelab, settings: ChaosSettings) -> None:
        self.emulator = emulator
        self.homelab = homelab
        self.settings = settings
        self.rng = random.Random(settings.seed)
        self.stats: Counter[str] = Counter()
        self._fault = Fault(match=self._decide, times=None)
        self._tasks: list[asyncio.Task[None]] = []

    def install(self) -> None:
        """Start: the fault goes first in line, the periodic drops run on the emulator's loop, the controls answer."""
        self.emulator.faults.insert(0, self._fault)
        self.emulator.control.update({"state": self.state, "chaos": self.configure, "store": self.store})
        self._tasks = [
            asyncio.get_running_loop().create_task(self._every("drop_watches_every", self._drop)),
            asyncio.get_running_loop().create_task(self._every("compact_every", self._compact)),
        ]

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()

    # --- the faults -----------------------------------------------------------------------------------------
    def _decide(self, info: RequestInfo) -> bool:
        """Whether this request fails, and how (set on the fault itself, which the emulator then applies)."""
        if self.settings.fault_rate <= 0 or self.rng.random() >= self.settings.fault_rate:
            return False
        if self.rng.random() < 0.15:
            self._fault.status, self._fault.delay = None, self.settings.slow_seconds
            self.stats["slow answers"] += 1
        else:
            status, reason = self.rng.choice(TRANSIENT)
            self._fault.status, self._fault.reason, self._fault.delay = status, reason, 0.0
            self.stats[f"{status} answers"] += 1
        return True

    async def _every(self, setting: str, act: Any) -> None:
        while True:
            every = float(getattr(self.settings, setting))
            await asyncio.sleep(every * (0.5 + self.rng.random()) if every > 0 else 1.0)
            if every > 0:
                act()

    def _drop(self) -> None:
        self.stats["watches dropped"] += 1
        self.emulator.drop_watches()

    def _compact(self) -> None:
        self.stats["compactions"] += 1
        self.emulator.compact()

    # --- the control surface -----------------------------------------------------------------------------------
    def configure(self, arg: Obj | None) -> Obj:
        """`POST /_sim/chaos {"fault_rate": 0, ...}`: change the rates (a chaos run ends with quiet)."""
        for key, value in (arg or {}).items():
            if not hasattr(self.settings, key) or key == "seed":
                raise KeyError(f"no chaos setting {key!r}")
            setattr(self.settings, key, float(value))
        return {"settings": vars(self.settings), "stats": dict(self.stats)}

    def store(self, arg: Obj | None) -> Obj:
        """`POST /_sim/store {"plural": ..., "object": ...}`: store an object as it is, with no admission."""
        if not arg:
            raise KeyError("store needs a plural and an object")
        stored = self.emulator.put_object(
            CRD, str(arg["plural"]), arg["object"], arg["object"]["metadata"]["namespace"]
        )
        return {"stored": stored["metadata"]["name"]}

    def state(self, _: Obj | None) -> Obj:
        """The cluster's truth: each machine's real power and stage, the claims, the lifecycle Jobs, the stats."""
        ns = self.homelab.spec.namespace
        jobs = [
            {
                "name": j["metadata"]["name"],
                "labels": j["metadata"].get("labels") or {},
                "conditions": [c.get("type") for c in (j.get("status") or {}).get("conditions") or []],
            }
            for j in self.emulator.objects_of("batch/v1", "jobs", ns)
        ]
        claims = [
            {
                "name": c["metadata"]["name"],
                "uid": c["metadata"].get("uid"),
                "slot": (c.get("spec") or {}).get("node"),
                "phase": (c.get("status") or {}).get("phase"),
                "reason": (c.get("status") or {}).get("reason"),
                "deleting": bool(c["metadata"].get("deletionTimestamp")),
                "finalizers": c["metadata"].get("finalizers") or [],
            }
            for c in self.emulator.objects_of(CRD, "nodeclaims", ns)
        ]
        machines = {name: {"power": m.power, "stage": str(m.stage)} for name, m in self.homelab.machines.items()}
        return {
            "machines": machines,
            "claims": claims,
            "jobs": jobs,
            "slots": sorted(o["metadata"]["name"] for o in self.emulator.objects_of(CRD, "nodes", ns)),
            "stats": {**self.stats, **self.homelab.stats},
        }
