"""The claim side of the power examples (issue 31): each example's slot, through the product, on the real node.

The product as `make e2e-pods` installs it (tests/realcluster/podstack.py and test_pods.py's install steps: the
control plane, a real kubelet with containerd and runc, the operator and Temporal as Pods from deploy/overlays/homelab)
and the machine room of tests/machineroom (ipmi_sim, sushy-tools' Redfish, the Shelly Gen2 stand-in, sshd, a
wake-on-LAN NIC). The real node joins the room's LAN (`PodStack.join_lan`: hostNetwork Pods broadcast there, the pod
network is masqueraded onto it) and is labelled `homelab.dev/lan=main` as the examples' nodeSelector asks; its
control-plane taint is taken off, as a user's node on the LAN has none (the examples' Jobs tolerate nothing).

Each example's slot is applied as test_power.py localizes it (host names, addresses, MACs, Secret values, and the
image names: a registry is a host a user replaces), its Secrets and ConfigMaps created as its comments say. A claim
is applied by hand (`kubectl apply`, as docs/install.md shows a person doing); the operator's startup Job's Pod runs
on the real kubelet in the built image and speaks to the BMC; the BMC's power hook starts the machine's KWOK kubelet
and the claim goes ready. Deleting the claim is the shutdown: the shutdown Job's Pod runs, the BMC says off, and the
slot's `status.lastClaim` records the claim completed. The failure rows check the claim's phase and reason and the
exit code and last words in `kubectl describe nodeclaim`; no secret is in an Event or a claim.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

import tests.realcluster.test_pods as pods_tier
from api.names import ANNOTATION_RESET_ATTEMPTS, ClaimReason, JobType
from tests.machineroom import podrun
from tests.machineroom.room import Credentials, MachineRoom, peers_python
from tests.machineroom.test_power import (
    BMC_SPECIFIC,
    MACHINES,
    NO_ANSWER,
    _images,
    _print_table,
    cluster_objects,
    expect,
    other_credentials,
    replacements,
    run_example,
)
from tests.realcluster.cluster import wait_until
from tests.realcluster.executor import Executor
from tests.realcluster.node import CONTROL_PLANE_LABEL, NODE_NAME
from tests.realcluster.podstack import PodStack
from tests.realcluster.stack import NS, GroupSpec, Homelab, SlotSpec, hand_claim, homelab_objects, phase

pytestmark = [pytest.mark.machineroom, pytest.mark.timeout(3600)]

GROUP = "workers"
EXAMPLES = {"wol-example": "wake-on-lan.yaml", "ssh-example": "ssh-shutdown.yaml", "ipmi-example": "ipmi.yaml",
            "redfish-example": "redfish.yaml", "plug-example": "smart-plug.yaml"}  # fmt: skip
# method -> case -> what the claim showed (printed as issue 31's table at the end)
TABLE: dict[str, dict[str, str]] = defaultdict(dict)
API = ("infra.homecluster.dev", "v2alpha1")


@dataclass
class Tier:
    stack: PodStack
    room: MachineRoom
    images: dict[str, str]  # the examples' image names -> the run's references
    executor: Executor
    image_root: Path  # the power images' root filesystems (tests/machineroom/images.sh), for a Job run by runc
    lan_address: str = ""
    seq: dict[str, int] = field(default_factory=dict)

    @property
    def kubectl(self) -> Callable[..., Any]:
        return self.stack.cluster.kubectl

    def custom(self) -> Any:
        return k8s.CustomObjectsApi(self.stack.cluster.admin)


def _load_images(stack: PodStack, root: Path) -> dict[str, str]:
    """Each power image's archive (tests/machineroom/images.sh) pushed where the node pulls, by the examples' name."""
    refs = {}
    for image in ("power-ipmitool", "power-redfish", "power-ssh", "power-wake-on-lan"):
        tag = (root / image / "tag").read_text().strip().rsplit(":", 1)[1]
        refs[f"registry.lan/homelab/{image}:bookworm"] = stack.load_image(root / image / "image.oci.tar",
                                                                          f"hlmr/{image}:{tag}")  # fmt: skip
    return refs


def slot_doc(t: Tier, slot: str) -> dict[str, Any]:
    """The example's slot as a user localizes it: the room's hosts, addresses and MACs, the run's images."""
    example = EXAMPLES[slot]
    text = (podrun.POWER_EXAMPLES / example).read_text()
    repl = {**replacements(t.room, example), **BMC_SPECIFIC.get(example, {}),
            **{old: new for old, new in t.images.items() if old in text}}  # fmt: skip
    (doc,) = [d for d in yaml.safe_load_all(podrun.localize(text, repl)) if d and d.get("kind") == "Node"]
    return dict(doc)


def secret_objects(t: Tier, credentials: Credentials) -> list[dict[str, Any]]:
    secrets, config_maps = cluster_objects(credentials, t.room)
    meta = {"namespace": NS}
    return [{"apiVersion": "v1", "kind": "Secret", "metadata": {**meta, "name": name}, "stringData": dict(data)}
            for name, data in secrets.items()] + \
           [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {**meta, "name": name}, "data": dict(data)}
            for name, data in config_maps.items()]  # fmt: skip


@pytest.fixture(scope="module")
def tier() -> Iterator[Tier]:
    began = time.monotonic()
    root = _images()
    directory = Path(tempfile.mkdtemp(prefix="hlas-claims-"))
    stack = PodStack(directory)
    room: MachineRoom | None = None
    try:
        stack.start()
        pods_tier.test_a_default_storage_class_as_the_guide_says(stack)
        # This release's install: the story's previous-release start (test_pods.py) is that tier's upgrade, not this
        # tier's question (the power examples through this release's operator).
        pods_tier.install_this_release(stack, "install (apply, rollout status)")
        with stack.phase("power images pushed"):
            images = _load_images(stack, root)
        machines = {spec.name: SlotSpec(spec.name, GROUP).machine() for spec in MACHINES}
        executor = Executor(stack.cluster, NS, machines)  # its power_on/off only: the BMCs' hooks call them

        def on_power(name: str, on: bool) -> None:
            (executor.power_on if on else executor.power_off)(name)

        room = MachineRoom(directory / "room", MACHINES, peers_python=peers_python(),
                           machine_os=root / "machine-os" / "rootfs", on_power=on_power).start()  # fmt: skip
        host = stack.join_lan(room.lan)
        # The node a user puts on the machines' LAN: labelled as the examples' nodeSelector asks, no taint.
        stack.cluster.kubectl("label", "node", NODE_NAME, "homelab.dev/lan=main", "--overwrite")
        stack.cluster.kubectl("taint", "node", NODE_NAME, f"{CONTROL_PLANE_LABEL}:NoSchedule-")
        t = Tier(stack, room, images, executor, root, host.address)
        group = homelab_objects(Homelab(groups=(GroupSpec(GROUP, len(MACHINES)),), slots=()))
        stack.apply(secret_objects(t, room.credentials))
        stack.cluster.kubectl("apply", "--validate=strict", "-f", "-",
                              input=yaml.safe_dump_all(group + [slot_doc(t, s) for s in EXAMPLES]))  # fmt: skip
        print(f"\nclaims tier up in {time.monotonic() - began:.0f} s; the node is {host.address} on the room's LAN")
        yield t
    except BaseException:
        stack.dump(80)
        raise
    finally:
        if room is not None:
            room.stop()
        stack.stop()
        _print_table(root, TABLE, "the claim side (real node, operator Pods)")
        if room is not None:
            assert not room.leftovers(), room.leftovers()
        shutil.rmtree(directory, ignore_errors=True)


# --- reading and making claims ------------------------------------------------------------------------------------
def claim_of(t: Tier, name: str) -> dict[str, Any]:
    try:
        return dict(t.custom().get_namespaced_custom_object(*API, NS, "nodeclaims", name))
    except k8s.exceptions.ApiException as exc:
        if exc.status == 404:
            return {}
        raise


def claim_events(t: Tier, name: str) -> list[tuple[str, str]]:
    """The claim's Events, oldest first: (reason, message)."""
    core: Any = k8s.CoreV1Api(t.stack.cluster.admin)
    events = core.list_namespaced_event(NS, field_selector=f"involvedObject.kind=NodeClaim,involvedObject.name={name}")
    return [
        (e.reason, e.message)
        for e in sorted(events.items, key=lambda e: e.last_timestamp or e.event_time or e.metadata.creation_timestamp)
    ]


def apply_claim(t: Tier, slot: str) -> str:
    t.seq[slot] = t.seq.get(slot, 0) + 1
    name = f"{slot}-{t.seq[slot]}"
    t.kubectl("apply", "-f", "-", input=hand_claim(name, slot))
    return name


def wait_phase(t: Tier, name: str, want: str, within: float) -> dict[str, Any]:
    def reached() -> dict[str, Any]:
        c = claim_of(t, name)
        if phase(c) in ("failed", "completed") and phase(c) != want:
            raise AssertionError(f"{name} ended {phase(c)}/{(c.get('status') or {}).get('reason')}, not {want}:\n"
                                 f"{describe(t, name)}")  # fmt: skip
        return c if phase(c) == want else {}

    return dict(wait_until(f"claim {name} {want}", reached, within=within))


def describe(t: Tier, name: str) -> str:
    return str(t.kubectl("-n", NS, "describe", "nodeclaim", name, check=False).stdout)


def hook_since(t: Tier, slot: str, on: bool, since: float) -> float | None:
    times = [at for at, n, o in t.room.hooks if n == slot and o is on and at >= since]
    return times[0] - since if times else None


def job_pod_nodes(t: Tier, claim: str) -> set[str]:
    core: Any = k8s.CoreV1Api(t.stack.cluster.admin)
    pods = core.list_namespaced_pod(NS, label_selector=f"infra.homecluster.dev/nodeclaim={claim}").items
    return {p.spec.node_name for p in pods}


# --- the rows -----------------------------------------------------------------------------------------------------
METHODS = [("wol-example", "wake-on-LAN", "systemctl poweroff"), ("ssh-example", "SSH", "systemctl poweroff"),
           ("ipmi-example", "IPMI", "ACPI"), ("redfish-example", "Redfish", ""),
           ("plug-example", "smart plug", "")]  # fmt: skip


def test_the_node_reaches_the_machine_room(tier: Tier) -> None:
    """A Pod in the pod network reaches a BMC on the LAN (masqueraded by the node) and nothing else is routed."""
    bmc = tier.room.machine("plug-example").bmc
    assert bmc is not None
    out = tier.stack.run_pod("reach-the-bmc", f"wget -q -O - http://{bmc.address}/shelly || true; echo done")
    assert out.startswith("Succeeded"), out


@pytest.mark.parametrize(("slot", "method", "off_evidence"), METHODS, ids=[m[1] for m in METHODS])
def test_a_claim_boots_and_shuts_down_through_the_bmc(tier: Tier, slot: str, method: str, off_evidence: str) -> None:
    t = tier
    m = t.room.machine(slot)
    assert m.power == "off", f"{slot} is {m.power} before its claim"
    t0 = time.monotonic()
    name = apply_claim(t, slot)
    wait_phase(t, name, "ready", within=300)
    ready_s = time.monotonic() - t0
    assert m.power == "on", m.events()[-5:]
    booted = hook_since(t, slot, True, t0)
    assert booted is not None, f"{slot}'s kubelet hook never fired: {m.events()[-5:]}"
    assert job_pod_nodes(t, name) == {NODE_NAME}, "the startup Job's Pod ran on the real node"
    TABLE[method]["on"] = f"ready; the BMC says on, kubelet {booted:.0f} s after the claim ({ready_s:.0f} s)"
    t1 = time.monotonic()
    t.kubectl("-n", NS, "delete", "nodeclaim", name, "--wait=false")

    # A claim deleted by hand is gone once its machine is verified off: its end is its last Event (the slot's
    # status.lastClaim keeps the claim's last record it read, `ready`: docs/decisions.md, issue 31's claim side).
    ended = wait_until(f"{name}'s ClaimCompleted or ClaimFailed Event",
                       lambda: [e for e in claim_events(t, name) if e[0] in ("ClaimCompleted", "ClaimFailed")],
                       within=300)  # fmt: skip
    assert ended[0][0] == "ClaimCompleted", claim_events(t, name)
    assert "machine observed off" in ended[0][1], ended
    assert claim_of(t, name) == {}, "the deleted claim is gone once it completed"
    assert m.power == "off", m.events()[-5:]
    if off_evidence:
        assert any(off_evidence in e for e in m.events()), m.events()
    TABLE[method]["off"] = f"completed: {ended[0][1]}; the BMC says off ({time.monotonic() - t1:.0f} s)"


@dataclass(frozen=True)
class Failure:
    slot: str
    method: str
    case: str
    arrange: Callable[[Tier], Callable[[], None]]  # makes the fault, returns its undoing
    reason: str
    says: tuple[str, ...]  # every one in `kubectl describe nodeclaim`
    power: str = "off"  # what the BMC says once the claim failed
    says_one_of: tuple[tuple[str, ...], ...] = ()  # and all the words of one of these (where the LAN decides which)


# curl's exit code and words for a BMC that does not answer: one of test_power.NO_ANSWER's, whichever the LAN gave.
NO_ANSWER_SAYS = tuple((f"exit code {code}", words) for code, words in NO_ANSWER.items())


def wrong_secret(slot: str) -> Callable[[Tier], Callable[[], None]]:
    """The slot's Secret holds another password (as a user who mistyped it)."""

    def arrange(t: Tier) -> Callable[[], None]:
        wrong = [o for o in secret_objects(t, other_credentials(t.room)) if o["metadata"]["name"] == slot]
        t.stack.apply(wrong)
        return lambda: t.stack.apply([o for o in secret_objects(t, t.room.credentials)
                                      if o["metadata"]["name"] == slot])  # fmt: skip

    return arrange


def bmc_fault(status: int, message: str) -> Callable[[Tier], Callable[[], None]]:
    def arrange(t: Tier) -> Callable[[], None]:
        t.room.fault("redfish-example", status, message, times=10)
        return lambda: (t.room.machine("redfish-example").state / "fault.json").unlink(missing_ok=True)

    return arrange


def configured(slot: str, **firmware: bool) -> Callable[[Tier], Callable[[], None]]:
    """The machine's firmware set so that it never comes up (the BMC or the NIC did their part): an OS that never
    boots, wake-on-LAN off, staying off when AC returns. Undone, the machine is switched off the way its method
    allows: by hand at the machine, or for Redfish (whose power is the BMC's) by the example's shutdown run by runc."""

    def arrange(t: Tier) -> Callable[[], None]:
        t.room.configure(slot, **firmware)

        def undo() -> None:
            t.room.configure(slot, **{setting: True for setting in firmware})
            if t.room.machine(slot).spec.bmc == "redfish":
                expect(run_example(t.room, t.image_root, EXAMPLES[slot], JobType.SHUTDOWN), 0)
                t.room.wait_power(slot, "off", 30)
            else:
                t.room.power(slot, "off", "the test switches the machine that never came up off")

        return undo

    return arrange


def cable(slot: str) -> Callable[[Tier], Callable[[], None]]:
    def arrange(t: Tier) -> Callable[[], None]:
        t.room.bmc_cable(slot, False)
        return lambda: t.room.bmc_cable(slot, True)

    return arrange


FAILURES = [
    Failure("ipmi-example", "IPMI", "wrong password", wrong_secret("ipmi-example"), ClaimReason.STARTUP_JOB_FAILED,
            ("exit code 1", "Unable to establish IPMI v2 / RMCP+ session")),
    Failure("redfish-example", "Redfish", "wrong password", wrong_secret("redfish-example"),
            ClaimReason.STARTUP_JOB_FAILED, ("exit code 22", "401")),
    Failure("redfish-example", "Redfish", "5xx", bmc_fault(503, "the BMC is updating its firmware"),
            ClaimReason.STARTUP_JOB_FAILED, ("exit code 22", "503", "the BMC is updating its firmware")),
    Failure("redfish-example", "Redfish", "4xx", bmc_fault(400, "ResetType is not acceptable"),
            ClaimReason.STARTUP_JOB_FAILED, ("exit code 22", "400", "ResetType is not acceptable")),
    Failure("plug-example", "smart plug", "wrong password", wrong_secret("plug-example"),
            ClaimReason.STARTUP_JOB_FAILED, ("exit code 22", "401")),
    Failure("ipmi-example", "IPMI", "BMC does not answer", cable("ipmi-example"), ClaimReason.STARTUP_JOB_FAILED,
            ("exit code 1", "Unable to establish IPMI v2 / RMCP+ session")),
    Failure("redfish-example", "Redfish", "BMC does not answer", cable("redfish-example"),
            ClaimReason.STARTUP_JOB_FAILED, (), says_one_of=NO_ANSWER_SAYS),
    Failure("plug-example", "smart plug", "BMC does not answer", cable("plug-example"),
            ClaimReason.STARTUP_JOB_FAILED, (), says_one_of=NO_ANSWER_SAYS),
]  # fmt: skip


# The machine that gets the power and never comes up: the BMC or the NIC did their part, so each startup Job
# succeeds and the claim fails at the readiness gate (4 minutes), one slot each, so the four wait it out together.
NEVER_WAKES = [
    Failure("ipmi-example", "IPMI", "never wakes", configured("ipmi-example", boots=False),
            ClaimReason.READINESS_GATE_TIMEOUT, ("ReadinessGateTimeout",), power="on"),
    Failure("redfish-example", "Redfish", "never wakes", configured("redfish-example", boots=False),
            ClaimReason.READINESS_GATE_TIMEOUT, ("ReadinessGateTimeout",), power="on"),
    Failure("plug-example", "smart plug", "never wakes", configured("plug-example", ac_power_on=False),
            ClaimReason.READINESS_GATE_TIMEOUT, ("ReadinessGateTimeout",)),
    Failure("wol-example", "wake-on-LAN", "never wakes", configured("wol-example", wakes_on_lan=False),
            ClaimReason.READINESS_GATE_TIMEOUT, ("ReadinessGateTimeout",)),
]  # fmt: skip


@pytest.mark.parametrize("f", FAILURES, ids=[f"{f.method}-{f.case}" for f in FAILURES])
def test_a_failed_boot_shows_its_cause_on_the_claim(tier: Tier, f: Failure) -> None:
    t = tier
    reset_streak(t, f.slot)
    undo = f.arrange(t)
    t0 = time.monotonic()
    try:
        name = apply_claim(t, f.slot)
        claim = wait_phase(t, name, "failed", within=420)
        power = t.room.machine(f.slot).power
    finally:
        undo()
    shows_its_cause(t, f, name, claim, power, time.monotonic() - t0)


def test_machines_that_never_wake_fail_at_the_readiness_gate(tier: Tier) -> None:
    t = tier
    undo: list[Callable[[], None]] = []
    ended: dict[str, tuple[str, dict[str, Any], str, float]] = {}
    t0 = time.monotonic()
    try:
        for f in NEVER_WAKES:
            reset_streak(t, f.slot)
            undo.append(f.arrange(t))
        names = {f.slot: apply_claim(t, f.slot) for f in NEVER_WAKES}
        for f in NEVER_WAKES:
            claim = wait_phase(t, names[f.slot], "failed", within=420)
            ended[f.slot] = (names[f.slot], claim, t.room.machine(f.slot).power, time.monotonic() - t0)
    finally:
        for step in undo:
            step()
    for f in NEVER_WAKES:
        shows_its_cause(t, f, *ended[f.slot])


def shows_its_cause(t: Tier, f: Failure, name: str, claim: dict[str, Any], power: str, seconds: float) -> None:
    """The claim's reason, and the exit code and last words where the user looks; the BMC's power after it."""
    status = claim.get("status") or {}
    assert status.get("reason") == f.reason, status
    text = describe(t, name)
    for s in f.says:
        assert s in text, f"{s!r} not in `kubectl describe nodeclaim {name}`:\n{text}"
    if f.says_one_of:
        assert any(all(w in text for w in words) for words in f.says_one_of), (
            f"none of {f.says_one_of} in `kubectl describe nodeclaim {name}`:\n{text}"
        )
    assert power == f.power, f"the BMC says {power}"
    TABLE[f.method][f.case] = f"failed {f.reason}: {cause(str(status.get('message') or ''))} ({seconds:.0f} s)"


def reset_streak(t: Tier, slot: str) -> None:
    """Each row is one fault on a mended machine: the streak of failed boots restarts as a user restarts it
    (docs/operations.md, AttemptLimitExceeded), so a slot's rows are not cut short by the three-in-a-row limit."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t.kubectl("-n", NS, "annotate", "nodes.infra.homecluster.dev", slot, f"{ANNOTATION_RESET_ATTEMPTS}={now}",
              "--overwrite")  # fmt: skip

    def first_attempt() -> bool:
        slot_obj = t.custom().get_namespaced_custom_object(*API, NS, "nodes", slot)
        claimable = [c for c in (slot_obj.get("status") or {}).get("conditions") or [] if c["type"] == "Claimable"]
        return bool(claimable) and claimable[0]["status"] == "True" and "attempt 1" in claimable[0]["message"]

    wait_until(f"slot {slot}'s Claimable condition to say the next claim is attempt 1", first_attempt, within=60)


def cause(message: str) -> str:
    """A failed claim's message for the table: the exit code and the end of the Pod's last words."""
    text = " ".join(message.split()).replace("|", "\\|")
    code = re.search(r"exit code \d+", text)
    words = text.split("its Pod said: ", 1)[1] if "its Pod said: " in text else text
    return f"{code.group(0) + ', ' if code else ''}{'…' if len(words) > 120 else ''}{words[-120:]}"


def test_no_secret_in_events_or_claims(tier: Tier) -> None:
    t = tier
    seen = t.kubectl("get", "events,nodeclaims,nodes.infra.homecluster.dev", "-A", "-o", "json").stdout
    leaked = [v for v in t.room.credentials.values if v in seen]
    assert not leaked, "a secret is in an Event or a claim"
