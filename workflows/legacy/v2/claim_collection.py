"""Collection: a terminal claim is deleted ttlSecondsAfterFinished after finishedAt, and its workflow ends."""

from __future__ import annotations

from datetime import timedelta

from api import contracts as c
from workflows.legacy.v2.claim_release import release_finalizer
from workflows.legacy.v2.claim_runtime import ClaimRuntime


async def collect(rt: ClaimRuntime) -> None:
    s = rt.s
    finished = s.finished_at or rt.now()
    end = finished + timedelta(seconds=s.seed.ttl_seconds)
    rt.details(f"{s.phase} ({s.reason or 'no reason'}); collected at {end:%Y-%m-%d %H:%M:%S}Z")
    await rt.wait(lambda: s.resource_gone or s.collect_now, max(end - rt.now(), timedelta(0)), "TTL after finished")
    if s.resource_gone:
        return
    await release_finalizer(rt)
    await rt.write(c.Act.DELETE_CLAIM, c.ClaimRef(s.seed.namespace, s.seed.name), f"collect claim {s.seed.name}")
    s.resource_gone = True
