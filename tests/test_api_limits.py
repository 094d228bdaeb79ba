"""API limits: every name the operator derives fits what kube-apiserver accepts, for every slot name the CRD takes.

Slot and Group names are DNS-1123 subdomains of up to 253 characters; what the operator derives from them is held
to tighter limits (label values and Job names: 63). First the naming scheme itself (`api/names.py`,
`api/contracts.py`), judged by the strict emulator's own rules (`emulator_meta`, the Go validators' messages);
then one whole lifecycle with the longest legal names against the strict emulator, which refuses what a real API
server refuses.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from homelab_sim.emulator_core import KIND_CHECKS
from homelab_sim.emulator_meta import dns1123_subdomain, job_name, label_value, validate_object_meta

from activities.kube_activities import utc_now
from api import contracts as c
from api import names
from kube import views
from tests.lab import NS, Lab, homelab, open_lab
from watchers.main import Watchers
from watchers.signals import Signals
from workflows.group.workflow import GroupWorkflow

MIN = 60.0
ENTROPY = "0123456789abcdef0123456789abcdef"  # what workflow.uuid4().hex hands the derivations


def longest_name(stem: str, last: str = "z") -> str:
    """A 253-character DNS-1123 subdomain (three labels of 63, one of 61): the longest name a CRD accepts."""
    label = (stem * 63)[:62]
    name = ".".join([f"{label}1", f"{label}2", f"{label}3", f"{label[:60]}{last}"])
    assert len(name) == names.NAME_MAX and dns1123_subdomain(name) == []
    return name


# Two slots that differ only in their last character, in a Group whose name is as long.
SLOT_A = longest_name("rack-one-worker-", "a")
SLOT_B = longest_name("rack-one-worker-", "b")
GROUP = longest_name("homelab-group-")
SUBDOMAINS = [SLOT_A[:n].rstrip(".-") or "a" for n in range(1, names.NAME_MAX + 1)]


# --- the naming scheme ---------------------------------------------------------------------------------------
def test_short_names_are_what_they_always_were() -> None:
    """A 10-character slot keeps exactly its earlier names: nothing recorded or running changes."""
    slot = "worker-001"
    claim = c.claim_name(slot, ENTROPY)
    assert claim == "worker-001-012345"
    assert c.job_name(claim, "startup", 1) == "worker-001-012345-startup"
    assert c.job_name(claim, "shutdown", 1) == "worker-001-012345-shutdown"
    assert c.job_name(claim, "shutdown", 3) == "worker-001-012345-shutdown-3"
    episode = c.release_episode(slot, ENTROPY)
    assert episode == "worker-001-release-01234"
    assert c.job_name(episode, "shutdown", 2) == "worker-001-release-01234-shutdown-2"
    assert names.label_value(slot) == slot and names.label_value(claim) == claim


@pytest.mark.parametrize("slot", SUBDOMAINS, ids=[str(len(s)) for s in SUBDOMAINS])
def test_every_derived_name_fits_for_every_slot_name(slot: str) -> None:
    """Claim names are label values (IsValidLabelValue, ≤ 63) and DNS subdomains; Job names pass ValidateJob's
    63-character rule; a release episode keeps its mark. Each is deterministic.
    """
    claim = c.claim_name(slot, ENTROPY)
    assert len(claim) <= c.OWNER_NAME_MAX
    assert dns1123_subdomain(claim) == [] and label_value(claim) == []
    assert names.label_value(claim) == claim, "a claim's own name is its label value"
    assert label_value(names.label_value(slot)) == []
    episode = c.release_episode(slot, ENTROPY)
    assert c.RELEASE_MARK in episode and len(episode) <= c.OWNER_NAME_MAX
    for owner in (claim, episode):
        for job_type, sequence in (("startup", 1), ("shutdown", 1), ("shutdown", 999), ("shutdown", 12345)):
            job = c.job_name(owner, job_type, sequence)
            assert job_name(job) == [], job
            assert job.endswith(f"-{job_type}" if sequence == 1 else f"-{job_type}-{sequence}")
            if sequence < 1000:
                assert job.startswith(owner), "an owner of 50 keeps its Jobs' names whole"
    assert c.claim_name(slot, ENTROPY) == claim and c.release_episode(slot, ENTROPY) == episode


def test_long_names_keep_a_readable_prefix_and_stay_distinct() -> None:
    """Names that differ only past the truncation point get different hashes, so no two objects collide."""
    a, b = c.claim_name(SLOT_A, ENTROPY), c.claim_name(SLOT_B, ENTROPY)
    assert a != b and a.startswith("rack-one-worker-rack-one") and a.endswith("-012345")
    assert names.label_value(SLOT_A) != names.label_value(SLOT_B)
    assert c.release_episode(SLOT_A, ENTROPY) != c.release_episode(SLOT_B, ENTROPY)
    assert c.job_name(SLOT_A, "shutdown", 1) != c.job_name(SLOT_B, "shutdown", 1)
    assert c.claim_name(SLOT_A, "f" * 32) != a, "the entropy still tells two claims of one slot apart"
    hand_applied = SLOT_A  # a claim applied by hand may have any name the CRD accepts
    assert job_name(c.job_name(hand_applied, "startup", 1)) == []
    event = names.bounded(SLOT_A, names.NAME_MAX - len(".0123456789abcdef.abcdef")) + ".0123456789abcdef.abcdef"
    assert len(event) == names.NAME_MAX and dns1123_subdomain(event) == []


def test_bounded_refuses_a_limit_with_no_room_for_its_hash() -> None:
    with pytest.raises(ValueError, match="room for its hash"):
        names.bounded("x" * 40, names.NAME_HASH_LENGTH + 1)


def test_a_job_is_traced_to_its_slot_and_claim_by_owner_not_by_bounded_label() -> None:
    """The watchers read full names from a Job's owner references; its labels only hold the bounded forms."""
    claim = c.claim_name(SLOT_A, ENTROPY)
    job = {
        "metadata": {
            "labels": {names.LABEL_NODE: names.label_value(SLOT_A), names.LABEL_NODECLAIM: claim},
            "ownerReferences": [
                {"apiVersion": names.API_VERSION, "kind": names.KIND_NODECLAIM, "name": claim, "uid": "1"},
                {"apiVersion": names.API_VERSION, "kind": names.KIND_NODE, "name": SLOT_A, "uid": "2"},
            ],
        }
    }
    assert views.job_owners(job) == (SLOT_A, claim)
    by_hand = {"metadata": {"labels": {names.LABEL_NODE: "s1", names.LABEL_NODECLAIM: "c1"}}}
    assert views.job_owners(by_hand) == ("s1", "c1")


# --- a typo the API server pruned ----------------------------------------------------------------------------
def slot_with(spec: dict[str, Any], applied_spec: dict[str, Any] | None) -> dict[str, Any]:
    """A slot as stored after a `kubectl apply` of `applied_spec` (None: no kubectl; the API server kept `spec`)."""
    meta: dict[str, Any] = {"name": "s1", "namespace": NS}
    if applied_spec is not None:
        applied = {"apiVersion": names.API_VERSION, "kind": names.KIND_NODE, "metadata": meta, "spec": applied_spec}
        meta = {**meta, "annotations": {views.LAST_APPLIED: json.dumps(applied)}}
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_NODE, "metadata": meta, "spec": spec}


POD = {"image": "ipmitool"}
SPEC = {"group": "g", "kubernetesNodeName": "s1", "startupPodSpec": POD, "shutdownPodSpec": POD}


def test_a_typo_pruned_by_the_api_server_is_found_in_what_kubectl_applied() -> None:
    """The server dropped `comand` before anyone could read it (fieldValidation Ignore/Warn); kubectl's
    last-applied annotation still has it, so the slot is reported by field, never by the typo's value.
    """
    applied = {**SPEC, "startupPodSpec": {**POD, "comand": ["ipmitool", "-P", "hunter2"]}}
    problem = views.slot_problem(slot_with(SPEC, applied))
    assert problem.startswith("spec.startupPodSpec.comand: unknown field")
    assert "hunter2" not in problem and "ipmitool" not in problem


@pytest.mark.parametrize(
    "applied",
    [
        None,  # no kubectl (server-side apply, a controller, a client that sent fieldValidation=Strict)
        {**SPEC, "startupPodSpec": {**POD, "command": ["wake"]}},  # a known field removed since by a patch
        {**SPEC, "pricing": {"hourlyRate": 0.1}},  # a known field
    ],
)
def test_only_fields_the_schema_does_not_know_are_typos(applied: dict[str, Any] | None) -> None:
    assert views.slot_problem(slot_with(SPEC, applied)) == ""


def test_an_unreadable_annotation_is_no_problem() -> None:
    slot = slot_with(SPEC, None)
    slot["metadata"]["annotations"] = {views.LAST_APPLIED: "{not json"}
    assert views.slot_problem(slot) == ""
    slot["metadata"]["annotations"] = {views.LAST_APPLIED: json.dumps({"spec": "nope"})}
    assert views.slot_problem(slot) == ""


def test_a_pruned_typo_in_a_group_makes_it_unusable_with_the_field_named() -> None:
    """`minsize: 2` is dropped by the server and the Group would run with minSize 0: it says so instead."""
    applied = {"apiVersion": names.API_VERSION, "kind": names.KIND_GROUP, "spec": {"maxSize": 3, "minsize": 2}}
    group = {"metadata": {"annotations": {views.LAST_APPLIED: json.dumps(applied)}}, "spec": {"maxSize": 3}}
    assert views.group_spec(group) == "spec.minsize: unknown field, dropped by the API server from what kubectl applied"


# --- a whole lifecycle with the longest names ----------------------------------------------------------------
def long_slot(name: str, node_name: str) -> dict[str, Any]:
    """A slot with a 253-character name; its kubelet's Node keeps a hostname-sized name, as real ones have."""
    return {"name": name, "group": GROUP, "kubernetesNodeName": node_name}


def illegal(lab: Lab) -> list[str]:
    """Every stored object whose metadata the API server would refuse (name rule of its kind, labels)."""
    found: list[str] = []
    emulator = lab.lab.emulator
    for key, spec in emulator.specs.items():
        rule = KIND_CHECKS.get((spec.group, spec.kind), (dns1123_subdomain, ()))[0]
        for obj in emulator.store[key].values():
            errors = validate_object_meta(obj["metadata"], rule, namespaced=spec.namespaced)
            found += [f"{spec.kind} {obj['metadata']['name']}: {e.field}: {e.detail}" for e in errors]
    return found


async def test_a_whole_lifecycle_with_the_longest_names_the_crds_accept() -> None:
    """Boot, ready, scale-down and a law-3 release of slots and a Group named with 253 characters, against the
    strict emulator: kube-apiserver's ObjectMeta rules (names, label values ≤ 63, Job names ≤ 63) would refuse
    any derived name that does not fit, and the watchers still find every object by its full name.
    """
    doc = homelab([long_slot(SLOT_A, "kubelet-a"), long_slot(SLOT_B, "kubelet-b")], name=GROUP)
    async with open_lab(doc) as lab:
        assert lab.lab.emulator.strict
        signals = Signals(lab.client)
        watchers = Watchers(lab.kube, signals, namespaces=[NS])
        try:
            await lab.start_group(GROUP)
            await watchers.pump()
            assert await lab.increase(2, GROUP) == 2
            claims = await lab.claim_names(GROUP)
            for claim in claims:
                await lab.wait_phase(claim, "ready", within=3 * MIN)
            await watchers.pump()
            by_slot = {(await lab.status(claim))["slot"]: claim for claim in claims}
            assert sorted(by_slot) == sorted([SLOT_A, SLOT_B])
            for slot, claim in by_slot.items():
                assert claim == c.claim_name(slot, claim[-6:]) and len(claim) <= c.OWNER_NAME_MAX
                (startup,) = lab.jobs(slot)
                assert startup["metadata"]["name"] == f"{claim}-startup"
                assert startup["metadata"]["labels"][names.LABEL_NODECLAIM] == claim
                assert signals.count(c.ClaimSignal.JOB_FINISHED, c.claim_workflow_id(NS, claim)) == 1, (
                    "traced by its owner"
                )
                resource = lab.claim_resource(claim)
                assert resource is not None and resource["metadata"]["labels"] == {
                    names.LABEL_NODE: names.label_value(slot),
                    names.LABEL_GROUP: names.label_value(GROUP),
                }
                assert len(lab.events(claim)) >= 3, "ClaimCreated, ClaimBooting, ClaimReady"
            node = lab.node("kubelet-a")
            assert node is not None and node["metadata"]["labels"][names.LABEL_NODE] == names.label_value(SLOT_A)
            assert node["metadata"]["labels"][names.LABEL_GROUP] == names.label_value(GROUP)
            assert node["spec"]["providerID"] == names.provider_id(NS, SLOT_A)
            report = lab.lab.call(lambda h: h.emulator.get_object(names.API_VERSION, "nodes", NS, SLOT_A))
            assert report is not None and report["status"]["phase"] == "ready"

            # Scale-down of one machine: cordon, a shutdown Job of its claim, verified off.
            assert await lab.group(GROUP).execute_update(GroupWorkflow.delete_nodes, [SLOT_A]) == 1
            st = await lab.wait_phase(by_slot[SLOT_A], "completed", within=5 * MIN, step=10)
            assert st["reason"] == "NodeDeleted"
            assert lab.lab.power(SLOT_A) == "off"
            shutdown = [j for j in lab.jobs(SLOT_A) if j["metadata"]["labels"]["type"] == "shutdown"]
            assert [j["metadata"]["name"] for j in shutdown] == [f"{by_slot[SLOT_A]}-shutdown"]

            # Law 3: the machine comes on with no claim; the group releases it with a Job of its own episode. The
            # observation is sent once, here, so it waits until the group has heard the claim end (else it goes
            # to the ending claim; the watchers would send it again to the group once the claim is terminal).
            await watchers.pump()

            async def slot_free() -> bool:
                slot_book = (await lab.snapshot(GROUP))["slots"][SLOT_A]
                return not slot_book["liveClaim"]

            await lab.until(slot_free, within=MIN, what="the group to hear the claim end")
            lab.lab.power_on_by_hand(SLOT_A)
            on = c.Observation(power="on", usable=True, exists=True, gate_open=True, observed_at=utc_now())
            await lab.group(GROUP).signal(GroupWorkflow.observe_slot, c.SlotObservation(SLOT_A, on))

            def release_jobs() -> list[dict[str, Any]]:
                return [j for j in lab.jobs(SLOT_A) if c.RELEASE_MARK in j["metadata"]["name"]]

            (release_job,) = await lab.until(release_jobs, within=5 * MIN, what="a release Job")
            await watchers.pump()  # the Job has ended: its job_finished goes to the release of the full slot name
            assert signals.count(c.ReleaseSignal.JOB_FINISHED, c.release_workflow_id(NS, SLOT_A)) == 1
            await lab.until(lambda: lab.lab.power(SLOT_A) == "off", within=5 * MIN, what="released by law 3")
            assert job_name(release_job["metadata"]["name"]) == []
            assert [o["name"] for o in release_job["metadata"]["ownerReferences"]] == [SLOT_A]
            assert names.LABEL_NODECLAIM not in release_job["metadata"]["labels"]
            assert lab.lab.power(SLOT_B) == "on", "the other slot, a hash apart, is untouched"
        finally:
            watchers.close()
        assert [r for r in lab.lab.emulator.strict_log if r.status != 200 or r.warnings] == []
        assert illegal(lab) == []
        event_names = [e["metadata"]["name"] for e in lab.events()]
        assert any(len(name) == names.NAME_MAX for name in event_names), "Events of the slots, bounded to 253"
