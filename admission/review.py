"""The seed's admission rule of one live claim per slot, as a pure function of an AdmissionReview and the claims
of its namespace.

A write is judged only when it makes a claim live on a slot: a create (the API server strips a create's status,
so every created claim is pending), an update that moves a terminal claim back to a live phase, or one that points
a live claim at another slot. It is refused when another live claim names that slot, with a message naming the
slot and that claim. A terminal write, a delete, and any write that leaves a claim's liveness and slot as they
were pass. The registration (deploy/components/admission) sends the webhook only what it could refuse: it leaves
out the operator's own writes and deletes, so those pass even while the webhook is down.

The group workflow is the authority on a slot's live claim; this belt only refuses, at once and with words, what
the group would otherwise end `Superseded` a moment later (a hand-applied claim on a busy slot).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from api import names
from kube.objects import meta, spec, status
from kube.views import claim_is_live, claim_order

JSON = dict[str, Any]

REVIEW_API_VERSION = "admission.k8s.io/v1"
# The registration names the webhook and its path; deploy/components/admission and the tests use these.
WEBHOOK_NAME = f"{names.PLURAL_NODECLAIMS}.{names.GROUP}"
WEBHOOK_PATH = "/validate-nodeclaims"


class BadReview(ValueError):
    """The body is no AdmissionReview v1 request: answered 400, which the API server counts as a failed call."""


@dataclass(frozen=True)
class Verdict:
    """The answer to one review: allowed, or refused with the HTTP code and reason the API server passes on."""

    allowed: bool
    message: str = ""
    code: int = 200
    reason: str = ""


ALLOWED = Verdict(True)


@dataclass(frozen=True)
class Review:
    """What a review asks: an operation on a NodeClaim, its new and old object (either may be absent)."""

    uid: str
    operation: str
    namespace: str
    name: str
    obj: JSON | None
    old: JSON | None
    user: str

    @property
    def slot(self) -> str:
        return str(spec(self.obj).get("node") or "")


def parse(body: Any) -> Review:
    """An AdmissionReview v1 request, or `BadReview` saying what is wrong with it."""
    if not isinstance(body, dict) or body.get("apiVersion") != REVIEW_API_VERSION:
        raise BadReview(f"expected an AdmissionReview of {REVIEW_API_VERSION}")
    request = body.get("request")
    if not isinstance(request, dict) or not request.get("uid"):
        raise BadReview("the AdmissionReview has no request with a uid")
    obj, old = request.get("object"), request.get("oldObject")
    obj = obj if isinstance(obj, dict) else None
    old = old if isinstance(old, dict) else None
    user = request.get("userInfo")
    return Review(
        uid=str(request["uid"]),
        operation=str(request.get("operation") or ""),
        namespace=str(request.get("namespace") or meta(obj).get("namespace") or ""),
        # a generated name is set before validating admission; the request's own is "" then
        name=str(meta(obj).get("name") or request.get("name") or meta(obj).get("generateName") or ""),
        obj=obj,
        old=old,
        user=str(user.get("username") or "") if isinstance(user, dict) else "",
    )


def makes_live(review: Review) -> bool:
    """Whether the write makes a claim live on its slot: what the one-live-claim rule judges.

    A create (whatever its body says, the API server has stripped its status), a terminal claim moved back to a
    live phase (a status write), or a live claim pointed at another slot. Everything else keeps the claim as
    live as it was, on the slot it was on: a terminal write, a finalizer removed, the seed's shutdown-streak reset.
    """
    if review.operation not in ("CREATE", "UPDATE") or review.obj is None or not claim_is_live(review.obj):
        return False
    if review.operation == "CREATE" or review.old is None:
        return True
    return not claim_is_live(review.old) or spec(review.old).get("node") != spec(review.obj).get("node")


def rivals(review: Review, claims: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The other live claims of the review's namespace on its slot, newest last (the newest owns the slot)."""
    found = [
        c
        for c in claims
        if str(meta(c).get("namespace") or review.namespace) == review.namespace
        and str(meta(c).get("name") or "") != review.name
        and str(spec(c).get("node") or "") == review.slot
        and claim_is_live(c)
    ]
    return sorted(found, key=claim_order)


def refusal(review: Review, live: Sequence[Mapping[str, Any]]) -> Verdict:
    """The seed's message: it names the slot and the live claim, and says how the slot becomes free."""
    owner = live[-1]
    other = str(meta(owner).get("name") or "")
    phase = str(status(owner).get("phase") or names.ClaimPhase.PENDING)
    state = phase + (", being deleted" if meta(owner).get("deletionTimestamp") else "")
    more = f" (and {len(live) - 1} more)" if len(live) > 1 else ""
    message = (
        f'nodeclaim "{review.name}" would be a second live claim on slot "{review.slot}": "{other}" is live there '
        f"({state}){more}. One live claim per slot: wait until it ends, or delete it (a booting or ready claim "
        "powers its machine off first)"
    )
    return Verdict(False, message, 403, "Forbidden")


def judge(review: Review, claims: Sequence[Mapping[str, Any]]) -> Verdict:
    """Refuse a write that makes a claim live on a slot another live claim holds; allow everything else."""
    if not makes_live(review):
        return ALLOWED
    live = rivals(review, claims)
    return refusal(review, live) if live else ALLOWED


def unjudged(review: Review, problem: str) -> Verdict:
    """The claims could not be read: refused (the failure policy's own choice), saying so and that nothing was
    written, so the person retries instead of wondering."""
    return Verdict(
        False,
        f'cannot check slot "{review.slot}" for a live claim: {problem}. Nothing was written; try again',
        503,
        "ServiceUnavailable",
    )


def response(uid: str, verdict: Verdict) -> JSON:
    """The AdmissionReview v1 response the API server reads."""
    answer: JSON = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        answer["status"] = {"code": verdict.code, "reason": verdict.reason, "message": verdict.message}
    return {"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "response": answer}
