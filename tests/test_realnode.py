"""The real node's harness, its pure parts (`make e2e-pods` runs the rest): the configuration it renders for
containerd, the kubelet, kube-proxy, CNI and the API server's egress; the content keys that decide when an image is
rebuilt and which commit is the previous release; the namespace doors' address parsing; the machine room's BMC
switches; the certificates the harness issues in cert-manager's place; the guide's commands the tier types; and the
before/after inventory that proves the machine is left as found."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from tests.realcluster import certmanager, doors, images, inventory, machineroom, node, nsbridge, pki, test_pods


@pytest.fixture
def layout(tmp_path: Path) -> node.Layout:
    return node.Layout(tmp_path / "run", "abc123")


def test_every_path_the_node_writes_is_under_its_run(layout: node.Layout) -> None:
    text = node.containerd_config(layout, sandbox_image="127.0.0.1:5000/pause:k")
    paths = [line.split('"')[1] for line in text.splitlines() if '= "/' in line]
    assert paths, text
    for p in paths:
        assert p.startswith(str(layout.dir)) or p in ("/usr/sbin/runc", node.CNI_BIN), p
    assert "restrict_oom_score_adj = true" in text
    assert "netns_mounts_under_state_dir = true" in text
    assert 'sandbox_image = "127.0.0.1:5000/pause:k"' in text
    cni = node.cni_config(layout)
    assert cni["plugins"][0]["ipam"]["dataDir"].startswith(str(layout.dir))
    kubelet = node.kubelet_config(layout, ca=Path("/ca"), serving=pki.Pair(Path("/c"), Path("/k")))
    assert kubelet["podLogsDir"].startswith(str(layout.dir))
    assert kubelet["cgroupRoot"] == "/hlas-abc123"
    assert layout.netns == "hlas-abc123"


def test_the_kubelet_runs_on_cgroup_v1_and_knows_only_cluster_dns(layout: node.Layout) -> None:
    cfg = node.kubelet_config(layout, ca=Path("/ca"), serving=pki.Pair(Path("/c"), Path("/k")))
    assert cfg["failCgroupV1"] is False and cfg["cgroupDriver"] == "cgroupfs"
    assert cfg["resolvConf"] == "" and cfg["clusterDNS"] == [node.CLUSTER_DNS]
    assert cfg["authentication"]["anonymous"]["enabled"] is False
    assert {"key": node.CONTROL_PLANE_LABEL, "effect": "NoSchedule"} in cfg["registerWithTaints"]


def test_kube_proxy_leaves_the_machines_conntrack_alone() -> None:
    cfg = node.kube_proxy_config(kubeconfig=Path("/k"))
    assert cfg["conntrack"]["maxPerCore"] == 0 and cfg["mode"] == "nftables"


def test_the_network_policy_engine_reads_only_what_it_needs_as_its_own_user() -> None:
    role, binding = node.network_policy_rbac()
    assert {(tuple(r["resources"]), tuple(r["verbs"])) for r in role["rules"]} == {
        (("pods", "namespaces"), ("list", "watch")), (("networkpolicies",), ("list", "watch"))}  # fmt: skip
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": node.NETPOL_USER}]
    args = node.network_policy_args(Path("/bins"), kubeconfig=Path("/k"))
    assert args[0] == f"/bins/{node.NETPOL_ENGINE}"
    assert {"--kubeconfig=/k", f"--hostname-override={node.NODE_NAME}", "--disable-nri"} <= set(args)
    assert any(a.startswith("--metrics-bind-address=127.0.0.1:") for a in args)
    assert node.NETPOL_ENGINE in node.NODE_PROGRAMS


def test_the_door_probe_says_how_a_connect_went() -> None:
    """tests/realcluster/doors.py's probe, run here on the loopback: open, refused, no such name."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        open_port = listening.getsockname()[1]
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            closed_port = closed.getsockname()[1]  # bound, never listening: refused

            def probe(host: str, port: int) -> str:
                done = subprocess.run(["python3", "-c", doors.PROBE, host, str(port), "0", "3"], capture_output=True,
                                      text=True, timeout=30, check=True)  # fmt: skip
                return done.stdout.split(" ", 1)[0]

            assert probe("127.0.0.1", open_port) == "ok"
            assert probe("127.0.0.1", closed_port) == "refused"
            assert probe("no-such-name.invalid", open_port) == "no-dns"
    rows = doors.table([doors.Attempt("a/(no labels)", "svc b", 1, False, True, "ok")])
    assert "UNEXPECTED" in rows


def test_the_api_server_reaches_the_cluster_through_the_nodes_door(layout: node.Layout) -> None:
    cfg = node.egress_selector_config(layout)
    (sel,) = cfg["egressSelections"]
    assert sel["name"] == "cluster"
    assert sel["connection"]["transport"]["uds"]["udsName"] == str(layout.egress_socket)
    slice_ = node.kubernetes_endpoints(6443)
    assert slice_["endpoints"][0]["addresses"] == [node.NODE_IP] and slice_["ports"][0]["port"] == 6443


def test_the_doors_and_their_addresses() -> None:
    doors = node.Doors(api_port=6443, registry="127.0.0.1:5001", machine_room_port=9052)
    assert doors.forwards() == ["0.0.0.0:6443=127.0.0.1:6443", "127.0.0.1:5001=127.0.0.1:5001",
                                f"{node.NODE_IP}:9052=127.0.0.1:9052"]  # fmt: skip
    assert nsbridge.parse_forward("0.0.0.0:1=127.0.0.1:2") == (("0.0.0.0", 1), ("127.0.0.1", 2))
    for bad in ("nohost", "1.2.3.4:0", "1.2.3.4:x", ":80"):
        with pytest.raises(ValueError, match="host:port"):
            nsbridge.parse_addr(bad)
    assert nsbridge.parse_connect_request(b"CONNECT 10.0.0.5:443 HTTP/1.1\r\nHost: x\r\n\r\n") == ("10.0.0.5", 443)
    assert nsbridge.parse_connect_request(b"CONNECT [fd00::1]:10250 HTTP/1.1\r\n\r\n") == ("fd00::1", 10250)
    with pytest.raises(ValueError, match="not a CONNECT"):
        nsbridge.parse_connect_request(b"GET / HTTP/1.1\r\n\r\n")


def test_the_registry_is_plain_http_on_the_loopback_only() -> None:
    text = node.registry_hosts("127.0.0.1:5001")
    assert 'server = "http://127.0.0.1:5001"' in text and '"pull", "resolve"' in text


# --- images -----------------------------------------------------------------------------------------------------------
DOCKERFILE = """\
ARG PYTHON_IMAGE=python:3.11
FROM ${PYTHON_IMAGE} AS build
COPY pyproject.toml README.md ./
COPY api/ api/
# COPY commented/ out/
RUN pip install .
FROM ${PYTHON_IMAGE}
COPY --from=build /opt/venv /opt/venv
"""


def test_an_images_key_is_the_files_its_dockerfile_copies(tmp_path: Path) -> None:
    assert images.dockerfile_inputs(DOCKERFILE) == ["pyproject.toml", "README.md", "api"]
    for rel, text in {"pyproject.toml": "p", "README.md": "r", "api/a.py": "a", "api/__pycache__/a.pyc": "c",
                      "tests/t.py": "t"}.items():  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    files = images.context_files(tmp_path, DOCKERFILE, ["**/__pycache__", "*.egg-info"])
    assert [f.relative_to(tmp_path).as_posix() for f in files] == ["README.md", "api/a.py", "pyproject.toml"]

    def key() -> str:
        return images.content_key("r", *[f.read_bytes() for f in images.context_files(tmp_path, DOCKERFILE)])

    first = key()
    (tmp_path / "tests" / "t.py").write_text("changed")  # not copied: same image
    assert key() == first
    (tmp_path / "api" / "a.py").write_text("changed")  # copied: a new image
    assert key() != first


def test_the_repositorys_own_dockerfile_is_read() -> None:
    root = Path(__file__).resolve().parent.parent
    inputs = images.dockerfile_inputs((root / "Dockerfile").read_text())
    assert "pyproject.toml" in inputs and "workflows" in inputs and "tests" not in inputs


def test_dockerignore_patterns() -> None:
    pats = ["**/__pycache__", "**/*.pyc", ".venv", "*.egg-info"]
    assert images.ignored("api/__pycache__/x.pyc", pats)
    assert images.ignored("x.egg-info/PKG-INFO", pats)
    assert images.ignored(".venv/bin/python", pats)
    assert not images.ignored("api/models.py", pats)


# --- inventory --------------------------------------------------------------------------------------------------------
def test_the_inventory_says_what_a_run_left_behind() -> None:
    before = inventory.Inventory(netns=("named: a",), links=("lo",), mounts=("/ ext4",))
    after = inventory.Inventory(netns=("named: a", "named: hlas-x"), links=("lo", "hlas-br0"), mounts=())
    changes = inventory.diff(before, after)
    assert changes == {"netns": (["named: hlas-x"], []), "links": (["hlas-br0"], []), "mounts": ([], ["/ ext4"])}
    text = inventory.describe(changes)
    assert "netns: left behind: named: hlas-x" in text and "mounts: gone since before: / ext4" in text
    assert inventory.diff(before, before) == {}


def test_the_inventory_parses_the_tools_output() -> None:
    links = "1: lo: <LOOPBACK,UP> mtu 65536 qdisc noqueue\n7: veth1@if3: <BROADCAST> mtu 1500\n"
    assert inventory.parse_links(links) == ["lo", "veth1"]
    assert inventory.parse_nft_tables("table ip nat\ntable inet hlas-x\n") == ["inet hlas-x", "ip nat"]
    save = "# Generated\n*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j KUBE\nCOMMIT\n"
    assert inventory.parse_iptables_save(save) == ["nat -A PREROUTING -j KUBE", "nat :PREROUTING"]
    info = ("36 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
            "90 23 0:4 net:[4026532] /run/x\\040y rw - nsfs nsfs rw\n")  # fmt: skip
    assert inventory.parse_mountinfo(info) == ["/run/x y nsfs", "/sys/fs/cgroup/memory cgroup"]
    assert inventory.interesting_process("containerd", "net:[2]", "net:[1]", ())
    assert inventory.interesting_process("python --netns /var/run/netns/hlas-1", "net:[1]", "net:[1]", ("hlas-",))
    assert not inventory.interesting_process("bash", "net:[1]", "net:[1]", ("hlas-",))


def test_the_cni_network_is_valid_json_of_the_plugins_debian_ships(layout: node.Layout) -> None:
    cfg = json.loads(json.dumps(node.cni_config(layout)))
    assert [p["type"] for p in cfg["plugins"]] == ["bridge", "portmap"]
    assert cfg["plugins"][0]["bridge"].startswith(node.PREFIX)


# --- the machine room -------------------------------------------------------------------------------------------------
@dataclass
class Switchboard:
    """The machines the room switches, as a test sees them: who was powered, when."""

    machines: dict[str, object] = field(default_factory=lambda: {"m1": object(), "m2": object()})
    log: list[tuple[str, str]] = field(default_factory=list)

    def power_on(self, slot: str) -> None:
        self.log.append(("on", slot))

    def power_off(self, slot: str) -> None:
        self.log.append(("off", slot))


def test_the_machine_room_answers_as_a_bmc_would() -> None:
    board = Switchboard()
    room = machineroom.MachineRoom(board)
    assert room.handle("/machines/m1/on") == (200, "m1 on") and board.log == [("on", "m1")]
    assert room.handle("/machines/nope/on")[0] == 404 and room.handle("/machines/m1/reboot")[0] == 404
    room.fail("m2", "on", times=2)
    assert [room.handle("/machines/m2/on")[0] for _ in range(3)] == [503, 503, 200]
    assert [c.status for c in room.calls_of("m2", "on")] == [503, 503, 200]
    room.slow("*", "off", 0.2)
    began = time.monotonic()
    assert room.handle("/machines/m1/off")[0] == 200 and time.monotonic() - began >= 0.2
    began = time.monotonic()
    room.handle("/machines/m2/off")  # the slow answer was for one call only
    assert time.monotonic() - began < 0.2


def test_a_machine_boots_a_while_after_its_bmc_said_yes() -> None:
    board = Switchboard()
    room = machineroom.MachineRoom(board, boot_seconds=0.3)
    assert room.handle("/machines/m1/on")[0] == 200
    assert room.handle("/machines/m1/on")[0] == 200  # pressed twice: one boot
    assert board.log == []  # not up yet: mid-boot
    time.sleep(0.6)
    assert board.log == [("on", "m1")] and [s for s, _ in room.booted] == ["m1"]
    room.handle("/machines/m2/on")
    room.handle("/machines/m2/off")  # powered off mid-boot: it never comes up
    time.sleep(0.5)
    assert board.log == [("on", "m1"), ("off", "m2")]
    room.stop()


# --- the previous release ---------------------------------------------------------------------------------------------
def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "PATH": os.environ["PATH"], "HOME": str(repo)}  # fmt: skip
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.strip()


def test_the_previous_release_is_the_nearest_commit_whose_image_differs(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "Dockerfile").write_text("FROM x\nCOPY api/ api/\n")
    (repo / "api").mkdir()
    (repo / "api" / "a.py").write_text("one")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "one")
    first = _git(repo, "rev-parse", "HEAD")
    assert images.previous_image_commit(repo) is None  # no history before it
    (repo / "api" / "a.py").write_text("two")
    _git(repo, "commit", "-qam", "two")
    (repo / "docs.md").write_text("words")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "docs only")
    # HEAD~1 has the same image as HEAD (only docs changed since): the release before is the first commit.
    assert images.previous_image_commit(repo) == first
    exported = images.export_commit(first, tmp_path / "previous", root=repo)
    assert (exported / "api" / "a.py").read_text() == "one"
    assert images.resolve_commit("HEAD~2", repo) == first
    with pytest.raises(ValueError, match="HOMELAB_E2E_PREVIOUS=nope: no such commit"):
        images.resolve_commit("nope", repo)
    (repo / "api" / "a.py").write_text("three")  # the working tree is what is built now, committed or not
    assert images.previous_image_commit(repo) == _git(repo, "rev-parse", "HEAD~1")


# --- the harness as cert-manager --------------------------------------------------------------------------------------
def _certificates() -> dict[str, dict[str, object]]:
    deploy = Path(__file__).resolve().parent.parent / "deploy" / "components"
    docs = [d for f in ("cert-manager/certificates.yaml", "admission/webhook.yaml")
            for d in yaml.safe_load_all((deploy / f).read_text()) if d and d["kind"] == "Certificate"]  # fmt: skip
    return {d["metadata"]["name"]: d["spec"] for d in docs}


def test_the_harness_issues_deploys_certificates_as_cert_manager_would() -> None:
    specs = _certificates()
    assert set(specs) == {"homelab-autoscaler-ca", "homelab-autoscaler-provider", "cluster-autoscaler-client",
                          "homelab-autoscaler-webhook", "temporal-frontend", "homelab-autoscaler-temporal",
                          "temporal-web"}  # fmt: skip
    root = certmanager.issue(specs["homelab-autoscaler-ca"], None)
    assert root.ca == root.cert and root.cert.issuer == root.cert.subject  # self-signed: ca.crt is itself
    basic = root.cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    usage = root.cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert basic.ca and usage.key_cert_sign and usage.digital_signature
    assert root.cert.not_valid_after_utc - root.cert.not_valid_before_utc == dt.timedelta(hours=87600)
    assert isinstance(root.key, ec.EllipticCurvePrivateKey) and root.key.curve.name == "secp256r1"
    server, client = ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH
    for name, eku in (("homelab-autoscaler-provider", [server]), ("homelab-autoscaler-webhook", [server]),
                      ("cluster-autoscaler-client", [client]), ("temporal-frontend", [server, client]),
                      ("homelab-autoscaler-temporal", [client]), ("temporal-web", [client])):  # fmt: skip
        leaf = certmanager.issue(specs[name], (root.cert, root.key))
        assert leaf.ca == root.cert and leaf.cert.issuer == root.cert.subject
        leaf.cert.verify_directly_issued_by(root.cert)  # signed by the CA's key, issuer named as its subject
        assert not leaf.cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        assert list(leaf.cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == eku
        dns = specs[name].get("dnsNames")
        if dns:
            sans = leaf.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            assert sans.get_values_for_type(x509.DNSName) == dns
        assert set(leaf.secret_data()) == {"tls.crt", "tls.key", "ca.crt"}


def test_the_harness_refuses_what_it_does_not_issue_by_name() -> None:
    with pytest.raises(certmanager.Unsupported, match="subject"):
        certmanager.issue({"secretName": "s", "subject": {"organizations": ["x"]}, "issuerRef": {"name": "i"}}, None)
    with pytest.raises(certmanager.Unsupported, match="usage 'code signing'"):
        certmanager.issue({"secretName": "s", "usages": ["code signing"]}, None)
    assert certmanager.parse_duration("1h30m") == dt.timedelta(minutes=90)
    with pytest.raises(certmanager.Unsupported, match="duration"):
        certmanager.parse_duration("3d")


def test_every_command_the_node_tier_types_is_in_the_guide() -> None:
    """The tier types docs/install.md's commands word for word: the page and the test cannot drift apart."""
    source = (Path(__file__).resolve().parent / "realcluster" / "test_pods.py").read_text()
    typed = re.findall(r'typed\(\w+,\s*((?:"[^"]*"\s*)+)(?:,[^)]*?doc="([\w.]+)")?', source)
    assert len(typed) >= 12, typed
    for literal, doc in typed:
        command = "".join(re.findall(r'"([^"]*)"', literal))
        assert command in test_pods.guide_text(doc or "install.md"), f"docs/{doc or 'install.md'}: `{command}`"


def test_the_log_keeper_keeps_what_a_replaced_pod_printed(tmp_path: Path) -> None:
    from tests.realcluster.podstack import LogKeeper

    source, dest = tmp_path / "pod-logs", tmp_path / "kept"
    log = source / "ns_operator-abc_0123-uid" / "homelab-autoscaler" / "0.log"
    log.parent.mkdir(parents=True)
    log.write_text("one\n")
    keeper = LogKeeper(source, dest)
    keeper.copy()
    with log.open("a") as f:
        f.write("two\n")
    keeper.copy()
    keeper.copy()  # nothing new: nothing appended twice
    log.unlink()  # the Pod is gone, and the kubelet took its logs with it
    kept = dest / "ns_operator-abc" / "homelab-autoscaler.log"
    assert kept.read_text() == "one\ntwo\n"
    assert "two" in keeper.tails(5, names=("operator",)) and keeper.tails(5, names=("temporal",)) == ""


def test_an_image_key_is_the_same_in_every_clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A recipe that names a file of the checkout (the Debian base's hook, PostgreSQL's entry point) keys the same in
    every clone, and differently when the file's content changes: CI clones afresh, so a key naming the clone's
    directory never hit the cache."""
    keys = []
    for clone in ("a", "b"):
        root = tmp_path / clone
        hook = root / "tests" / "hook.sh"
        hook.parent.mkdir(parents=True)
        hook.write_text("echo slim\n")
        monkeypatch.setattr(images, "ROOT", root)
        keys.append(images.content_key("recipe", f"--customize-hook=sh {hook}", hook))
    assert keys[0] == keys[1]
    hook.write_text("echo slimmer\n")
    assert images.content_key("recipe", f"--customize-hook=sh {hook}", hook) != keys[1]
