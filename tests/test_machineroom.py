"""The pure parts of the power tests (tests/machineroom, `make e2e-power`): localizing an example as a user does,
the Job and container the kubelet would run from it, the termination message it would report, and the peers'
configurations. What needs root and namespaces runs under `make e2e-power`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from api.names import JobType
from tests.machineroom import net, podrun, runc
from tests.machineroom.peers import state
from tests.machineroom.room import Credentials, ipmi_lan_conf

EXAMPLES = sorted(podrun.POWER_EXAMPLES.glob("*.yaml"))
# What a user replaces in each example (host names, addresses, MACs): test_power.py's map, with made-up values.
USER_VALUES = {
    "ipmi.yaml": {"192.168.1.110": "10.1.1.1"},
    "redfish.yaml": {"bmc-redfish.lan": "bmc.home.arpa"},
    "smart-plug.yaml": {"plug-example-plug.lan": "plug.home.arpa", "plug-example.lan": "box.home.arpa"},
    "ssh-shutdown.yaml": {"aa:bb:cc:dd:ee:10": "02:00:00:00:00:10", "ssh-example.lan": "box.home.arpa"},
    "wake-on-lan.yaml": {"aa:bb:cc:dd:ee:01": "02:00:00:00:00:01", "wol-example.lan": "box.home.arpa"},
}
SECRETS = {
    "ipmi-example": {"password": "s3cret"},
    "redfish-example": {"curlrc": 'user = "admin:s3cret"\n'},
    "plug-example": {"curlrc": 'user = "admin:s3cret"\n'},
    "ssh-shutdown": {"id_ed25519": "KEY"},
}
CONFIG_MAPS = {"bmc-ca": {"ca.crt": "CA"}, "ssh-known-hosts": {"known_hosts": "box ssh-ed25519 AAAA"}}


def test_every_power_example_has_its_replacements() -> None:
    assert {p.name for p in EXAMPLES} == set(USER_VALUES), "a new example needs its machine in tests/machineroom"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_localizing_an_example_changes_only_what_a_user_replaces(path: Path) -> None:
    before = list(yaml.safe_load_all(path.read_text()))
    after = list(yaml.safe_load_all(podrun.localize(path.read_text(), USER_VALUES[path.name])))
    changes = podrun.changed_values(before, after)
    assert changes, "the example names hosts a user replaces"
    for where, _, new in changes:
        assert any(v in str(new) for v in USER_VALUES[path.name].values()), f"{where} changed beyond a host name"


def test_localizing_refuses_a_replacement_the_example_no_longer_has() -> None:
    with pytest.raises(podrun.ExampleChanged, match=r"bmc-old\.lan"):
        podrun.localize("host: bmc-new.lan", {"bmc-old.lan": "10.0.0.1"})


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
@pytest.mark.parametrize("operation", [JobType.STARTUP, JobType.SHUTDOWN])
def test_an_examples_container_resolves_from_the_secrets_its_comments_name(path: Path, operation: JobType) -> None:
    job = podrun.job_of(podrun.slot_of(path, USER_VALUES[path.name]), operation)
    r = podrun.resolve(job, SECRETS, CONFIG_MAPS)
    assert r.image.startswith("registry.lan/homelab/power-"), "an image with the tool inside, built from images/"
    assert "apk" not in " ".join(r.argv), "nothing is installed at run time"
    assert r.env["HOMELAB_OPERATION"] == str(operation), "the operator's own Job builder made it"
    assert r.termination_policy == "FallbackToLogsOnError"
    for secret in ("s3cret", "KEY"):
        assert all(secret not in a for a in r.argv), f"{path.name}: a secret on the command line"
    image = r.image.rsplit("/", 1)[1].split(":")[0].removeprefix("power-")
    assert (podrun.POWER_EXAMPLES / "images" / f"{image}.Containerfile").is_file()


def test_the_ipmi_password_reaches_ipmitool_through_the_environment_only() -> None:
    job = podrun.job_of(podrun.slot_of(podrun.POWER_EXAMPLES / "ipmi.yaml", USER_VALUES["ipmi.yaml"]), JobType.STARTUP)
    r = podrun.resolve(job, SECRETS, CONFIG_MAPS)
    assert r.env["IPMI_PASSWORD"] == "s3cret" and " -E " in r.argv[-1] and '-C "$IPMI_CIPHER_SUITE"' in r.argv[-1]
    assert r.env["IPMI_CIPHER_SUITE"] == "17"


def test_the_redfish_script_discovers_the_system_and_never_skips_certificate_checks() -> None:
    job = podrun.job_of(podrun.slot_of(podrun.POWER_EXAMPLES / "redfish.yaml", {}), JobType.SHUTDOWN)
    script = job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert "/Systems/1" not in script and '"@odata.id"' in script and "AllowableValues" in script
    assert " -k" not in script and "--insecure" not in script and "--cacert /bmc-ca/ca.crt" in script
    assert podrun.resolve(job, SECRETS, CONFIG_MAPS).files["/credentials"]["curlrc"].startswith("user = ")


def test_a_missing_secret_is_named_as_the_kubelet_would() -> None:
    job = podrun.job_of(podrun.slot_of(podrun.POWER_EXAMPLES / "ipmi.yaml", {}), JobType.STARTUP)
    with pytest.raises(KeyError, match="Secret 'ipmi-example' has no key 'password'"):
        podrun.resolve(job, {"ipmi-example": {}}, {})
    job = podrun.job_of(podrun.slot_of(podrun.POWER_EXAMPLES / "redfish.yaml", {}), JobType.STARTUP)
    with pytest.raises(KeyError, match="ConfigMap 'bmc-ca' not found"):
        podrun.resolve(job, SECRETS, {})


def test_kubelet_expands_dollar_parentheses_references() -> None:
    env = {"A": "x"}
    assert podrun._expand("$(A)-$(B)-$$(A)", env) == "x-$(B)-$(A)"


@pytest.mark.parametrize(
    ("policy", "code", "file_text", "log", "message"),
    [
        ("FallbackToLogsOnError", 1, "", "a\nb\n", "a\nb"),
        ("FallbackToLogsOnError", 0, "", "a\nb\n", ""),
        ("FallbackToLogsOnError", 1, "said\n", "log", "said\n"),
        ("File", 1, "", "log", ""),
        (
            "FallbackToLogsOnError",
            1,
            "",
            "\n".join(str(i) for i in range(100)),
            "\n".join(str(i) for i in range(20, 100)),
        ),
    ],
)
def test_the_termination_message_is_the_kubelets(
    policy: str, code: int, file_text: str, log: str, message: str
) -> None:
    assert podrun.termination_message(policy, code, file_text, log) == message


def test_a_log_tail_is_bounded_to_2048_bytes() -> None:
    assert len(podrun.termination_message("FallbackToLogsOnError", 2, "", "x" * 5000)) == 2048


def test_the_runc_config_has_containerds_default_capabilities_and_the_given_network() -> None:
    cfg = runc.config(["true"], {"A": "1"}, Path("/r"), "/run/netns/hlmr-x-node", "h",
                      [runc.Mount(Path("/s"), "/credentials")])  # fmt: skip
    assert {"type": "network", "path": "/run/netns/hlmr-x-node"} in cfg["linux"]["namespaces"]
    assert "CAP_NET_RAW" in cfg["process"]["capabilities"]["bounding"], "ping needs it, as under containerd"
    assert "CAP_SYS_ADMIN" not in cfg["process"]["capabilities"]["bounding"]
    assert "A=1" in cfg["process"]["env"]
    (bind,) = [m for m in cfg["mounts"] if m["destination"] == "/credentials"]
    assert bind["options"] == ["rbind", "ro"]


def test_ipmi_sim_gets_one_admin_and_the_chassis_control_program() -> None:
    conf = ipmi_lan_conf("m", "198.18.0.5", "ADMIN", "pw", "/py /cc.py /state")
    assert 'user 2 true "ADMIN" "pw" admin' in conf and "addr 198.18.0.5 623" in conf
    assert 'chassis_control "/py /cc.py /state"' in conf
    with pytest.raises(ValueError, match="password"):
        ipmi_lan_conf("m", "198.18.0.5", "ADMIN", 'p"w', "/cc")


def test_credentials_fit_ipmi_and_list_what_must_not_leak() -> None:
    c = Credentials.fresh()
    assert len(c.ipmi_password.encode()) <= 20, "IPMI v2 passwords are at most 20 bytes"
    assert c.ipmi_password in c.values and c.ssh_private_key.splitlines()[2] in c.values
    assert c.ssh_public_key not in c.values


def test_the_chassis_control_program_speaks_ipmi_sims_extcmd(tmp_path: Path) -> None:
    from tests.machineroom.peers import chassis_control

    assert chassis_control.main([str(tmp_path), "set", "power", "1"]) == 0
    assert state.power(tmp_path) == "on"
    assert chassis_control.main([str(tmp_path), "set", "shutdown", "1"]) == 0
    assert (tmp_path / state.ACPI).exists(), "a soft shutdown is the OS's to do"
    assert state.power(tmp_path) == "on"


def test_the_plug_stand_in_answers_as_shelly_gen2_does(tmp_path: Path) -> None:
    from tests.machineroom.peers import plug

    p = plug.Plug(tmp_path, "shellyplusplugs-0200000000aa", "pw")
    assert p.call("Switch.Set", {"id": "0", "on": "true"}) == (200, {"was_on": False})
    assert state.power(tmp_path) == "on", "the firmware powers on after AC loss"
    code, body = p.call("Switch.Set", {"id": "0", "on": "maybe"})
    assert code == 400 and body["code"] == -103
    assert p.call("Switch.Set", {"id": "0", "on": "false"}) == (200, {"was_on": True})
    assert any("POWER CUT UNDER A RUNNING OS" in line for line in (tmp_path / state.EVENTS).read_text().splitlines())
    state.write(tmp_path / state.CONFIG, json.dumps({"ac_power_on": False}))
    p.call("Switch.Set", {"id": "0", "on": True})
    assert state.power(tmp_path) == "off"
    assert p.call("Nope.Nope", {})[0] == 404
    assert not p.authorized("GET", None) and not p.authorized("GET", 'Digest username="admin", algorithm=MD5')


def test_the_masquerade_rule_names_the_pod_network_and_the_lan_interface() -> None:
    """A real node's Pods reach the machine room's LAN by the rule a CNI bridge's ipMasq writes (net.Lan.join)."""
    rules = net.masquerade_rules("10.244.0.0/24", "hlmr0")
    assert 'ip saddr 10.244.0.0/24 oifname "hlmr0" masquerade' in rules
    assert "type nat hook postrouting priority srcnat" in rules
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 network"):
        net.masquerade_rules("10.244.0.0/33", "hlmr0")
    with pytest.raises(ValueError, match="interface name"):
        net.masquerade_rules("10.244.0.0/24", 'eth0" accept; #')
