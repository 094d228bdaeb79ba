"""A real node beside the KWOK machines (`make e2e-pods`): kubelet, Debian's containerd and runc, the CNI bridge,
kube-proxy, all inside a network namespace of the run's own, joined to the harness's control plane.

Addresses (inside the node's namespace only; nothing of them exists in the machine's):
  NODE_IP     on a link of its own: the kubelet's InternalIP, where Pods reach the API server and the machine room;
  POD_CIDR    on the CNI bridge (host-local IPAM); the node's namespace has no default route, so no Pod reaches
              anything but the node, its Pods and its Services;
  SERVICE_CIDR the control plane's: routed to that link so kube-proxy's rules see the node's own packets.
The doors between the two namespaces are tests/realcluster/nsbridge.py's.

NetworkPolicy is enforced on the node by SIG Network's kube-network-policies (`RealNode.network_policies`), a process
in the node's namespace beside kube-proxy: its nftables table there sends the first packet of each connection from
or to a Pod some policy selects to an nfqueue, where it gives the verdict. Bridged Pod-to-Pod packets pass those
hooks through br_netfilter (`net.bridge.bridge-nf-call-iptables`, set to 1 in the node's namespace only). Packets a
root process of the node sends (the kubelet's probes, the doors of nsbridge: port-forward, exec, the API server's
webhook calls) are let through by the engine's own first rule, as on any node; packets to the node itself
(10.245.0.1: the API server's door, the machine room) are delivered locally and never reach its hook.

Everything the node writes lives under its run directory, with three exceptions the runtime hard-codes (shim
sockets in /run/containerd/s, log links in /var/log/containers, cgroups under /sys/fs/cgroup/*/<root>): `stop()`
removes what the run added there, and tests/realcluster/inventory.py checks that it did.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.procs import BIN
from tests.realcluster import pki
from tests.realcluster.cluster import SERVICE_CIDR, Cluster, Proc, wait_until

HERE = Path(__file__).resolve().parent
BUILD_NODE = HERE / "build-node.sh"
PREFIX = "hlas-"
NODE_NAME = "control-plane"
NODE_IP = "10.245.0.1"
POD_CIDR = "10.244.0.0/24"
CLUSTER_DNS = "10.0.0.10"
BRIDGE = "hlas-br0"
DUMMY = "hlas-node0"
DUMMY_PEER = "hlas-node1"
CNI_BIN = "/usr/lib/cni"
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
SHIM_SOCKETS = Path("/run/containerd/s")
# The kernel settings a kubelet sets to its liking at start (its container manager's "kernel flags"); they are the
# machine's, not the namespace's: recorded before, put back at the end (tests/realcluster/inventory.py checks).
KERNEL_TUNABLES = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                   "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")  # fmt: skip
CONTAINER_LOG_LINKS = Path("/var/log/containers")
# libcni's result cache (containerd's CNI library has no setting for it).
CNI_CACHE = Path("/var/lib/cni")
# Paths written whatever the run's configuration says: the kubelet's device-plugin socket
# (/var/lib/kubelet/device-plugins/kubelet.sock), and the CNI configuration lock buildah's network library takes
# (/etc/cni/net.d/cni.lock, at `buildah from`). On a machine without them the run makes them; `stop()` (and
# PodStack's, for the images built before the node) removes what it made, as with the shim sockets.
HARD_CODED = (Path("/var/lib/kubelet"), Path("/etc/cni"))


class Unavailable(RuntimeError):
    """Something the node needs is not on this machine: the tier skips, naming it and how to get it."""


def node_bin_dir() -> Path:
    out = subprocess.run([str(BUILD_NODE), "--where"], capture_output=True, text=True, timeout=30, check=True)
    return Path(out.stdout.strip())


def cert_manager_crds() -> Path:
    """cert-manager's CRDs as build-node.sh keeps them (`make node-bins` fetches them)."""
    out = subprocess.run([str(BUILD_NODE), "--where-cert-manager-crds"], capture_output=True, text=True, timeout=30,
                         check=True)  # fmt: skip
    path = Path(out.stdout.strip())
    if not path.is_file():
        raise Unavailable(f"{path} is missing: run `make node-bins`")
    return path


DEBIAN_TOOLS = {"containerd": "containerd", "runc": "runc", "nsenter": "util-linux", "nft": "nftables",
                "ip": "iproute2", "ctr": "containerd"}  # fmt: skip


NODE_PROGRAMS = ("kubelet", "kube-proxy", "pause", "coredns", "local-path-provisioner", "kube-network-policies")
NETPOL_ENGINE = "kube-network-policies"
NETPOL_USER = "hlas:kube-network-policies"
NETPOL_QUEUE = 100
NETPOL_METRICS = "127.0.0.1:9080"  # in the node's namespace


def require_node(programs: tuple[str, ...] = NODE_PROGRAMS) -> Path:
    """The node's bin directory, or `Unavailable` naming what is missing and what brings it."""
    if os.geteuid() != 0:
        raise Unavailable("the real node needs root (network namespaces, mounts, cgroups)")
    missing = [f"{tool} (apt-get install {pkg})" for tool, pkg in DEBIAN_TOOLS.items() if shutil.which(tool) is None]
    missing += [f"{CNI_BIN}/{p} (apt-get install containernetworking-plugins)"
                for p in ("bridge", "host-local", "loopback", "portmap") if not Path(CNI_BIN, p).exists()]  # fmt: skip
    where = node_bin_dir()
    missing += [f"{where}/{b} (make node-bins)" for b in programs if not (where / b).is_file()]
    if missing:
        raise Unavailable("the real node lacks: " + "; ".join(missing))
    return where


# --- configuration, rendered (pure: tests/test_realnode.py) ---------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """Where one node keeps everything, under its run directory. `prefix` names what it makes outside that directory
    (its network namespace, its cgroups): a tier of its own running beside another on the shared machine takes its
    own, so neither run's inventory counts the other's node as its leftovers."""

    dir: Path
    run_id: str
    prefix: str = PREFIX

    @property
    def netns(self) -> str:
        return f"{self.prefix}{self.run_id}"

    @property
    def netns_path(self) -> Path:
        return Path("/var/run/netns") / self.netns

    @property
    def cgroup_root(self) -> str:
        return f"/{self.prefix}{self.run_id}"

    @property
    def containerd(self) -> Path:
        return self.dir / "containerd"

    @property
    def socket(self) -> Path:
        return self.containerd / "containerd.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.dir / "cni" / "net.d"

    @property
    def kubelet_root(self) -> Path:
        return self.dir / "kubelet"

    @property
    def pod_logs(self) -> Path:
        return self.dir / "pod-logs"

    @property
    def egress_socket(self) -> Path:
        return self.dir / "egress.sock"

    @property
    def storage(self) -> Path:
        """local-path-provisioner's volumes."""
        return self.dir / "local-path"


def containerd_config(layout: Layout, *, sandbox_image: str) -> str:
    """containerd 1.6's configuration: every path under the run, the CRI plugin as the kubelet needs it here."""
    c = layout.containerd
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return "\n".join([
        "version = 2",
        f'root = "{c / "root"}"',
        f'state = "{c / "state"}"',
        "[grpc]",
        f'  address = "{layout.socket}"',
        "[ttrpc]",
        f'  address = "{layout.socket}.ttrpc"',
        "[debug]",
        '  address = ""',
        "[metrics]",
        '  address = ""',
        '[plugins."io.containerd.internal.v1.opt"]',
        f'  path = "{c / "opt"}"',
        f"[{cri}]",
        f'  sandbox_image = "{sandbox_image}"',
        # Processes here lack CAP_SYS_RESOURCE: a sandbox's oom_score_adj of -998 made runc fail
        # ("can't get final child's PID from pipe: EOF"); with this, no container gets below containerd's own.
        "  restrict_oom_score_adj = true",
        # A Pod's network namespace is a mount under containerd's state, not in /var/run/netns.
        "  netns_mounts_under_state_dir = true",
        '  stream_server_address = "127.0.0.1"',
        '  stream_server_port = "0"',
        "  enable_unprivileged_ports = true",
        "  disable_apparmor = true",
        f"[{cri}.containerd]",
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        f"[{cri}.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
        f"[{cri}.containerd.runtimes.runc.options]",
        '  BinaryName = "/usr/sbin/runc"',
        f'  Root = "{c / "runc"}"',
        "  SystemdCgroup = false",
        f"[{cri}.cni]",
        f'  bin_dir = "{CNI_BIN}"',
        f'  conf_dir = "{layout.cni_conf_dir}"',
        "  max_conf_num = 1",
        f"[{cri}.registry]",
        f'  config_path = "{c / "certs.d"}"',
        "",
    ])  # fmt: skip


def registry_hosts(registry: str) -> str:
    """containerd's hosts.toml for the run's registry: plain HTTP on the loopback (nothing else is a registry)."""
    return f'server = "http://{registry}"\n\n[host."http://{registry}"]\n  capabilities = ["pull", "resolve"]\n'


def cni_config(layout: Layout) -> dict[str, Any]:
    """The bridge network: one /24 on the bridge, routes for everything through it (the node routes nowhere)."""
    return {
        "cniVersion": "0.4.0",
        "name": f"{layout.prefix}pods",
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]], "routes": [{"dst": "0.0.0.0/0"}],
                      "dataDir": str(layout.dir / "cni" / "ipam")}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }  # fmt: skip


def kubelet_config(layout: Layout, *, ca: Path, serving: pki.Pair) -> dict[str, Any]:
    """The kubelet's configuration: cgroup v1 allowed (this machine), cgroupfs under the run's own root, the
    control-plane taint registered (only what tolerates it runs here), no host resolv.conf (Pods know only
    cluster.local), pod logs under the run."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": layout.cgroup_root,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{layout.socket}",
        "address": "0.0.0.0",
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": str(serving.cert),
        "tlsPrivateKeyFile": str(serving.key),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "AlwaysAllow"},
        "clusterDomain": "cluster.local",
        "clusterDNS": [CLUSTER_DNS],
        "resolvConf": "",
        "registerWithTaints": [{"key": CONTROL_PLANE_LABEL, "effect": "NoSchedule"}],
        "podLogsDir": str(layout.pod_logs),
        "serializeImagePulls": False,
        "rotateCertificates": False,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "maxPods": 60,
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
    }  # fmt: skip


def kube_proxy_config(*, kubeconfig: Path) -> dict[str, Any]:
    """kube-proxy in nftables mode inside the node's namespace; it leaves the machine's conntrack limits alone."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "nftables",
        "clusterCIDR": POD_CIDR,
        "hostnameOverride": NODE_NAME,
        "bindAddress": "0.0.0.0",
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def network_policy_rbac(user: str = NETPOL_USER) -> list[dict[str, Any]]:
    """What the engine reads, as its install.yaml grants it (pods and namespaces, networkpolicies: list, watch),
    bound to the user of its client certificate. Nodes only with AdminNetworkPolicy, which is not enabled."""
    name = "hlas-kube-network-policies"
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
         "rules": [{"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["list", "watch"]},
                   {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
                    "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]},
    ]  # fmt: skip


def network_policy_args(bins: Path, *, kubeconfig: Path) -> list[str]:
    """The engine's command line: its own kubeconfig (build-node.sh adds the flag), the node's name, no NRI
    (containerd 1.6 has none), metrics on the namespace's loopback."""
    return [str(bins / NETPOL_ENGINE), f"--kubeconfig={kubeconfig}", f"--hostname-override={NODE_NAME}",
            f"--nfqueue-id={NETPOL_QUEUE}", f"--metrics-bind-address={NETPOL_METRICS}", "--disable-nri",
            "--v=2"]  # fmt: skip


def egress_selector_config(layout: Layout) -> dict[str, Any]:
    """The API server reaches the cluster (the kubelet, webhook Services, Pods) through the node's CONNECT door."""
    return {
        "apiVersion": "apiserver.k8s.io/v1beta1",
        "kind": "EgressSelectorConfiguration",
        "egressSelections": [{
            "name": "cluster",
            "connection": {"proxyProtocol": "HTTPConnect",
                           "transport": {"uds": {"udsName": str(layout.egress_socket)}}},
        }],
    }  # fmt: skip


def kubernetes_endpoints(api_port: int) -> dict[str, Any]:
    """The `kubernetes` Service's endpoint, as a Pod reaches the API server: the node's door to it."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "kubernetes",
                                "endpointslice.kubernetes.io/managed-by": "homelab-autoscaler-test"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": api_port, "protocol": "TCP"}],
    }  # fmt: skip


def apiserver_args(layout: Layout, kubelet_client: pki.Pair) -> tuple[str, ...]:
    """What the API server needs to reach this node: the egress door, and a client certificate for the kubelet (the
    cluster already prefers a node's InternalIP, which is this node's address in its namespace)."""
    cfg = layout.dir / "egress-selector.yaml"
    cfg.write_text(yaml.safe_dump(egress_selector_config(layout)))
    return (f"--egress-selector-config-file={cfg}", f"--kubelet-client-certificate={kubelet_client.cert}",
            f"--kubelet-client-key={kubelet_client.key}")  # fmt: skip


# --- the node ---------------------------------------------------------------------------------------------------------
def _sh(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


@dataclass
class Doors:
    """What crosses between the machine's namespace and the node's: ports on the loopback here, reached there."""

    api_port: int
    registry: str = ""  # host:port of the run's registry on the loopback
    machine_room_port: int = 0

    def forwards(self) -> list[str]:
        out = [f"0.0.0.0:{self.api_port}=127.0.0.1:{self.api_port}"]
        if self.registry:
            port = self.registry.rsplit(":", 1)[1]
            out.append(f"127.0.0.1:{port}=127.0.0.1:{port}")
        if self.machine_room_port:
            out.append(f"{NODE_IP}:{self.machine_room_port}=127.0.0.1:{self.machine_room_port}")
        return out


@dataclass
class RealNode:
    """`prepare()` before the control plane starts (its namespace and the API server's flags), `start(cluster)`
    after; `stop()` removes every process, mount, namespace and cgroup it made, also after a failed start."""

    dir: Path
    doors: Doors
    sandbox_image: str
    bins: Path = field(default_factory=lambda: require_node(("kubelet", "kube-proxy", NETPOL_ENGINE)))
    prefix: str = PREFIX  # of its namespace and cgroups (Layout)
    network_policies: bool = True  # kube-network-policies enforces NetworkPolicy on the node
    layout: Layout = field(init=False)
    procs: list[Proc] = field(default_factory=list)
    cluster: Cluster | None = None
    _tunables: dict[str, str] = field(default_factory=dict)
    _strays_before: set[Path] = field(default_factory=set)
    _shim_dir_existed: bool = True
    _log_links_dir_existed: bool = True

    def __post_init__(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.layout = Layout(self.dir, secrets.token_hex(3), self.prefix)

    # --- before the control plane ---------------------------------------------------------------------------------
    def prepare(self, authority: pki.Authority) -> tuple[str, ...]:
        """The namespace, its links and doors; returns the API server's extra flags."""
        self._tunables = read_tunables()
        self._shim_dir_existed = SHIM_SOCKETS.exists()
        self._strays_before = strays()
        self._log_links_dir_existed = CONTAINER_LOG_LINKS.exists()
        ns = self.layout.netns
        _sh("ip", "netns", "add", ns)
        # The node's own address on one end of a veth pair whose both ends stay in its namespace (this kernel has
        # no dummy links); the other end only keeps the link up.
        for cmd in (["ip", "link", "set", "lo", "up"], ["ip", "link", "add", DUMMY, "type", "veth", "peer", "name",
                     DUMMY_PEER], ["ip", "link", "set", DUMMY_PEER, "up"],
                    ["ip", "addr", "add", f"{NODE_IP}/32", "dev", DUMMY], ["ip", "link", "set", DUMMY, "up"],
                    ["ip", "route", "add", SERVICE_CIDR, "dev", DUMMY],
                    ["sysctl", "-qw", "net.ipv4.ip_forward=1"]):  # fmt: skip
            _sh("nsenter", f"--net={self.layout.netns_path}", *cmd)
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            if (hierarchy / "cgroup.procs").exists() and hierarchy.name != "unified":
                (hierarchy / self.layout.cgroup_root.strip("/")).mkdir(exist_ok=True)
        self._start_bridge()
        client = authority.issue("kube-apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                 organizations=("system:masters",))  # fmt: skip
        return apiserver_args(self.layout, client)

    def _in_netns(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, ["nsenter", f"--net={self.layout.netns_path}", *args], self.dir / f"{name}.log",
                    env=env or {}).start()  # fmt: skip
        self.procs.append(proc)
        return proc

    def _start_bridge(self) -> None:
        args = [str(BIN / "python"), "-m", "tests.realcluster.nsbridge", "--netns", str(self.layout.netns_path),
                "--connect", str(self.layout.egress_socket)]  # fmt: skip
        for f in self.doors.forwards():
            args += ["--forward", f]
        bridge = Proc("nsbridge", args, self.dir / "nsbridge.log").start()
        self.procs.append(bridge)
        wait_until("the namespace doors (nsbridge) to be ready", lambda: "nsbridge: ready" in bridge.tail(50),
                   within=30, procs=[bridge])  # fmt: skip

    # --- after the control plane ----------------------------------------------------------------------------------
    def start(self, cluster: Cluster) -> RealNode:
        self.cluster = cluster
        try:
            self._start_containerd()
            self._start_kubelet(cluster)
            self._start_kube_proxy(cluster)
            if self.network_policies:
                self._start_network_policies(cluster)
            cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                            input=yaml.safe_dump(kubernetes_endpoints(self.doors.api_port)))  # fmt: skip
        except BaseException:
            self.dump()
            raise
        return self

    def _start_containerd(self) -> None:
        lay = self.layout
        lay.containerd.mkdir(parents=True, exist_ok=True)
        lay.cni_conf_dir.mkdir(parents=True, exist_ok=True)
        (lay.cni_conf_dir / "10-hlas.conflist").write_text(json.dumps(cni_config(lay), indent=2))
        if self.doors.registry:
            hosts = lay.containerd / "certs.d" / self.doors.registry
            hosts.mkdir(parents=True, exist_ok=True)
            (hosts / "hosts.toml").write_text(registry_hosts(self.doors.registry))
        cfg = lay.containerd / "config.toml"
        cfg.write_text(containerd_config(lay, sandbox_image=self.sandbox_image))
        proc = self._in_netns("containerd", ["containerd", "--config", str(cfg), "--log-level", "info"])
        wait_until("containerd to answer on its socket", lambda: self.ctr("version", check=False).returncode == 0,
                   within=60, procs=[proc])  # fmt: skip

    def ctr(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return _sh("ctr", "--address", str(self.layout.socket), "--namespace", "k8s.io", *args, check=check,
                   timeout=timeout)  # fmt: skip

    def _start_kubelet(self, cluster: Cluster) -> None:
        lay = self.layout
        lay.kubelet_root.mkdir(parents=True, exist_ok=True)
        lay.pod_logs.mkdir(parents=True, exist_ok=True)
        pair = cluster.pki.issue("kubelet-client", f"system:node:{NODE_NAME}", organizations=("system:nodes",))
        serving = cluster.pki.issue("kubelet-serving", NODE_NAME, server=True, ips=(NODE_IP,), dns=(NODE_NAME,))
        kubeconfig = pki.kubeconfig(self.dir / "kubelet.kubeconfig", server=cluster.server, ca=cluster.pki.cert,
                                    user=f"system:node:{NODE_NAME}", pair=pair)  # fmt: skip
        cfg = self.dir / "kubelet.yaml"
        cfg.write_text(yaml.safe_dump(kubelet_config(lay, ca=cluster.pki.cert, serving=serving)))
        proc = self._in_netns("kubelet", [
            str(self.bins / "kubelet"), f"--config={cfg}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={lay.kubelet_root}", f"--node-ip={NODE_IP}", f"--hostname-override={NODE_NAME}",
            "--v=2",
        ])  # fmt: skip
        core: Any = k8s.CoreV1Api(cluster.admin)

        def registered() -> bool:
            core.read_node(NODE_NAME)
            return True

        wait_until(f"the kubelet to register Node {NODE_NAME}", registered, within=120, procs=[proc])
        # The role label is the cluster's to give (a kubelet may not set node-role.kubernetes.io/*), as kubeadm does.
        core.patch_node(NODE_NAME, {"metadata": {"labels": {CONTROL_PLANE_LABEL: ""}}})

        def ready() -> bool:
            node = core.read_node(NODE_NAME)
            return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])

        wait_until(f"Node {NODE_NAME} Ready (kubelet, containerd, CNI)", ready, within=120, procs=[proc])

    def _start_kube_proxy(self, cluster: Cluster) -> None:
        pair = cluster.pki.issue("kube-proxy", "system:kube-proxy")
        kubeconfig = pki.kubeconfig(self.dir / "kube-proxy.kubeconfig", server=cluster.server, ca=cluster.pki.cert,
                                    user="system:kube-proxy", pair=pair)  # fmt: skip
        cfg = self.dir / "kube-proxy.yaml"
        cfg.write_text(yaml.safe_dump(kube_proxy_config(kubeconfig=kubeconfig)))
        proc = self._in_netns("kube-proxy", [str(self.bins / "kube-proxy"), f"--config={cfg}", "--v=2"])

        def healthy() -> bool:
            return "services" in self.nft_table()

        wait_until("kube-proxy to write its nftables table in the node's namespace", healthy, within=90,
                   procs=[proc])  # fmt: skip

    def _start_network_policies(self, cluster: Cluster) -> None:
        """kube-network-policies in the node's namespace, as kube-proxy runs there. The kernel here has nfnetlink_queue
        and br_netfilter built in (no modules: CONFIG_MODULES is unset); the bridge's packets are sent through the IP
        hooks in this namespace only (the setting is per namespace since Linux 5.3)."""
        net = f"--net={self.layout.netns_path}"
        # Where they are modules, loading one is the machine's (kept loaded, as a CNI's DaemonSet leaves them).
        modprobe = shutil.which("modprobe")
        if modprobe and not Path("/proc/net/netfilter/nfnetlink_queue").exists():
            _sh(modprobe, "nfnetlink_queue", check=False)
        bridge_nf = _sh("nsenter", net, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1", check=False)
        if modprobe and bridge_nf.returncode != 0:  # br_netfilter not loaded: its settings appear once it is
            _sh(modprobe, "br_netfilter", check=False)
            bridge_nf = _sh("nsenter", net, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1", check=False)
        missing = [what for what, ok in (
            ("nfnetlink_queue (CONFIG_NETFILTER_NETLINK_QUEUE)", Path("/proc/net/netfilter/nfnetlink_queue").exists()),
            ("br_netfilter (CONFIG_BRIDGE_NETFILTER)", bridge_nf.returncode == 0)) if not ok]  # fmt: skip
        if missing:
            raise Unavailable("NetworkPolicy on the node needs " + " and ".join(missing))
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                        input=yaml.safe_dump_all(network_policy_rbac()))  # fmt: skip
        pair = cluster.pki.issue(NETPOL_ENGINE, NETPOL_USER)
        kubeconfig = pki.kubeconfig(self.dir / f"{NETPOL_ENGINE}.kubeconfig", server=cluster.server,
                                    ca=cluster.pki.cert, user=NETPOL_USER, pair=pair)  # fmt: skip
        proc = self._in_netns(NETPOL_ENGINE, network_policy_args(self.bins, kubeconfig=kubeconfig))

        def queueing() -> bool:
            return "queue num" in self.netpol_table() and self.netpol_queue_bound()

        wait_until(f"kube-network-policies to write its nftables table and bind nfqueue {NETPOL_QUEUE} in the node's "
                   "namespace", queueing, within=90, procs=[proc])  # fmt: skip

    # --- for a tier that attaches to the node (issue 31's machine room) ----------------------------------------------
    # The node's network namespace is `layout.netns`, a named one (/var/run/netns): a link moved into it with
    # `ip link set <dev> netns <name>` joins the node. Images reach it through the run's registry
    # (`PodStack.load_image`): an image imported with `ctr images import` was listed by containerd but never found
    # by the kubelet through CRI ("not present with pull policy of Never"), so the node pulls everything it runs.

    # --- reading -----------------------------------------------------------------------------------------------------
    def nft_table(self) -> str:
        """kube-proxy's nftables table in the node's namespace ('' before it exists)."""
        done = _sh("nsenter", f"--net={self.layout.netns_path}", "nft", "list", "table", "ip", "kube-proxy",
                   check=False)  # fmt: skip
        return done.stdout if done.returncode == 0 else ""

    def netpol_table(self) -> str:
        """kube-network-policies' nftables table in the node's namespace ('' before it exists)."""
        done = _sh("nsenter", f"--net={self.layout.netns_path}", "nft", "list", "table", "inet", NETPOL_ENGINE,
                   check=False)  # fmt: skip
        return done.stdout if done.returncode == 0 else ""

    def netpol_queue_bound(self) -> bool:
        """Whether a process listens on the engine's nfqueue in the node's namespace (its first column the queue)."""
        done = _sh("nsenter", f"--net={self.layout.netns_path}", "cat", "/proc/net/netfilter/nfnetlink_queue",
                   check=False)  # fmt: skip
        return any(line.split()[:1] == [str(NETPOL_QUEUE)] for line in done.stdout.splitlines())

    def tasks(self) -> list[str]:
        """containerd's running tasks (containers with a process), by id."""
        done = self.ctr("tasks", "ls", "-q", check=False)
        return [line.strip() for line in done.stdout.splitlines() if line.strip()]

    def dump(self, lines: int = 60) -> str:
        text = "\n".join(f"--- {p.name} ({'alive' if p.alive else 'stopped'}) {p.log}\n{p.tail(lines)}"
                         for p in self.procs)  # fmt: skip
        print(text)
        return text

    # --- stopping: leave the machine as found ------------------------------------------------------------------------
    def drain(self, within: float = 60) -> None:
        """Every Pod on the node deleted through the API at once, so the kubelet stops them and CNI lets their
        addresses go; bounded, the rest is `stop()`'s."""
        if self.cluster is None:
            return
        core: Any = k8s.CoreV1Api(self.cluster.admin)
        with contextlib.suppress(ApiException, OSError):
            pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE_NAME}").items
            for pod in pods:
                with contextlib.suppress(ApiException):
                    core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)
        end = time.monotonic() + within
        while time.monotonic() < end and self._sandbox_processes():
            time.sleep(1)

    def _sandbox_processes(self) -> list[int]:
        return self._cgroup_pids()

    def _cgroup_pids(self) -> list[int]:
        pids: set[int] = set()
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            root = hierarchy / self.layout.cgroup_root.strip("/")
            if not root.is_dir():
                continue
            for procs in root.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids.update(int(x) for x in procs.read_text().split())
        return sorted(pids)

    def _netns_pids(self) -> list[int]:
        """Processes in the node's namespace or in a Pod's (whose namespace files live under the run)."""
        try:
            target = os.stat(self.layout.netns_path).st_ino
        except OSError:
            target = -1
        pod_spaces = set()
        for mount in _mounts_under(self.dir):
            with contextlib.suppress(OSError):
                pod_spaces.add(os.stat(mount).st_ino)
        found = []
        me = os.getpid()
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            with contextlib.suppress(OSError):
                ino = os.stat(f"/proc/{entry.name}/ns/net").st_ino
                if ino == target or ino in pod_spaces:
                    found.append(int(entry.name))
        return found

    def stop(self) -> None:
        """Processes by PID (ours, then whatever is left in the node's namespaces and cgroups), mounts, the
        namespace, cgroups, and what the runtime wrote outside the run directory."""
        with contextlib.suppress(Exception):
            self.drain(within=30 if self.cluster is not None else 0)
        for proc in reversed(self.procs):
            if proc.name != "nsbridge":
                proc.stop(grace=15)
        for _ in range(10):
            left = sorted({*self._cgroup_pids(), *self._netns_pids()})
            bridge = next((p for p in self.procs if p.name == "nsbridge"), None)
            left = [p for p in left if bridge is None or bridge.popen is None or p != bridge.popen.pid]
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
        for proc in self.procs:
            proc.stop()
        for mount in sorted(_mounts_under(self.dir), key=lambda p: -len(str(p))):
            if _sh("umount", str(mount), check=False).returncode != 0:
                _sh("umount", "-l", str(mount), check=False)
        if self.layout.netns_path.exists():
            _sh("ip", "netns", "del", self.layout.netns, check=False)
        self._remove_cgroups()
        self._remove_runtime_strays()
        restore_tunables(self._tunables)

    def _remove_cgroups(self) -> None:
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            root = hierarchy / self.layout.cgroup_root.strip("/")
            if not root.is_dir():
                continue
            dirs = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            for d in [*dirs, root]:
                for _ in range(20):
                    try:
                        d.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.25)

    def _remove_runtime_strays(self) -> None:
        """The kubelet's links in /var/log/containers into this run's logs; containerd's shim socket directory
        when the run made it (shim sockets go away with their shims)."""
        if CONTAINER_LOG_LINKS.is_dir():
            for link in CONTAINER_LOG_LINKS.iterdir():
                with contextlib.suppress(OSError):
                    if link.is_symlink() and str(self.dir) in os.readlink(link):
                        link.unlink()
            if not self._log_links_dir_existed:
                with contextlib.suppress(OSError):
                    CONTAINER_LOG_LINKS.rmdir()
        # Shim sockets left by shims that were killed, and libcni's cached results of this node's Pods: what
        # appeared since the start and no live process holds (the machine is shared).
        remove_strays(self._strays_before)


def strays() -> set[Path]:
    """What the runtime (and buildah: /etc/cni/net.d/cni.lock) may write outside a run's directory, as it is now."""
    found = _tree(SHIM_SOCKETS.parent) | _tree(CNI_CACHE)
    for root in HARD_CODED:
        found |= _tree(root)
    return found


def remove_strays(before: set[Path]) -> None:
    """What appeared among `strays()` since `before` was taken and no live process holds: removed, deepest first
    (a directory only when empty)."""
    bound = _bound_unix_sockets()
    for path in sorted(strays() - before, key=lambda p: -len(p.parts)):
        if str(path) in bound:
            continue
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink()


def _tree(root: Path) -> set[Path]:
    if not root.exists():
        return set()
    return {root, *root.rglob("*")}


def _bound_unix_sockets() -> set[str]:
    """Paths of the Unix sockets some process has bound (/proc/net/unix of the machine's namespace)."""
    with contextlib.suppress(OSError):
        return {line.split()[-1] for line in Path("/proc/net/unix").read_text().splitlines()[1:]
                if len(line.split()) >= 8}  # fmt: skip
    return set()


def read_tunables() -> dict[str, str]:
    out = {}
    for name in KERNEL_TUNABLES:
        with contextlib.suppress(OSError):
            out[name] = (Path("/proc/sys") / name).read_text().strip()
    return out


def restore_tunables(values: dict[str, str]) -> None:
    """The kernel settings as they were before the kubelet started."""
    for name, value in values.items():
        path = Path("/proc/sys") / name
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                path.write_text(value)


def _mounts_under(directory: Path) -> list[Path]:
    """Mount points at or below `directory` (read from this process's mount table)."""
    prefix = str(directory.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" - ", 1)[0].split()
        if len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(Path(point))
    return found
