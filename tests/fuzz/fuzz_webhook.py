"""Coverage-guided fuzzing of the admission webhook's review handling (atheris): the body the API server posts,
as `Webhook.handle` treats it (JSON, then `parse`, then `makes_live`, `judge` against the namespace's claims, and
the response it writes), with the claims listed drawn from the same input.

Only the refusals the handler expects (not JSON, `BadReview`) may leave it; anything else, a crash or an allocation
past libFuzzer's -malloc_limit_mb fails the run. `python -m tests.fuzz.run` drives it for a bounded time.
"""

from __future__ import annotations

import json
import sys

import atheris  # type: ignore[import-untyped]

with atheris.instrument_imports(include=["provider", "proto", "admission"]):
    from admission import review as rv


def one(data: bytes) -> None:
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):  # aiohttp's request.json(): not JSON, refused with 400
        return
    try:
        review = rv.parse(body)
    except rv.BadReview:
        return
    claims = body.get("claims") if isinstance(body, dict) else None
    listed = [c for c in claims if isinstance(c, dict)] if isinstance(claims, list) else []
    verdict = rv.judge(review, listed) if rv.makes_live(review) else rv.ALLOWED
    json.dumps(rv.response(review.uid, verdict))
    json.dumps(rv.response(review.uid, rv.unjudged(review, "fuzz")))


def seeds() -> list[bytes]:
    """A live claim made by a person, and its rival already stored: the review the webhook refuses."""
    claim = {"apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "NodeClaim",
             "metadata": {"name": "c2", "namespace": "ns"}, "spec": {"node": "s1", "group": "g"}}  # fmt: skip
    rival = {**claim, "metadata": {"name": "c1", "namespace": "ns"}, "status": {"phase": "booting"}}
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "operation": "CREATE", "namespace": "ns", "object": claim,
                        "userInfo": {"username": "alice"}},
            "claims": [rival]}  # fmt: skip
    return [json.dumps(body).encode(), json.dumps({**body, "claims": []}).encode()]


def main() -> None:
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
