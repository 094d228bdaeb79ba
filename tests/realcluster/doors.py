"""Trying a door from a Pod on the real node, as another tenant of the cluster would: a TCP connect (and, asked, a TLS
handshake without a client certificate) to a Service's DNS name and port, from a Pod of a given namespace with given
labels. The node enforces NetworkPolicy (tests/realcluster/node.py), so what a policy lets through is what connects.

A long-lived client Pod per (namespace, labels) is kept and reached with `kubectl exec`, one exec per try. Its image is
the operator's when the stack built it (its Python does the TCP connect and the TLS handshake and says which failed
how), busybox's otherwise (TCP only: `nc`). `forget_clients` deletes them.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.realcluster.cluster import wait_until
from tests.realcluster.node import CONTROL_PLANE_LABEL
from tests.realcluster.podstack import TOLERATE_CONTROL_PLANE, PodStack

CLIENT_PREFIX = "door-client-"
CLIENT_LABEL = "homelab-autoscaler.test/door-client"

# Run in the client Pod by the operator image's Python: one line, `<word> <detail>`. TLS 1.3 lets a client finish its
# handshake before the server has checked the client's certificate; a server that wants one says so in an alert on
# the first read, so the probe reads once (briefly) after the handshake.
PROBE = r"""
import socket, ssl, sys
host, port, tls, t = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4])
def say(word, detail=""):
    print(word, detail)
    sys.exit(0)
try:
    addr = socket.gethostbyname(host)
except OSError as e:
    say("no-dns", e)
s = socket.socket()
s.settimeout(t)
try:
    s.connect((addr, port))
except socket.timeout:
    say("timeout", f"{addr}:{port}")
except ConnectionRefusedError:
    say("refused", f"{addr}:{port}")
except OSError as e:
    say("error", e)
if not tls:
    say("ok", f"{addr}:{port}")
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
ctx.set_alpn_protocols(["h2", "http/1.1"])
try:
    c = ctx.wrap_socket(s, server_hostname=host)
except ssl.SSLError as e:
    say("tls-refused", e.reason or e)
except OSError as e:
    say("tls-error", e)
c.settimeout(min(t, 1.5))
try:
    got = c.recv(1)
except socket.timeout:
    say("ok", f"tls {c.version()} {c.selected_alpn_protocol() or ''}".strip())
except ssl.SSLError as e:
    say("tls-refused", e.reason or e)
except OSError as e:
    say("tls-error", e)
say("ok" if got else "tls-closed", f"tls {c.version()}")
"""

# busybox's nc: `nc: timed out`, `nc: can't connect to remote host (...): Connection refused`, `nc: bad address ...`.
NC_WORDS = (("timed out", "timeout"), ("refused", "refused"), ("bad address", "no-dns"), ("unreachable", "unreachable"))


@dataclass(frozen=True)
class Attempt:
    """One try, for a table: from whom, to where, what was expected and what happened."""

    source: str
    target: str
    port: int
    expected: bool
    ok: bool
    how: str

    def row(self) -> str:
        want = "open" if self.expected else "closed"
        got = "open" if self.ok else "closed"
        mark = "" if self.ok == self.expected else "  <-- UNEXPECTED"
        return f"{self.source:<34} {self.target:<34} {self.port:>5}  {want:<8} {got:<8} {self.how}{mark}"


def table(attempts: list[Attempt]) -> str:
    head = f"{'from':<34} {'to':<34} {'port':>5}  {'expected':<8} {'got':<8} how"
    return "\n".join([head, "-" * len(head), *(a.row() for a in attempts)])


def _client_name(labels: dict[str, str]) -> str:
    digest = hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:8]
    return f"{CLIENT_PREFIX}{digest}"


def _python_image(stack: PodStack) -> str:
    return stack.images.refs.get("homelab-autoscaler", "")


def client_pod(stack: PodStack, namespace: str, labels: dict[str, str], *, within: float = 120) -> str:
    """The long-lived client Pod of `namespace` with exactly `labels` (made, with its namespace, when missing), Running
    on the real node; its name."""
    core: Any = k8s.CoreV1Api(stack.cluster.admin)
    name = _client_name(labels)
    try:
        core.read_namespace(namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise
        core.create_namespace({"metadata": {"name": namespace}})
    image = _python_image(stack) or stack.images["busybox"]
    body = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {**labels, CLIENT_LABEL: "true"}},
        "spec": {"nodeSelector": {CONTROL_PLANE_LABEL: ""}, "tolerations": TOLERATE_CONTROL_PLANE,
                 "terminationGracePeriodSeconds": 0, "automountServiceAccountToken": False,
                 "containers": [{"name": "client", "image": image, "imagePullPolicy": "IfNotPresent",
                                 "command": ["sleep", "86400"]}]},
    }  # fmt: skip
    try:
        core.create_namespaced_pod(namespace, body)
    except ApiException as exc:
        if exc.status != 409:  # there already: reused
            raise

    def running() -> bool:
        pod = core.read_namespaced_pod(name, namespace)
        return bool(pod.status.phase == "Running" and pod.status.pod_ip)

    wait_until(f"the door client Pod {namespace}/{name} ({labels}) to run", running, within=within)
    return name


def try_door(stack: PodStack, namespace: str, pod_labels: dict[str, str], host: str, port: int, *, tls: bool = False,
             timeout: float = 5.0) -> tuple[bool, str]:  # fmt: skip
    """From a Pod of `namespace` labelled `pod_labels`, a TCP connect to `host:port` (a Service's DNS name, or an
    address) bounded by `timeout`, and with `tls` a TLS handshake offering no client certificate. Returns whether it
    got through, and how, in words: `ok ...`, `refused ...`, `timeout ...`, `no-dns ...`, `tls-refused <reason>`,
    `tls-closed`, `error ...`."""
    pod = client_pod(stack, namespace, pod_labels)
    if _python_image(stack):
        return probe_from(stack, namespace, pod, "client", host, port, tls=tls, timeout=timeout)
    if tls:
        raise ValueError("a TLS try needs the operator image (PodStack(with_operator_image=True)); busybox has none")
    # nc's -w bounds the connect; stdin at its end closes the connection once made.
    script = f"nc -w {max(1, round(timeout))} {shlex.quote(host)} {port} </dev/null && echo ok connected"
    done = stack.cluster.kubectl("-n", namespace, "exec", pod, "-c", "client", "--", "sh", "-c", script, check=False,
                                 timeout=timeout + 30)  # fmt: skip
    out = (done.stdout + done.stderr).strip()
    if done.returncode == 0 and "ok connected" in done.stdout:
        return True, "ok"
    for text, word in NC_WORDS:
        if text in out:
            return False, word
    return False, f"error (exit {done.returncode}): {out[-300:]}"


def probe_from(stack: PodStack, namespace: str, pod: str, container: str, host: str, port: int, *, tls: bool = False,
               timeout: float = 5.0) -> tuple[bool, str]:  # fmt: skip
    """PROBE run by the Python of `container` in `pod` (a client Pod, or any Pod whose image has Python, such as the
    operator's own, which connects as the operator does): whether it got through, and how, in words."""
    done = stack.cluster.kubectl("-n", namespace, "exec", pod, "-c", container, "--", "python", "-c", PROBE, host,
                                 str(port), "1" if tls else "0", str(timeout), check=False,
                                 timeout=timeout + 30)  # fmt: skip
    line = next((x for x in done.stdout.splitlines() if x.strip()), "")
    if not line:
        out = (done.stdout + done.stderr).strip()
        return False, f"error: the probe said nothing (exit {done.returncode}): {out[-300:]}"
    return line.split(" ", 1)[0] == "ok", line.strip()


def forget_clients(stack: PodStack, namespace: str) -> None:
    """The door client Pods of `namespace` deleted at once (not waited for)."""
    core: Any = k8s.CoreV1Api(stack.cluster.admin)
    core.delete_collection_namespaced_pod(namespace, label_selector=f"{CLIENT_LABEL}=true", grace_period_seconds=0)
