"""The admission belt of one live claim per slot on the real kube-apiserver (`make e2e-real`, issue 25).

The registration is deploy/components/admission's, its Service reference replaced by a loopback URL and its CA
given as the caBundle (no kube-proxy here, and no cert-manager: tests/realcluster/stack.py says so); the webhook
is the operator's, served by its `provider` process on a ServiceAccount token, as in the story. No
cluster-autoscaler: the claims here are the operator's adoptions and a person's `kubectl`.

1. the rule, judged by the real server's CEL and the webhook, on claims in a namespace the operator does not manage
   (so nothing runs them): a create, a terminal write, a status write that revives a claim, a slot changed;
2. `kubectl apply` of a second live claim on a busy slot is refused with the seed's message; one on a free slot is
   allowed (a server-side dry run: nothing is stored);
3. the operator's webhook down (its `provider` process stopped): a person's delete of a live claim passes, the
   worker reverses the machine and writes the claim's end and lets it go, every one of its NodeClaim writes
   admitted; a new claim by hand is refused by the failure policy;
4. the webhook back: the rule holds again.

tests/test_admission.py runs the same registration through the emulator in `make test`; the refusal kubectl
prints is pinned there from what this server printed.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.realcluster import audit
from tests.realcluster.cluster import wait_until
from tests.realcluster.stack import NS, WEBHOOK, Stack, kept, phase, seed_refusal
from tests.realcluster.stack import hand_claim as claim

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(600)]

SCRATCH = "scratch"  # a namespace the operator does not manage: its claims are only judged, never run


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    # the workers' machines adopted: each has a live claim
    with kept(
        request, "homelab-admission-real-", lambda d: Stack(d, driver="none").start_with_machines_on("workers")
    ) as s:
        yield s


def live_claim_of(s: Stack, slot: str) -> dict[str, Any]:
    (found,) = [c for c in s.claims() if c["spec"]["node"] == slot and phase(c) in ("", "pending", "booting", "ready")]
    return found


def adopted(s: Stack, slot: str) -> bool:
    return any(c["spec"]["node"] == slot and phase(c) == "ready" for c in s.claims())


def test_1_the_rule_on_the_real_server_create_terminal_revival_and_a_changed_slot(stack: Stack) -> None:
    s = stack
    kc = s.cluster.kubectl
    kc("create", "namespace", SCRATCH)
    before = s.admission_reviews()
    kc("apply", "-f", "-", input=claim("first", "s", SCRATCH))
    # a terminal write: never sent
    kc("patch", "nodeclaim", "first", "-n", SCRATCH, "--subresource=status", "--type=merge",
       "-p", '{"status":{"phase":"failed"}}')  # fmt: skip
    kc("apply", "-f", "-", input=claim("second", "s", SCRATCH))  # beside a terminal claim: allowed
    revived = kc("patch", "nodeclaim", "first", "-n", SCRATCH, "--subresource=status", "--type=merge",
                 "-p", '{"status":{"phase":"pending"}}', check=False)  # fmt: skip
    assert revived.returncode == 1
    assert revived.stderr == f"Error from server (Forbidden): {seed_refusal('first', 's', 'second', 'pending')}\n"
    kc("patch", "nodeclaim", "second", "-n", SCRATCH, "--type=merge", "-p", '{"spec":{"node":"t"}}')  # t is free
    third = kc("apply", "-f", "-", input=claim("third", "t", SCRATCH), check=False)
    assert third.returncode == 1 and seed_refusal("third", "t", "second", "pending") in third.stderr, third.stderr
    kc("delete", "nodeclaim", "second", "-n", SCRATCH)  # a delete of a live claim: never sent
    after = s.admission_reviews()
    assert (after - before) == {"allowed": 3, "refused": 2}, "sent: 3 creates and a slot change; the rest never"


def test_2_kubectl_apply_of_a_second_live_claim_on_a_busy_slot_is_refused_with_the_seeds_message(
    stack: Stack,
) -> None:
    s = stack
    for slot in ("machine-1", "machine-2"):
        wait_until(f"{slot} adopted (a live claim of the operator's)", functools.partial(adopted, s, slot), within=90)
    owner = live_claim_of(s, "machine-1")
    done = s.cluster.kubectl("apply", "-f", "-", input=claim("by-hand", "machine-1"), check=False)
    print(f"\nkubectl apply of a second live claim on machine-1, against kube-apiserver 1.35.4:\n{done.stderr}")
    assert done.returncode == 1
    assert done.stderr == (
        'Error from server (Forbidden): error when creating "STDIN": '
        f"{seed_refusal('by-hand', 'machine-1', owner['metadata']['name'], 'ready')}\n"
    )
    free = s.cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=claim("by-hand", "spare-1"))
    assert "created (server dry run)" in free.stdout
    assert "by-hand" not in {c["metadata"]["name"] for c in s.claims()}, "neither the refused nor the dry run stored"


def test_3_with_the_webhook_down_a_delete_and_the_operators_own_writes_pass(stack: Stack) -> None:
    s = stack
    s.roles["provider"].stop()  # the webhook's process; the registration stays, failurePolicy Fail
    down_at, down_since = time.monotonic(), datetime.now(UTC)
    refused = s.cluster.kubectl("apply", "-f", "-", input=claim("by-hand", "spare-1"), check=False)
    assert refused.returncode == 1 and refused.stderr.startswith(
        'Error from server (InternalError): error when creating "STDIN": Internal error occurred: failed calling '
        f'webhook "{WEBHOOK}": failed to call webhook: Post "https://127.0.0.1:{s.webhook_port}/validate-nodeclaims'
        '?timeout=5s": dial tcp'
    ), refused.stderr
    doomed = live_claim_of(s, "machine-2")["metadata"]["name"]
    s.cluster.kubectl("delete", "nodeclaim", doomed, "-n", NS, "--wait=false")  # a person's delete of a live claim
    wait_until(f"{doomed} reversed (machine-2 shut down), ended and let go by the operator",
               lambda: doomed not in {c["metadata"]["name"] for c in s.claims()}, within=240,
               procs=[s.roles["worker"], s.roles["watch"]])  # fmt: skip
    assert any(r.operation == "shutdown" and r.slot == "machine-2" for r in s.executor.records), s.executor.records
    writes = [e for e in audit.read(s.cluster.audit_log) if e.user == audit.OPERATOR and e.name == doomed
              and e.resource.startswith("nodeclaims") and e.verb not in ("get", "list", "watch")
              and datetime.fromisoformat(e.at.replace("Z", "+00:00")) >= down_since]  # fmt: skip
    rows = "\n".join(f"| {e.verb} | {e.resource} | {e.code} | {_phase_written(e)} |" for e in writes)
    print(f"\nthe operator's writes to {doomed} with its webhook down ({time.monotonic() - down_at:.0f} s):\n"
          f"| verb | resource | code | phase written |\n|---|---|---|---|\n{rows}")  # fmt: skip
    # a compare-and-set may meet 409 (a newer write landed); admission's refusal is 403, a failed call 500
    assert writes and not [e for e in writes if e.code == 403 or e.reason == "InternalError"], rows
    assert any(_phase_written(e) == "completed" for e in writes), "the claim's end was written"
    assert adopted(s, "machine-1"), "the other machine's claim is untouched"


def _phase_written(event: audit.AuditEvent) -> str:
    body = event.request if isinstance(event.request, dict) else {}
    return str((body.get("status") or {}).get("phase") or "")


def test_4_the_webhook_back_the_rule_holds_again(stack: Stack) -> None:
    s = stack
    s.restart_role("provider")
    owner = live_claim_of(s, "machine-1")["metadata"]["name"]
    done = s.cluster.kubectl("apply", "-f", "-", input=claim("by-hand", "machine-1"), check=False)
    assert done.returncode == 1 and seed_refusal("by-hand", "machine-1", owner, "ready") in done.stderr, done.stderr
    free = s.cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=claim("by-hand", "machine-2"))
    assert "created (server dry run)" in free.stdout, "machine-2's claim ended: the slot is free"
    assert s.admission_reviews() == {"refused": 1, "allowed": 1}, "only the person's two claims were sent"
