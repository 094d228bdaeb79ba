"""The product as a user gets it (`make e2e-pods`): images built here and pushed to a registry on the loopback, the
harness's control plane, a real node (tests/realcluster/node.py) beside the KWOK machines, cluster DNS and a default
StorageClass on it. What is installed on top is typed as docs/install.md types it (tests/realcluster/test_pods.py).

Each phase's time is kept and printed (`timings`).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from kubernetes import client as k8s

from homelab_autoscaler.devserver import temporal_binary
from tests.procs import free_port
from tests.realcluster import prebuild
from tests.realcluster.cluster import Cluster, bin_dir, cluster_autoscaler_binary, wait_until
from tests.realcluster.executor import Executor, Machine
from tests.realcluster.images import (
    OPERATOR_ADDS_MAX_MB,
    OPERATOR_MAX_MB,
    Builder,
    Built,
    Registry,
)
from tests.realcluster.machineroom import MachineRoom
from tests.realcluster.node import (
    CONTROL_PLANE_LABEL,
    NODE_IP,
    POD_CIDR,
    PREFIX,
    Doors,
    RealNode,
    node_bin_dir,
    remove_strays,
    require_node,
    strays,
)
from tests.realcluster.stack import Homelab, homelab_objects

if TYPE_CHECKING:
    from tests.machineroom.net import Host, Lan

NS = "homelab-autoscaler-system"
PREVIOUS = prebuild.PREVIOUS
HERE = Path(__file__).resolve().parent
ADDONS = HERE / "addons"
TOLERATE_CONTROL_PLANE = [{"key": CONTROL_PLANE_LABEL, "operator": "Exists", "effect": "NoSchedule"}]
MACHINE_ROOM = f"http://machine-room.{NS}.svc:9052"


# Run by the operator image's Python in the operator's Pod: one workflow's start and status, as JSON. With the
# Pod's Temporal client certificate when it has one (the bundled frontend requires it).
DESCRIBE_WORKFLOW = """
import asyncio, json, os, sys
from pathlib import Path
from temporalio.client import Client, TLSConfig
def tls():
    files = [os.environ.get("HOMELAB_AUTOSCALER_TEMPORAL_TLS_" + k) for k in ("CA", "CERT", "KEY")]
    if not all(files):
        return False
    ca, cert, key = (Path(f).read_bytes() for f in files)
    return TLSConfig(server_root_ca_cert=ca, client_cert=cert, client_private_key=key)
async def main():
    client = await Client.connect(os.environ["HOMELAB_AUTOSCALER_TEMPORAL_ADDRESS"], tls=tls(),
                                  namespace=os.environ.get("HOMELAB_AUTOSCALER_TEMPORAL_NAMESPACE", "default"))
    described = await client.get_workflow_handle(sys.argv[1]).describe()
    print(json.dumps({"startTime": described.start_time.isoformat(), "status": described.status.name}), flush=True)
asyncio.run(main())
os._exit(0)  # as the CLI leaves (cli._finish): the SDK's runtime may crash tearing down a TLS connection at exit
"""


@dataclass
class Images:
    """The run's image references, as Pods name them (the run's registry)."""

    registry: str
    refs: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> str:
        return self.refs[name]


@dataclass
class LogKeeper:
    """Copies what the node's containers print, as it grows, to a directory that outlives their Pods: the kubelet
    removes a Pod's logs with the Pod, and the story replaces the operator's and cluster-autoscaler's Pods."""

    source: Path
    dest: Path
    every: float = 2.0
    _offsets: dict[Path, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def copy(self) -> None:
        """One pass: each log's new bytes appended to its copy (`<namespace>_<pod>/<container>.log`)."""
        for log in self.source.glob("*/*/*.log"):
            pod_dir, container = log.parent.parent.name, log.parent.name
            target = self.dest / pod_dir.rsplit("_", 1)[0] / f"{container}.log"
            with contextlib.suppress(OSError):
                size = log.stat().st_size
                done = self._offsets.get(log, 0)
                if size <= done:
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with log.open("rb") as src, target.open("ab") as out:
                    src.seek(done)
                    out.write(src.read(size - done))
                self._offsets[log] = size

    def start(self) -> LogKeeper:
        def run() -> None:
            while not self._stop.wait(self.every):
                self.copy()

        self._thread = threading.Thread(target=run, name="log-keeper", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.copy()

    def tails(self, lines: int, *, names: tuple[str, ...]) -> str:
        """The last lines of each kept log whose Pod's name holds one of `names`."""
        out = []
        for log in sorted(self.dest.glob("*/*.log")):
            if any(n in log.parent.name for n in names):
                text = log.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {log.parent.name}/{log.name} (kept)\n" + "\n".join(text))
        return "\n".join(out)


@dataclass
class PodStack:
    dir: Path
    with_operator_image: bool = True
    prefix: str = PREFIX  # of the node's network namespace and cgroups: a tier's own, on a shared machine
    timings: dict[str, float] = field(default_factory=dict)
    builder: Builder = field(init=False)
    registry: Registry = field(init=False)
    cluster: Cluster = field(init=False)
    node: RealNode = field(init=False)
    images: Images = field(init=False)
    built: dict[str, Built] = field(default_factory=dict)
    machine_room_port: int = field(default_factory=free_port)
    room: MachineRoom | None = None
    previous_commit: str | None = None
    logs: LogKeeper | None = None
    _strays_before: set[Path] | None = None  # what the runtime and buildah had written outside the run, at start()

    def __post_init__(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        require_node()
        self.builder = Builder(self.dir / "images")
        self.registry = Registry(self.dir / "registry")
        self.images = Images(self.registry.address)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = time.monotonic() - began
            print(f"phase {name}: {self.timings[name]:.0f} s", flush=True)

    # --- images ---------------------------------------------------------------------------------------------------
    def build_images(self) -> None:
        """Every image this run needs, from the cache or built now."""
        nb = node_bin_dir()
        b = self.builder
        self.built["pause"] = b.from_binary("pause", nb / "pause", at="/pause", entrypoint=["/pause"])
        self.built["busybox"] = b.busybox()
        self.built["coredns"] = b.from_binary("coredns", nb / "coredns", at="/coredns", entrypoint=["/coredns"])
        self.built["local-path-provisioner"] = b.from_binary(
            "local-path-provisioner", nb / "local-path-provisioner", at="/usr/bin/local-path-provisioner",
            entrypoint=[])  # fmt: skip
        ca, _ = cluster_autoscaler_binary()
        if ca is not None:
            # The upstream image's layout: the binary at /cluster-autoscaler, run as ./cluster-autoscaler from /.
            self.built["cluster-autoscaler"] = b.from_binary("cluster-autoscaler", ca, at="/cluster-autoscaler",
                                                             entrypoint=[])  # fmt: skip
        if self.with_operator_image:
            # The bundled Temporal's official images, as same-version stand-ins (images.py says how each is made).
            temporal = temporal_bin_dir()
            self.built["temporal-server"] = b.temporal_server(temporal)
            self.built["temporal-admin-tools"] = b.temporal_admin_tools(temporal, Path(temporal_binary()))
            self.built["temporal-ui"] = b.temporal_ui(temporal)
            # The operator's image for both platforms under one tag (issue 42), the previous release's, and the
            # bases they stand on: built ahead by .ci/run when it can (tests/realcluster/prebuild.py).
            operators = prebuild.operator_images(b, self.dir)
            self.built.update(operators.built)
            self.previous_commit = operators.previous_commit
            for platform, mb, added in b.say_sizes(self.built["homelab-autoscaler"], operators.bases):
                assert mb <= OPERATOR_MAX_MB and added <= OPERATOR_ADDS_MAX_MB, (
                    f"the operator's {platform} image is {mb:.1f} MB, {added:.1f} MB over its base: issue 42 bounds "
                    f"them at {OPERATOR_MAX_MB} and {OPERATOR_ADDS_MAX_MB} MB (tools/slim_venv.py says what it left)"
                )
            for each in operators.members:  # the foreign one under emulation: what the build made runs there
                said = b.run_in(each, "sh", "-c", "echo $(uname -m): $(homelab-autoscaler --version)")
                print(f"image homelab-autoscaler {each.platform} runs: {said}", flush=True)

    def push_images(self) -> None:
        for name, built in self.built.items():
            if name == "python-base":
                continue
            # The previous release is another tag of the same repository, as a registry holds releases.
            repository = "homelab-autoscaler" if name == PREVIOUS else name
            tag = built.local.rsplit(":", 1)[1]
            ref = f"{self.registry.address}/{repository}:{tag}"
            if not self.registry.has(repository, tag):  # the registry's storage outlives the run: pushed before
                self.builder.push(built, ref)
            self.images.refs[name] = ref

    # --- start and stop -------------------------------------------------------------------------------------------
    def start(self) -> PodStack:
        self._strays_before = strays()
        try:
            with self.phase("images"):
                self.build_images()
            with self.phase("registry and push"):
                self.registry.start()
                self.push_images()
            with self.phase("control plane and real node"):
                self.cluster = Cluster(self.dir / "cluster", bins=bin_dir())
                doors = Doors(api_port=self.cluster.port, registry=self.registry.address,
                              machine_room_port=self.machine_room_port)  # fmt: skip
                self.node = RealNode(self.dir / "node", doors, sandbox_image=self.images["pause"], prefix=self.prefix)
                self.cluster.apiserver_extra_args += self.node.prepare(self.cluster.pki)
                self.cluster.start()
                self.node.start(self.cluster)
                self.logs = LogKeeper(self.node.layout.pod_logs, self.dir / "kept-logs").start()
            with self.phase("cluster DNS"):
                self.install_dns()
        except BaseException:
            self.dump()
            self.stop()
            raise
        return self

    def load_image(self, archive: Path, name: str, *, all_platforms: bool = False) -> str:
        """An image archive (OCI, or docker's) put where the node pulls from, as `<registry>/<name>`: the reference a
        Pod names. For a tier that brings images of its own (issue 31's machine room). `all_platforms`: the archive
        holds an index, copied whole."""
        with tarfile.open(archive) as tar:
            transport = "oci-archive" if "index.json" in {m.name.lstrip("./") for m in tar.getmembers()} else \
                "docker-archive"  # fmt: skip
        ref = f"{self.registry.address}/{name}"
        every = ["--all"] if all_platforms else []
        done = subprocess.run(["skopeo", "copy", "--quiet", *every, "--dest-tls-verify=false", f"{transport}:{archive}",
                               f"docker://{ref}"], capture_output=True, text=True, timeout=600)  # fmt: skip
        if done.returncode != 0:
            raise AssertionError(f"skopeo copy of {archive} to {ref} failed ({done.returncode}): {done.stderr[-2000:]}")
        return ref

    def describe_claim(self, name: str) -> dict[str, Any]:
        """A claim's workflow as Temporal describes it (`startTime`, `status`), asked from the operator's Pod with the
        SDK its image carries (the image has no `temporal` CLI, issue 42; Temporal's frontend takes no other Pod)."""
        exec_ = ["-n", NS, "exec", "deployment/homelab-autoscaler", "-c", "homelab-autoscaler", "--"]
        described = self.cluster.kubectl(*exec_, "python", "-c", DESCRIBE_WORKFLOW, f"nodeclaim/{NS}/{name}").stdout
        return dict(json.loads(described))

    def join_lan(self, lan: Lan, name: str = "k8s-node") -> Host:
        """The real node joins a machine room's LAN (issue 31's, tests/machineroom): an interface on it in the node's
        namespace, hostNetwork Pods broadcast there, the pod network is masqueraded onto it. Its address is on the
        returned host; the node's namespace still routes nowhere else."""
        return lan.join(name, self.node.layout.netns, masquerade=POD_CIDR)

    def start_machine_room(self, machines: dict[str, Machine]) -> MachineRoom:
        """The machine room on the loopback (its port was the node's door since the start)."""
        executor = Executor(self.cluster, NS, machines)
        self.room = MachineRoom(executor, port=self.machine_room_port).start()
        return self.room

    def stop(self) -> None:
        if self.logs is not None:
            self.logs.stop()
            self.logs = None
        if self.room is not None:
            self.room.stop()
            self.room = None
        with contextlib.suppress(AttributeError):
            for kubelet in list(self.cluster.kubelets):
                self.cluster.stop_kubelet(kubelet)
        with contextlib.suppress(AttributeError):
            self.node.stop()
        with contextlib.suppress(AttributeError):
            self.cluster.stop()
        with contextlib.suppress(AttributeError):
            self.registry.stop()
        if self._strays_before is not None:  # buildah's lock under /etc/cni, made before the node's own record
            remove_strays(self._strays_before)

    def dump(self, lines: int = 60) -> None:
        if self.logs is not None:
            self.logs.copy()
            print(self.logs.tails(lines, names=("homelab-autoscaler", "cluster-autoscaler", "temporal")))
        with contextlib.suppress(AttributeError):
            self.cluster.dump(lines)
        with contextlib.suppress(AttributeError):
            self.node.dump(lines)
        with contextlib.suppress(AttributeError):
            print(f"--- registry\n{self.registry.proc.tail(lines) if self.registry.proc else ''}")

    # --- what the cluster runs besides the product -----------------------------------------------------------------
    def apply(self, docs: list[dict[str, Any]]) -> None:
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                             input=yaml.safe_dump_all(docs))  # fmt: skip

    def install_dns(self) -> None:
        text = (ADDONS / "coredns.yaml").read_text().replace("image: IMAGE", f"image: {self.images['coredns']}")
        self.apply([d for d in yaml.safe_load_all(text) if d])
        self.rollout("kube-system", "deployment/coredns")
        # Ready is not yet routed: kube-proxy programs the Service's endpoint a moment later (a Pod asking at once
        # got "connection refused", the reject of a Service without endpoints).
        core: Any = k8s.CoreV1Api(self.cluster.admin)

        def routed() -> bool:
            ips = [p.status.pod_ip for p in core.list_namespaced_pod("kube-system", label_selector="k8s-app=kube-dns")
                   .items if p.status.pod_ip]  # fmt: skip
            table = self.node.nft_table()
            return bool(ips) and all(ip in table for ip in ips)

        wait_until("kube-proxy to route the cluster DNS Service to CoreDNS", routed, within=60)

    def install_storage(self) -> None:
        """local-path-provisioner as its README installs it (its own manifest), with three changes a user of this
        cluster makes too: the images renamed to the run's registry, its volumes under the run directory, and the
        Deployment pinned to the control plane (it tolerates the taint; the machines may be powered off)."""
        docs = [d for d in yaml.safe_load_all((node_bin_dir().parent / "local-path-storage.yaml").read_text()) if d]
        for doc in docs:
            if doc["kind"] == "Deployment":
                spec = doc["spec"]["template"]["spec"]
                spec["containers"][0]["image"] = self.images["local-path-provisioner"]
                spec["nodeSelector"] = {CONTROL_PLANE_LABEL: ""}
                spec["tolerations"] = TOLERATE_CONTROL_PLANE
            if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "local-path-config":
                data = doc["data"]
                data["config.json"] = json.dumps(
                    {
                        "nodePathMap": [
                            {"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": [str(self.node.layout.storage)]}
                        ]
                    }
                )
                data["helperPod.yaml"] = data["helperPod.yaml"].replace(
                    "image: busybox", f"image: {self.images['busybox']}"
                )
        self.node.layout.storage.mkdir(parents=True, exist_ok=True)
        self.apply(docs)
        self.rollout("local-path-storage", "deployment/local-path-provisioner")

    def overlay(self, name: str, base: Path, images: dict[str, str], patches: list[dict[str, Any]] | None = None,
                ) -> Path:  # fmt: skip
        """A kustomization of the run's own on top of one of deploy/'s, as docs/install.md has a user write one:
        `images:` entries renaming the released images to the run's (and `patches`, where a step says why)."""
        directory = self.dir / "overlays" / name
        directory.mkdir(parents=True, exist_ok=True)
        doc: dict[str, Any] = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [os.path.relpath(base, directory)],
            "images": [{"name": old, "newName": new.rsplit(":", 1)[0], "newTag": new.rsplit(":", 1)[1]}
                       for old, new in images.items()],
        }  # fmt: skip
        if patches:
            doc["patches"] = patches
        (directory / "kustomization.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        return directory

    def rollout(self, namespace: str, what: str, timeout: str = "300s") -> None:
        self.cluster.kubectl("-n", namespace, "rollout", "status", what, f"--timeout={timeout}",
                             timeout=float(timeout.rstrip("s")) + 30)  # fmt: skip

    def run_pod(self, name: str, script: str, *, namespace: str = "default", within: float = 120,
                image: str = "", pull: str = "IfNotPresent") -> str:  # fmt: skip
        """A Pod on the real node running `script` in busybox (or `image`); its phase and log once it ends."""
        core: Any = k8s.CoreV1Api(self.cluster.admin)
        body = {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"restartPolicy": "Never", "nodeSelector": {CONTROL_PLANE_LABEL: ""},
                     "tolerations": TOLERATE_CONTROL_PLANE, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "sh", "image": image or self.images["busybox"], "imagePullPolicy": pull,
                                     "command": ["sh", "-c", script]}]},
        }  # fmt: skip
        core.create_namespaced_pod(namespace, body)

        def ended() -> str:
            phase = core.read_namespaced_pod(name, namespace).status.phase
            return str(phase) if phase in ("Succeeded", "Failed") else ""

        phase = wait_until(f"Pod {namespace}/{name} to end", ended, within=within)
        log = self.cluster.kubectl("-n", namespace, "logs", name).stdout
        return f"{phase}\n{log}"


def temporal_bin_dir() -> Path:
    """The bundled Temporal's programs (`make temporal-bins`), built when missing: a run of the Pods tier needs them."""
    script = HERE / "build-temporal.sh"
    done = subprocess.run([str(script)], capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise AssertionError(f"{script} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


# Each official image of deploy/components/temporal, and the stand-in of this run that replaces it.
TEMPORAL_IMAGES = {"temporalio/server": "temporal-server", "temporalio/admin-tools": "temporal-admin-tools",
                   "temporalio/ui": "temporal-ui", "postgres": "postgresql"}  # fmt: skip


def temporal_images(s: PodStack) -> dict[str, str]:
    """The `images:` renames an overlay of the run makes, official name → the run's stand-in."""
    return {official: s.images[name] for official, name in TEMPORAL_IMAGES.items()}


# --- the power Jobs' side of the machine room ------------------------------------------------------------------------
def power_spec(s: PodStack, operation: str) -> dict[str, Any]:
    """A slot's power pod spec as a user writes one: busybox's wget calls the machine room (a BMC's API) through
    its Service; an answer other than 200 fails the Job with exit code 3 and says so in the termination message."""
    script = (
        f'wget -q -O - --post-data= "{MACHINE_ROOM}/machines/$HOMELAB_SLOT/{operation}" '
        f'|| {{ echo "the BMC of $HOMELAB_SLOT did not answer" > /dev/termination-log; exit 3; }}'
    )
    return {
        "image": s.images["busybox"],
        "command": ["sh", "-c", script],
        "nodeSelector": {CONTROL_PLANE_LABEL: ""},
        "tolerations": TOLERATE_CONTROL_PLANE,
        "activeDeadlineSeconds": 120,
        "backoffLimit": 0,
        # Longer than any outage of the story (docs/operations.md, "Its Job is gone"; the power examples keep an hour).
        "ttlSecondsAfterFinished": 600,
    }


def machine_room_service(port: int) -> list[dict[str, Any]]:
    """The Service the power Jobs call, its endpoint the node's door to the machine room on the loopback."""
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "machine-room", "namespace": NS},
         "spec": {"ports": [{"name": "http", "port": 9052, "targetPort": port}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "machine-room", "namespace": NS,
                      "labels": {"kubernetes.io/service-name": "machine-room"}},
         "addressType": "IPv4", "endpoints": [{"addresses": [NODE_IP]}],
         "ports": [{"name": "http", "port": port, "protocol": "TCP"}]},
    ]  # fmt: skip


def powered(s: PodStack, homelab: Homelab) -> list[dict[str, Any]]:
    """The Groups and slots a user applies for `homelab`, each slot's power Jobs calling the machine room."""
    docs = homelab_objects(homelab)
    for doc in docs:
        if doc["kind"] == "Node":
            doc["spec"]["startupPodSpec"] = power_spec(s, "on")
            doc["spec"]["shutdownPodSpec"] = power_spec(s, "off")
    return docs
