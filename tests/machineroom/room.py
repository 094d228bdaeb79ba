"""The machine room: simulated machines on a LAN of network namespaces, each with the real BMC its power method
speaks to, and a hook that fires when the BMC says a machine is on or off (the real-cluster harness starts and
stops the machine's KWOK kubelet there).

A machine is
- its operating system's namespace (`eth0` with its MAC): while the machine is off the NIC has no address, so
  nothing answers ping or SSH, yet it sees every frame (a wake-on-LAN listener reads them); when it is on and its
  firmware boots, the address comes up and its OS starts (sshd in a container of tests/machineroom's machine OS,
  when the machine is shut down over SSH);
- its BMC's namespace with its own address: ipmi_sim (OpenIPMI, RMCP+ with a password), sushy-tools' Redfish
  emulator (HTTPS with the room's CA, basic authentication), or the Shelly Gen2 RPC stand-in of a smart plug;
- its state directory (tests/machineroom/peers/state.py): the power the BMC says, its firmware settings, its log.

The node a power Job runs on is a host on the same LAN; a Pod that is not on the host network sits behind it in a
pod network (routed and masqueraded, as a CNI bridge does). Nothing outside these namespaces is addressed, and
`stop()` removes them all, with every process and container, then checks that nothing is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import threading
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from tests.machineroom import net, runc
from tests.machineroom.peers import state
from tests.realcluster import pki

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PEERS = "tests.machineroom.peers"
IPMI_PORT, REDFISH_PORT, PLUG_PORT, SSH_PORT = 623, 443, 80, 22
IPMI_USER, REDFISH_USER, PLUG_USER, SSH_USER = "ADMIN", "admin", "admin", "homelab"
PowerHook = Callable[[str, bool], None]


@dataclass(frozen=True)
class MachineSpec:
    """What a machine has: a BMC (`ipmi`, `redfish`, `plug` or none), an SSH server, a wake-on-LAN NIC."""

    name: str
    bmc: str | None = None
    sshd: bool = False
    wol: bool = False

    def __post_init__(self) -> None:
        if self.bmc not in (None, "ipmi", "redfish", "plug"):
            raise ValueError(f"machine {self.name}: bmc {self.bmc!r} is not ipmi, redfish, plug or None")


@dataclass(frozen=True)
class Credentials:
    """The room's secrets: made fresh for every room, given to the BMCs, and to the Secrets a user would create."""

    ipmi_password: str
    redfish_password: str
    plug_password: str
    ssh_private_key: str  # OpenSSH format
    ssh_public_key: str

    @classmethod
    def fresh(cls) -> Credentials:
        key = ed25519.Ed25519PrivateKey.generate()
        private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                    serialization.NoEncryption()).decode()  # fmt: skip
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        # IPMI v2 passwords are at most 20 bytes (ipmitool refuses a longer one): every password here is 17.
        ipmi, redfish, plug = (f"hlmr-{secrets.token_urlsafe(9)}" for _ in range(3))
        return cls(ipmi, redfish, plug, private, public.decode())

    @property
    def values(self) -> list[str]:
        """What must never be seen on a command line, in a log or an Event: the passwords and the private key's body
        lines (but its first, the format's header and the public key, and a short last one, the padding)."""
        body = [ln for ln in self.ssh_private_key.splitlines() if ln and not ln.startswith("-----")]
        return [
            self.ipmi_password,
            self.redfish_password,
            self.plug_password,
            *[ln for ln in body[1:] if len(ln) >= 20],
        ]


@dataclass
class Machine:
    spec: MachineSpec
    os: net.Host
    bmc: net.Host | None
    state: Path
    uuid: str = field(default_factory=lambda: str(uuidlib.uuid4()))
    os_up: bool = False
    container: runc.Container | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def power(self) -> str:
        return state.power(self.state)

    def events(self) -> list[str]:
        path = self.state / state.EVENTS
        return [ln.split(" ", 1)[1] for ln in path.read_text().splitlines()] if path.is_file() else []


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)


def wait_until(what: str, check: Callable[[], object], within: float, every: float = 0.1) -> None:
    end = time.monotonic() + within
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"waited {within:.0f} s for {what}, in vain")
        time.sleep(every)


class MachineRoom:
    """`start()` builds the LAN, the machines and their BMCs; `stop()` removes all of it and checks."""

    def __init__(self, directory: Path, specs: list[MachineSpec], *, peers_python: Path, machine_os: Path | None,
                 on_power: PowerHook | None = None) -> None:  # fmt: skip
        self.dir = directory
        self.specs = specs
        self.peers_python = peers_python
        self.machine_os = machine_os
        self.on_power = on_power
        self.lan = net.Lan()
        self.credentials = Credentials.fresh()
        self.machines: dict[str, Machine] = {}
        self.procs: list[Proc] = []
        self.hooks: list[tuple[float, str, bool]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.ca: pki.Authority | None = None

    @property
    def run(self) -> str:
        return self.lan.run

    # --- building -----------------------------------------------------------------------------------------------
    def start(self) -> MachineRoom:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.lan.up()
            self.node = self.lan.host("node")
            self.pod = self.lan.pod_network(self.node)
            self.ca = pki.Authority(self.dir / "ca", name="homelab-machineroom-ca")
            self._ssh_files()
            for spec in self.specs:
                self._machine(spec)
            self._thread = threading.Thread(target=self._follow, name="machine-room", daemon=True)
            self._thread.start()
            for m in self.machines.values():
                self._await_peers(m)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, host: net.Host, args: list[str]) -> Proc:
        log = self.dir / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(host.exec(*args), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=self.dir, env=self._peer_env())  # fmt: skip
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def _peer_env(self) -> dict[str, str]:
        """The peers run as modules of this repository (tests.machineroom.peers) under the room's Python."""
        return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}

    def _machine(self, spec: MachineSpec) -> None:
        os_host = self.lan.host(spec.name, address=False)
        bmc = self.lan.host(f"{spec.name}-bmc") if spec.bmc else None
        directory = self.dir / "machines" / spec.name
        (directory / "os").mkdir(parents=True, exist_ok=True)
        state.write(directory / state.POWER, "off")
        m = Machine(spec, os_host, bmc, directory)
        self.machines[spec.name] = m
        if spec.wol:
            self._spawn(f"{spec.name}-nic", os_host, [str(self.peers_python), "-m", f"{PEERS}.wol", "eth0",
                                                      os_host.mac, str(directory)])  # fmt: skip
        if spec.bmc == "ipmi":
            self._ipmi(m)
        elif spec.bmc == "redfish":
            self._redfish(m)
        elif spec.bmc == "plug":
            self._plug(m)

    def _ipmi(self, m: Machine) -> None:
        assert m.bmc is not None
        d = m.state / "ipmi"
        (d / "persist").mkdir(parents=True, exist_ok=True)
        lan_conf = d / "lan.conf"
        lan_conf.write_text(ipmi_lan_conf(m.name, m.bmc.address, IPMI_USER, self.credentials.ipmi_password,
                                          f"{self.peers_python} -m {PEERS}.chassis_control {m.state}"))  # fmt: skip
        lan_conf.chmod(0o600)
        emu = d / "ipmisim.emu"
        emu.write_text(IPMI_EMU)
        self._spawn(f"{m.name}-ipmi_sim", m.bmc, ["ipmi_sim", "-c", str(lan_conf), "-f", str(emu), "-s",
                                                  str(d / "persist"), "-n"])  # fmt: skip

    def _redfish(self, m: Machine) -> None:
        assert m.bmc is not None and self.ca is not None
        d = m.state / "redfish"
        d.mkdir(parents=True, exist_ok=True)
        serving = self.ca.issue(f"{m.name}-bmc", f"{m.name}-bmc", server=True, ips=(m.bmc.address,))
        htpasswd = d / "htpasswd"
        subprocess.run([str(self.peers_python), "-c", HTPASSWD, REDFISH_USER, str(htpasswd)], check=True,
                       input=self.credentials.redfish_password, text=True, capture_output=True, timeout=60)  # fmt: skip
        cfg = {"state": str(m.state), "uuid": m.uuid, "name": m.name, "mac": m.os.mac, "os_address": m.os.address,
               "htpasswd": str(htpasswd), "address": m.bmc.address, "port": REDFISH_PORT, "cert": str(serving.cert),
               "key": str(serving.key)}  # fmt: skip
        (d / "config.json").write_text(json.dumps(cfg))
        self._spawn(f"{m.name}-sushy", m.bmc, [str(self.peers_python), "-m", f"{PEERS}.redfish_bmc",
                                               str(d / "config.json")])  # fmt: skip

    def _plug(self, m: Machine) -> None:
        assert m.bmc is not None
        secret = m.state / "plug-password"
        secret.write_text(self.credentials.plug_password)
        secret.chmod(0o600)
        args = [m.bmc.address, str(PLUG_PORT), str(m.state), self.plug_device_id(m), str(secret)]
        self._spawn(f"{m.name}-plug", m.bmc, [str(self.peers_python), "-m", f"{PEERS}.plug", *args])

    @staticmethod
    def plug_device_id(m: Machine) -> str:
        return "shellyplusplugs-" + m.os.mac.replace(":", "")[-12:]

    def _ssh_files(self) -> None:
        d = self.dir / "sshd"
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)
        host_key = ed25519.Ed25519PrivateKey.generate()
        key_file = d / "ssh_host_ed25519_key"
        key_file.write_bytes(host_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                                    serialization.NoEncryption()))  # fmt: skip
        key_file.chmod(0o600)
        public = host_key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        self.host_public_key = public.decode()
        (d / "authorized_keys").write_text(self.credentials.ssh_public_key + "\n")
        (d / "sshd_config").write_text(SSHD_CONFIG)

    def known_hosts(self) -> str:
        """The known_hosts file a user would put in the ConfigMap: every machine's OS address, its host key."""
        return "".join(f"{m.os.address} {self.host_public_key}\n" for m in self.machines.values() if m.spec.sshd)

    def _await_peers(self, m: Machine) -> None:
        def listening(kind: str, port: int) -> bool:
            assert m.bmc is not None
            out = net.sh(*m.bmc.exec("ss", "-H", f"-l{kind}n", f"sport = :{port}"), check=False).stdout
            return bool(out.strip())

        checks = {"ipmi": ("u", IPMI_PORT), "redfish": ("t", REDFISH_PORT), "plug": ("t", PLUG_PORT)}
        if m.spec.bmc:
            kind, port = checks[m.spec.bmc]
            self._await(f"{m.name}'s {m.spec.bmc} BMC to listen on {port}", lambda: listening(kind, port), 60)
        if m.spec.wol:
            self._await(f"{m.name}'s NIC to listen", lambda: any("listening" in e for e in m.events()), 30)

    def _await(self, what: str, check: Callable[[], object], within: float) -> None:
        end = time.monotonic() + within
        while not check():
            dead = [p for p in self.procs if p.popen.poll() is not None]
            if dead:
                p = dead[0]
                raise AssertionError(f"{p.name} exited ({p.popen.returncode}) while waiting for {what}:\n"
                                     f"{p.log.read_text(errors='replace')[-2000:]}")  # fmt: skip
            if time.monotonic() > end:
                raise AssertionError(f"waited {within:.0f} s for {what}, in vain")
            time.sleep(0.1)

    # --- the machines' lives ------------------------------------------------------------------------------------
    def _follow(self) -> None:
        seen = {name: "off" for name in self.machines}
        while not self._stop.wait(0.1):
            for m in self.machines.values():
                try:
                    self._step(m, seen)
                except Exception as exc:  # a harness thread reports, never dies
                    self.errors.append(f"{m.name}: {type(exc).__name__}: {exc}")

    def _step(self, m: Machine, seen: dict[str, str]) -> None:
        with self._lock:
            acpi = m.state / state.ACPI
            request = m.state / "os" / "os-request"
            if acpi.exists() or request.exists():
                why = "the ACPI power button" if acpi.exists() else "systemctl poweroff"
                acpi.unlink(missing_ok=True)
                request.unlink(missing_ok=True)
                if m.os_up:
                    state.event(m.state, "os", f"shutting down ({why})")
                    time.sleep(0.5)  # the services stop; the SSH session that asked is dropped with the rest
                    state.set_power(m.state, "off", "os", f"the OS powered off ({why})")
                else:
                    state.event(m.state, "os", f"{why} with no OS running: nothing happens")
            power = m.power
            if power == seen[m.name]:
                return
            seen[m.name] = power
            if power == "on":
                if state.config(m.state)["boots"]:
                    self._os_up(m)
                else:
                    state.event(m.state, "os", "powered on, but the OS never comes up")
            else:
                self._os_down(m)

    def _os_up(self, m: Machine) -> None:
        self.lan.address_up(m.os)
        if m.spec.sshd:
            assert self.machine_os is not None, "a machine with sshd needs the machine-os image"
            m.container = runc.Container(
                id=f"hlmr-{self.run}-{m.name}-os", image_rootfs=self.machine_os, workdir=self.dir / "os" / m.name,
                args=["/bin/sh", "-c", "mkdir -p /run/sshd && exec /usr/sbin/sshd -D -e -f /etc/ssh/hlmr/sshd_config"],
                netns=m.os.netns_path, hostname=m.name,
                mounts=[runc.Mount(self.dir / "sshd", "/etc/ssh/hlmr"), runc.Mount(m.state / "os", "/run/hlmr", False),
                        runc.Mount(self._hosts_file(m), "/etc/hosts")],
            ).start()  # fmt: skip
            with contextlib.suppress(AssertionError):
                wait_until(f"{m.name}'s sshd", lambda: net.sh(*m.os.exec("ss", "-H", "-ltn", "sport = :22"),
                                                                 check=False).stdout.strip(), 30)  # fmt: skip
        m.os_up = True
        state.event(m.state, "os", "up")
        self._hook(m.name, True)

    def _hosts_file(self, m: Machine) -> Path:
        """The machine's /etc/hosts, naming itself as Debian's installer does (sudo looks its own name up)."""
        path = m.state / "hosts"
        path.write_text(f"127.0.0.1 localhost\n127.0.1.1 {m.name}\n{m.os.address} {m.name}\n")
        return path

    def _os_down(self, m: Machine) -> None:
        was_up = m.os_up
        if m.container is not None:
            m.container.remove()
            m.container = None
        self.lan.address_down(m.os)
        m.os_up = False
        if was_up:
            state.event(m.state, "os", "down")
        self._hook(m.name, False)

    def _hook(self, name: str, on: bool) -> None:
        self.hooks.append((time.monotonic(), name, on))
        if self.on_power is not None:
            self.on_power(name, on)

    # --- what a test does to a machine --------------------------------------------------------------------------
    def machine(self, name: str) -> Machine:
        return self.machines[name]

    def configure(self, name: str, **settings: bool) -> None:
        """Firmware settings: wakes_on_lan, boots, ac_power_on (tests/machineroom/peers/state.py)."""
        unknown = set(settings) - set(state.DEFAULTS)
        if unknown:
            raise ValueError(f"machine {name}: unknown settings {sorted(unknown)}")
        m = self.machines[name]
        state.write(m.state / state.CONFIG, json.dumps({**state.config(m.state), **settings}))

    def fault(self, name: str, status: int, message: str, times: int = 1) -> None:
        """The next `times` Reset actions of a Redfish BMC are answered `status` with `message`."""
        m = self.machines[name]
        state.write(m.state / "fault.json", json.dumps({"status": status, "message": message, "times": times}))

    def bmc_cable(self, name: str, plugged: bool) -> None:
        """Pull or plug the BMC's network cable: a BMC that does not answer at all."""
        bmc = self.machines[name].bmc
        assert bmc is not None, f"{name} has no BMC"
        self.lan.link(bmc, plugged)

    def power(self, name: str, value: str, why: str = "set by the test") -> None:
        """Set a machine's power directly (as if by hand at the machine), and wait until its OS followed."""
        m = self.machines[name]
        if m.spec.bmc == "redfish":
            raise ValueError(f"{name}: a Redfish machine's power is its BMC's; ask the BMC")
        if m.spec.bmc == "plug":
            state.write(m.state / "relay", "on" if value == "on" else "off")
        state.set_power(m.state, value, "test", why)
        wait_until(f"{name}'s OS to follow power {value}", lambda: m.os_up == (value == "on")
                   or not state.config(m.state)["boots"], 30)  # fmt: skip

    def wait_power(self, name: str, value: str, within: float) -> None:
        m = self.machines[name]
        self._await(f"{name} to be {value} (events: {m.events()[-5:]})", lambda: m.power == value, within)

    # --- tearing down ------------------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for m in self.machines.values():
            if m.container is not None:
                m.container.remove()
        for p in reversed(self.procs):
            p.stop()
        self.lan.down()

    def leftovers(self) -> list[str]:
        """Everything of this room still on the machine: namespaces, containers, mounts, processes."""
        alive = [f"process {p.name} ({p.popen.pid})" for p in self.procs if p.popen.poll() is None]
        return self.lan.leftovers() + runc.leftovers(f"hlmr-{self.run}-") + alive

    def __enter__(self) -> MachineRoom:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- the peers' configurations (pure: tests/test_machineroom.py reads them) -------------------------------------
def ipmi_lan_conf(name: str, address: str, user: str, password: str, chassis_control: str) -> str:
    """ipmi_sim's lan.conf (ipmi_lan(5)): one LAN channel on the BMC's address, RMCP+ for one admin user, and the
    chassis control program that is the machine's power."""
    for what, value in (("user", user), ("password", password), ("chassis control", chassis_control)):
        if '"' in value or "\n" in value:
            raise ValueError(f"ipmi_sim {what} {value!r}: no quotes or newlines")
    return f"""name "{name}"
set_working_mc 0x20
  startlan 1
    addr {address} {IPMI_PORT}
    priv_limit admin
    allowed_auths_callback none md2 md5 straight
    allowed_auths_user none md2 md5 straight
    allowed_auths_operator none md2 md5 straight
    allowed_auths_admin none md2 md5 straight
    guid a123456789abcdefa123456789abcdef
  endlan
  chassis_control "{chassis_control}"
  user 1 false "" "" user 10 none md2 md5 straight
  user 2 true "{user}" "{password}" admin 10 md5
"""


IPMI_EMU = """mc_setbmc 0x20
mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr
mc_enable 0x20
"""

SSHD_CONFIG = """Port 22
ListenAddress 0.0.0.0
HostKey /etc/ssh/hlmr/ssh_host_ed25519_key
AuthorizedKeysFile /etc/ssh/hlmr/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
UsePAM yes
PidFile /run/sshd.pid
"""

# Run by the peers' Python (bcrypt comes with sushy-tools): the password on stdin, never on a command line.
HTPASSWD = (
    "import sys, bcrypt; pw = sys.stdin.read().encode(); "
    "open(sys.argv[2], 'w').write(sys.argv[1] + ':' + bcrypt.hashpw(pw, bcrypt.gensalt()).decode() + '\\n')"
)


def peers_python() -> Path:
    """The machine room's own Python (sushy-tools and bcrypt in it), made by tests/machineroom/setup.sh."""
    out = subprocess.run([str(HERE / "setup.sh"), "--where"], capture_output=True, text=True, timeout=30, check=True)
    return Path(out.stdout.strip()) / "bin" / "python"
