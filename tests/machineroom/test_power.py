"""Every example in deploy/examples/power against a real implementation of its protocol (`make e2e-power`).

The machine room (tests/machineroom/room.py) gives each example's machine its BMC: ipmi_sim (OpenIPMI) for
ipmi.yaml, sushy-tools' Redfish emulator for redfish.yaml, the Shelly Gen2 RPC STAND-IN for smart-plug.yaml (no real
plug exists here), sshd for the SSH shutdowns, a wake-on-LAN NIC for wake-on-lan.yaml and ssh-shutdown.yaml. Each
example's Job (built by the operator's own builder from the example's slot, with only host names, addresses, MACs
and Secret values replaced) runs its container in the image built from deploy/examples/power/images, and each case
checks the exit code, the last words a claim would show, what the BMC says, that the machine's kubelet hook fired
(or not), and that no secret was on a command line, in the log or in the termination message.

This is the script side (every case, fast, each container's exit code and last words read directly);
tests/machineroom/test_claims_real.py is the claim side: the same slots through the product on issue 30's real node
(the claim's phase and reason, `kubectl describe nodeclaim`), for on, off and the failure rows.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.names import JobType
from kube.views import trimmed_message
from tests.machineroom import podrun
from tests.machineroom.room import (
    PLUG_USER,
    REDFISH_USER,
    Credentials,
    MachineRoom,
    MachineSpec,
    peers_python,
)
from tests.realcluster import pki

pytestmark = [pytest.mark.machineroom, pytest.mark.timeout(1200)]

HERE = Path(__file__).resolve().parent
MACHINES = [
    MachineSpec("wol-example", sshd=True, wol=True),
    MachineSpec("ssh-example", sshd=True, wol=True),
    MachineSpec("ipmi-example", bmc="ipmi"),
    MachineSpec("redfish-example", bmc="redfish"),
    MachineSpec("plug-example", bmc="plug", sshd=True),
]
# method -> case -> what happened (printed as the table of issue 31 at the end of the run)
TABLE: dict[str, dict[str, str]] = defaultdict(dict)
PEERS = {
    "wake-on-LAN": "AF_PACKET wake-on-LAN NIC (machine room); OpenSSH {ssh}",
    "SSH": "OpenSSH {ssh} (Debian)",
    "IPMI": "ipmi_sim (OpenIPMI {openipmi}); ipmitool {ipmitool}",
    "Redfish": "sushy-tools {sushy} (fake driver); curl {curl}",
    "smart plug": "Shelly Gen2 RPC STAND-IN (machine room); OpenSSH {ssh}",
}


SUSHY_VERSION = "import importlib.metadata as m; print(m.version('sushy-tools'))"


def _images() -> Path:
    out = subprocess.run([str(HERE / "images.sh")], capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, f"tests/machineroom/images.sh failed:\n{out.stderr[-3000:]}"
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def images() -> Path:
    began = time.monotonic()
    root = _images()
    print(f"\npower images ready in {time.monotonic() - began:.0f} s ({root})")
    return root


@pytest.fixture(scope="module")
def room(images: Path) -> Iterator[MachineRoom]:
    directory = Path(tempfile.mkdtemp(prefix="hlmr-room-"))
    began = time.monotonic()
    r = MachineRoom(directory, MACHINES, peers_python=peers_python(), machine_os=images / "machine-os" / "rootfs")
    r.start()
    print(f"machine room {r.run} up in {time.monotonic() - began:.1f} s: "
          + ", ".join(f"{m.name} {m.os.address}" + (f" (BMC {m.bmc.address})" if m.bmc else "")
                      for m in r.machines.values()))  # fmt: skip
    try:
        yield r
    finally:
        r.stop()
        left = r.leftovers()
        _print_table(images, TABLE, "the script side (runc in the machine room)")
        assert not left, f"the machine room left {left}"
        assert not r.errors, r.errors
        shutil.rmtree(directory, ignore_errors=True)


def _version(cmd: list[str]) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    text = (out.stdout + out.stderr).strip().splitlines()
    return text[0] if text else "?"


def _print_table(images: Path, table: dict[str, dict[str, str]], side: str) -> None:
    """Issue 31's table for one side: a row per method, its peer and version, a cell per case, the time."""

    def in_image(image: str, *cmd: str) -> str:
        rootfs = images / image / "rootfs"
        out = subprocess.run(["chroot", str(rootfs), *cmd], capture_output=True, text=True, timeout=30, check=False)
        lines = (out.stdout + out.stderr).strip().splitlines()
        return lines[0] if lines else "?"

    versions = {
        "ssh": in_image("machine-os", "dpkg-query", "-W", "-f=${Version}", "openssh-server"),
        "openipmi": _version(["dpkg-query", "-W", "-f=${Version}", "openipmi"]),
        "ipmitool": in_image("power-ipmitool", "dpkg-query", "-W", "-f=${Version}", "ipmitool"),
        "sushy": _version([str(peers_python()), "-c", SUSHY_VERSION]),
        "curl": in_image("power-redfish", "dpkg-query", "-W", "-f=${Version}", "curl"),
    }  # fmt: skip
    cases = ["on", "off", "wrong password", "BMC does not answer", "5xx", "4xx", "never wakes"]
    print(f"\n{side}:\n| method | peer and version | " + " | ".join(cases) + " | other | time |")
    print("|---|---|" + "---|" * (len(cases) + 2))
    for method, peer in PEERS.items():
        row = table.get(method, {})
        other = "; ".join(f"{k}: {v}" for k, v in row.items() if k not in cases and k != "time")
        total = sum(float(v.rsplit("(", 1)[1].rstrip(" s)")) for k, v in row.items() if "(" in v and v.endswith(" s)"))
        print(f"| {method} | {peer.format(**versions)} | " + " | ".join(row.get(c, "n/a") for c in cases)
              + f" | {other or '-'} | {total:.0f} s |")  # fmt: skip


# --- the examples, localized as a user would ---------------------------------------------------------------------
def replacements(room: MachineRoom, example: str) -> dict[str, str]:
    """Host names, addresses and MACs of an example, replaced by the machine room's."""
    m = {name: room.machine(name) for name in room.machines}

    def bmc(name: str) -> str:
        host = m[name].bmc
        assert host is not None
        return host.address

    def os(name: str) -> str:
        return m[name].os.address

    return {
        "ipmi.yaml": {"192.168.1.110": bmc("ipmi-example")},
        "redfish.yaml": {"bmc-redfish.lan": bmc("redfish-example")},
        "smart-plug.yaml": {"plug-example-plug.lan": bmc("plug-example"), "plug-example.lan": os("plug-example")},
        "ssh-shutdown.yaml": {"aa:bb:cc:dd:ee:10": m["ssh-example"].os.mac, "ssh-example.lan": os("ssh-example")},
        "wake-on-lan.yaml": {"aa:bb:cc:dd:ee:01": m["wol-example"].os.mac, "wol-example.lan": os("wol-example")},
    }[example]  # fmt: skip


# What the BMC of the machine room cannot do as the example says, replaced with the reason (none else is).
BMC_SPECIFIC = {
    # ipmi_sim (OpenIPMI 2.0.33) offers no SHA-256 cipher suite; test_ipmi_cipher_suite_17 runs the example as written.
    "ipmi.yaml": {'name: IPMI_CIPHER_SUITE\n        value: "17"': 'name: IPMI_CIPHER_SUITE\n        value: "3"'},
}


def cluster_objects(credentials: Credentials, room: MachineRoom) -> tuple[podrun.Secrets, podrun.Secrets]:
    """The Secrets and ConfigMaps the examples' comments tell a user to create, with the room's values."""
    assert room.ca is not None
    secrets = {
        "ipmi-example": {"password": credentials.ipmi_password},
        "redfish-example": {"curlrc": f'user = "{REDFISH_USER}:{credentials.redfish_password}"\n'},
        "plug-example": {"curlrc": f'user = "{PLUG_USER}:{credentials.plug_password}"\n'},
        "ssh-shutdown": {"id_ed25519": credentials.ssh_private_key},
    }
    config_maps = {
        "bmc-ca": {"ca.crt": room.ca.cert.read_text()},
        "ssh-known-hosts": {"known_hosts": room.known_hosts()},
    }
    return secrets, config_maps


def run_example(room: MachineRoom, images: Path, example: str, operation: JobType, *,
                credentials: Credentials | None = None, extra: dict[str, str] | None = None,
                config_maps: dict[str, dict[str, str]] | None = None) -> podrun.Outcome:  # fmt: skip
    """One run of an example's startup or shutdown container in the room; `credentials` other than the room's make a
    wrong password or key, `extra` replaces more of the example (said where used)."""
    repl = {**replacements(room, example), **BMC_SPECIFIC.get(example, {}), **(extra or {})}
    job = podrun.job_of(podrun.slot_of(podrun.POWER_EXAMPLES / example, repl), operation)
    secrets, cms = cluster_objects(credentials or room.credentials, room)
    image = job["spec"]["template"]["spec"]["containers"][0]["image"].rsplit("/", 1)[1].split(":")[0]
    resolved = podrun.resolve(job, secrets, {**cms, **(config_maps or {})})
    netns = room.node.netns_path if resolved.host_network else room.pod.netns_path
    workdir = room.dir / "pods" / f"{example.removesuffix('.yaml')}-{operation}-{time.monotonic_ns() % 10**9}"
    outcome = podrun.run(job, rootfs=images / image / "rootfs", workdir=workdir, netns=netns, secrets=secrets,
                         config_maps={**cms, **(config_maps or {})}, watch_for=room.credentials.values,
                         run_id=f"hlmr-{room.run}")  # fmt: skip
    assert not outcome.leaks, f"{example} {operation}: a secret leaked: {outcome.leaks}"
    return outcome


def record(method: str, case: str, outcome: podrun.Outcome, note: str = "") -> None:
    """The table's cell: the exit code and, for a failure, the last words as the claim would carry them (the
    operator's own trimming of a termination message, kube.views.trimmed_message)."""
    code = "deadline" if outcome.exit_code is None else f"exit {outcome.exit_code}"
    words = trimmed_message(outcome.message) if outcome.exit_code else ""
    cell = f"{code}{': ' + words if words else ''}{note} ({outcome.seconds:.1f} s)"
    TABLE[method][case] = cell.replace("|", "\\|")


def expect(outcome: podrun.Outcome, code: int, *says: str) -> None:
    assert outcome.exit_code == code, f"exit {outcome.exit_code}, expected {code}; log:\n{outcome.log}"
    for s in says:
        assert s in outcome.message or s in outcome.log, (
            f"{s!r} not in the last words {outcome.message!r}:\n{outcome.log}"
        )
    if code != 0:
        assert outcome.message.strip(), "a failed container leaves last words (FallbackToLogsOnError)"


# A BMC that does not answer, as curl reports it: no ARP answer on the LAN (the neighbour entry of the BMC gone or
# failed: "Failed to connect ... Couldn't connect to server" within seconds), or no answer to a SYN sent to a MAC
# still cached (it waits out --connect-timeout / --max-time). Which one is the neighbour cache's timing, on a real
# LAN as here.
NO_ANSWER = {7: "Couldn't connect to server", 28: "curl: (28)"}


def expect_no_answer(outcome: podrun.Outcome) -> None:
    assert outcome.exit_code in NO_ANSWER, f"exit {outcome.exit_code}, expected one of {sorted(NO_ANSWER)}"
    expect(outcome, outcome.exit_code, NO_ANSWER[outcome.exit_code])


def hook_fired(room: MachineRoom, name: str, on: bool, since: float) -> bool:
    return any(n == name and o is on and t >= since for t, n, o in room.hooks)


def other_credentials(room: MachineRoom) -> Credentials:
    """Every password and key wrong, as a user who mistyped them all."""
    fresh = Credentials.fresh()
    assert set(fresh.values).isdisjoint(room.credentials.values)
    return fresh


# --- wake-on-LAN and the SSH shutdown ----------------------------------------------------------------------------
@pytest.mark.parametrize(("example", "method", "machine"), [("wake-on-lan.yaml", "wake-on-LAN", "wol-example"),
                                                            ("ssh-shutdown.yaml", "SSH", "ssh-example")])  # fmt: skip
def test_wake_on_lan_then_ssh_poweroff(
    room: MachineRoom, images: Path, example: str, method: str, machine: str
) -> None:
    m = room.machine(machine)
    assert m.power == "off"
    t0 = time.monotonic()
    on = run_example(room, images, example, JobType.STARTUP)
    expect(on, 0)
    assert "magic packet" in on.log
    room.wait_power(machine, "on", 10)
    room._await(f"{machine}'s kubelet hook", lambda: hook_fired(room, machine, True, t0), 30)
    record(method, "on", on, f"; the NIC woke it, its kubelet started {_since(room, machine, True, t0)}")
    t1 = time.monotonic()
    off = run_example(room, images, example, JobType.SHUTDOWN)
    expect(off, 0)
    room.wait_power(machine, "off", 10)
    room._await(f"{machine}'s kubelet to stop", lambda: hook_fired(room, machine, False, t1), 10)
    assert any("systemctl poweroff" in e for e in m.events()), m.events()
    record(method, "off", off, "; systemctl poweroff over SSH, the machine is off")


@pytest.mark.parametrize(("example", "method", "machine"), [("wake-on-lan.yaml", "wake-on-LAN", "wol-example"),
                                                            ("ssh-shutdown.yaml", "SSH", "ssh-example")])  # fmt: skip
def test_ssh_shutdown_with_a_wrong_key_fails_and_leaves_the_machine_on(room: MachineRoom, images: Path, example: str,
                                                                        method: str, machine: str) -> None:  # fmt: skip
    room.power(machine, "on")
    try:
        out = run_example(room, images, example, JobType.SHUTDOWN, credentials=other_credentials(room))
        expect(out, 1, "answers but the SSH login failed")
        assert room.machine(machine).power == "on"
        record(method, "wrong password", out, " (a key the machine does not accept)")
    finally:
        room.power(machine, "off")


@pytest.mark.parametrize(("example", "method", "machine"), [("wake-on-lan.yaml", "wake-on-LAN", "wol-example"),
                                                            ("ssh-shutdown.yaml", "SSH", "ssh-example")])  # fmt: skip
def test_ssh_shutdown_of_a_machine_that_does_not_answer_is_done(room: MachineRoom, images: Path, example: str,
                                                                method: str, machine: str) -> None:  # fmt: skip
    assert room.machine(machine).power == "off"
    out = run_example(room, images, example, JobType.SHUTDOWN)
    expect(out, 0, "does not answer: already off")
    record(method, "BMC does not answer", out, ": the machine does not answer, so it is off already")


def test_wake_on_lan_packet_received_but_the_machine_never_wakes(room: MachineRoom, images: Path) -> None:
    room.configure("wol-example", wakes_on_lan=False)
    try:
        out = run_example(room, images, "wake-on-lan.yaml", JobType.STARTUP)
        expect(out, 0)
        room._await(
            "the NIC to see the packet", lambda: any("disabled" in e for e in room.machine("wol-example").events()), 10
        )
        time.sleep(2)
        assert room.machine("wol-example").power == "off"
        record("wake-on-LAN", "never wakes", out, "; the NIC got the packet, WoL off in firmware: no kubelet")
    finally:
        room.configure("wol-example", wakes_on_lan=True)


def test_wake_on_lan_from_the_pod_network_does_not_reach_the_lan(room: MachineRoom, images: Path) -> None:
    """Why the example sets hostNetwork (docs/power-methods.md): without it the broadcast stays in the pod network.
    The one case that changes the example beyond addresses: hostNetwork dropped, on purpose."""
    before = len(room.machine("wol-example").events())
    out = run_example(
        room, images, "wake-on-lan.yaml", JobType.STARTUP, extra={"hostNetwork: true": "hostNetwork: false"}
    )
    expect(out, 0)
    time.sleep(3)
    assert room.machine("wol-example").power == "off"
    assert not any("magic packet" in e for e in room.machine("wol-example").events()[before:])
    record("wake-on-LAN", "without hostNetwork", out, ": sent, never reached the LAN")


# --- IPMI ------------------------------------------------------------------------------------------------------------
def test_ipmi_on_and_soft_off(room: MachineRoom, images: Path) -> None:
    t0 = time.monotonic()
    on = run_example(room, images, "ipmi.yaml", JobType.STARTUP)
    expect(on, 0, "chassis power on sent")
    room.wait_power("ipmi-example", "on", 10)
    room._await("ipmi-example's kubelet hook", lambda: hook_fired(room, "ipmi-example", True, t0), 10)
    record("IPMI", "on", on, "; the BMC says on, the kubelet started")
    again = run_example(room, images, "ipmi.yaml", JobType.STARTUP)
    expect(again, 0, "nothing to do")
    record("IPMI", "on again (a retried Job)", again, ": nothing to do")
    off = run_example(room, images, "ipmi.yaml", JobType.SHUTDOWN)
    expect(off, 0, "chassis power soft sent")
    room.wait_power("ipmi-example", "off", 10)
    assert any("ACPI" in e for e in room.machine("ipmi-example").events())
    record("IPMI", "off", off, "; ACPI button, the OS shut down, the BMC says off")


def test_ipmi_wrong_password(room: MachineRoom, images: Path) -> None:
    out = run_example(room, images, "ipmi.yaml", JobType.STARTUP, credentials=other_credentials(room))
    expect(out, 1, "Unable to establish IPMI v2 / RMCP+ session")
    assert room.machine("ipmi-example").power == "off"
    record("IPMI", "wrong password", out)


def test_ipmi_bmc_that_does_not_answer(room: MachineRoom, images: Path) -> None:
    room.bmc_cable("ipmi-example", False)
    try:
        out = run_example(room, images, "ipmi.yaml", JobType.STARTUP)
        expect(out, 1, "Unable to establish IPMI v2 / RMCP+ session")
        record("IPMI", "BMC does not answer", out)
    finally:
        room.bmc_cable("ipmi-example", True)


def test_ipmi_cipher_suite_17_as_written_against_a_bmc_without_it(room: MachineRoom, images: Path) -> None:
    """The example as written (cipher suite 17) against ipmi_sim, which offers SHA-1 suites only: the Job fails with
    the BMC's answer, which docs/power-methods.md tells the user how to read."""
    (as_written,) = BMC_SPECIFIC["ipmi.yaml"].items()
    out = run_example(room, images, "ipmi.yaml", JobType.STARTUP, extra={as_written[1]: as_written[0]})
    expect(out, 1, "invalid authentication algorithm")
    record("IPMI", "cipher suite 17 on a SHA-1 BMC", out)


def test_ipmi_machine_that_never_boots(room: MachineRoom, images: Path) -> None:
    room.configure("ipmi-example", boots=False)
    t0 = time.monotonic()
    try:
        out = run_example(room, images, "ipmi.yaml", JobType.STARTUP)
        expect(out, 0)
        room.wait_power("ipmi-example", "on", 10)
        time.sleep(2)
        assert not hook_fired(room, "ipmi-example", True, t0), "no OS, no kubelet"
        record("IPMI", "never wakes", out, "; the BMC says on, the OS never comes: no kubelet")
    finally:
        room.configure("ipmi-example", boots=True)
        room.power("ipmi-example", "off")


# --- Redfish ---------------------------------------------------------------------------------------------------------
def test_redfish_on_and_graceful_off(room: MachineRoom, images: Path) -> None:
    t0 = time.monotonic()
    on = run_example(room, images, "redfish.yaml", JobType.STARTUP)
    m = room.machine("redfish-example")
    expect(on, 0, f"/redfish/v1/Systems/{m.uuid} was Off; ResetType On accepted")
    room.wait_power("redfish-example", "on", 20)  # the fake driver applies a reset 1 to 11 s later
    room._await("redfish-example's kubelet hook", lambda: hook_fired(room, "redfish-example", True, t0), 10)
    record("Redfish", "on", on, f"; the system found by @odata.id ({m.uuid[:8]}…), the BMC says On")
    again = run_example(room, images, "redfish.yaml", JobType.STARTUP)
    expect(again, 0, "is On: nothing to do")
    off = run_example(room, images, "redfish.yaml", JobType.SHUTDOWN)
    expect(off, 0, "was On; ResetType GracefulShutdown accepted")
    room.wait_power("redfish-example", "off", 20)
    record("Redfish", "off", off, "; GracefulShutdown from AllowableValues, the BMC says Off")


def test_redfish_wrong_password(room: MachineRoom, images: Path) -> None:
    out = run_example(room, images, "redfish.yaml", JobType.STARTUP, credentials=other_credentials(room))
    expect(out, 22, "401", "curl: (22)")
    record("Redfish", "wrong password", out)


def test_redfish_bmc_that_does_not_answer(room: MachineRoom, images: Path) -> None:
    room.bmc_cable("redfish-example", False)
    try:
        out = run_example(room, images, "redfish.yaml", JobType.STARTUP)
        expect_no_answer(out)
        record("Redfish", "BMC does not answer", out)
    finally:
        room.bmc_cable("redfish-example", True)


@pytest.mark.parametrize(("status", "case", "message"), [
    (503, "5xx", "The service is temporarily unavailable: the BMC is updating its firmware"),
    (400, "4xx", "The value 'On' for the property ResetType is not in the list of acceptable values"),
])  # fmt: skip
def test_redfish_error_answers(room: MachineRoom, images: Path, status: int, case: str, message: str) -> None:
    room.fault("redfish-example", status, message)
    out = run_example(room, images, "redfish.yaml", JobType.STARTUP)
    expect(out, 22, f"returned error: {status}", message)
    assert room.machine("redfish-example").power == "off"
    record("Redfish", case, out)


def test_redfish_untrusted_certificate(room: MachineRoom, images: Path) -> None:
    """A CA bundle that is not the BMC's: curl refuses the certificate (never -k)."""
    ca = pki.Authority(room.dir / "other-ca", name="not-the-bmc-ca")
    out = run_example(
        room, images, "redfish.yaml", JobType.STARTUP, config_maps={"bmc-ca": {"ca.crt": ca.cert.read_text()}}
    )
    expect(out, 60, "curl: (60) SSL certificate problem")
    record("Redfish", "an untrusted certificate", out)


def test_redfish_machine_that_never_boots(room: MachineRoom, images: Path) -> None:
    room.configure("redfish-example", boots=False)
    t0 = time.monotonic()
    try:
        out = run_example(room, images, "redfish.yaml", JobType.STARTUP)
        expect(out, 0)
        room.wait_power("redfish-example", "on", 20)
        time.sleep(2)
        assert not hook_fired(room, "redfish-example", True, t0)
        record("Redfish", "never wakes", out, "; the BMC says On, the OS never comes: no kubelet")
    finally:
        room.configure("redfish-example", boots=True)
        off = run_example(room, images, "redfish.yaml", JobType.SHUTDOWN)
        expect(off, 0)
        room.wait_power("redfish-example", "off", 20)


# --- the smart plug (a stand-in for Shelly Gen2) ---------------------------------------------------------------------
def test_plug_on_and_off(room: MachineRoom, images: Path) -> None:
    m = room.machine("plug-example")
    t0 = time.monotonic()
    on = run_example(room, images, "smart-plug.yaml", JobType.STARTUP)
    expect(on, 0)
    assert '"was_on": false' in on.log
    room.wait_power("plug-example", "on", 10)
    room._await("plug-example's kubelet hook", lambda: hook_fired(room, "plug-example", True, t0), 30)
    record("smart plug", "on", on, "; relay on, AC restored, the firmware booted it")
    off = run_example(room, images, "smart-plug.yaml", JobType.SHUTDOWN)
    expect(off, 0)
    assert '"was_on": true' in off.log
    assert (m.state / "relay").read_text() == "off" and m.power == "off"
    assert not any("POWER CUT" in e for e in m.events()), m.events()
    record("smart plug", "off", off, "; SSH poweroff, no ping, then the relay off (never under a running OS)")


def test_plug_wrong_password(room: MachineRoom, images: Path) -> None:
    out = run_example(room, images, "smart-plug.yaml", JobType.STARTUP, credentials=other_credentials(room))
    expect(out, 22, "returned error: 401")
    assert room.machine("plug-example").power == "off"
    record("smart plug", "wrong password", out)


def test_plug_that_does_not_answer(room: MachineRoom, images: Path) -> None:
    room.bmc_cable("plug-example", False)
    try:
        out = run_example(room, images, "smart-plug.yaml", JobType.STARTUP)
        expect_no_answer(out)
        record("smart plug", "BMC does not answer", out)
    finally:
        room.bmc_cable("plug-example", True)


def test_plug_machine_that_stays_off_after_ac_loss(room: MachineRoom, images: Path) -> None:
    room.configure("plug-example", ac_power_on=False)
    try:
        out = run_example(room, images, "smart-plug.yaml", JobType.STARTUP)
        expect(out, 0)
        time.sleep(2)
        assert room.machine("plug-example").power == "off"
        record("smart plug", "never wakes", out, "; relay on, firmware stays off after AC loss: no kubelet")
    finally:
        room.configure("plug-example", ac_power_on=True)
        room.power("plug-example", "off")


def _since(room: MachineRoom, name: str, on: bool, t0: float) -> str:
    times = [t for t, n, o in room.hooks if n == name and o is on and t >= t0]
    return f"{times[0] - t0:.1f} s after the Job started" if times else "never"


def test_the_room_is_torn_down_completely(images: Path) -> None:
    """A room of its own, started and stopped: no namespace, container, mount or process of it stays."""
    directory = Path(tempfile.mkdtemp(prefix="hlmr-teardown-"))
    r = MachineRoom(directory, [MachineSpec("m", bmc="ipmi", sshd=True, wol=True)], peers_python=peers_python(),
                    machine_os=images / "machine-os" / "rootfs")  # fmt: skip
    r.start()
    r.power("m", "on")
    assert r.leftovers(), "a running room has namespaces and processes"
    r.stop()
    assert r.leftovers() == []
    shutil.rmtree(directory, ignore_errors=True)
