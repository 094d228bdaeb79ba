"""The bundled Temporal as local processes on the loopback, for the bench's rows on PostgreSQL.

The install's stack (deploy/components/temporal), built from the same manifests, as processes of this machine:

- PostgreSQL from Debian's packages at the major version the StatefulSet's image pins (`postgresql-15`), initialised
  into a directory of its own as the official image's entry point does (superuser `temporal` with a password,
  scram-sha-256 over TCP) and started with the StatefulSet's `-c` settings, on 127.0.0.1 and a free port. It
  refuses to run as root: run as `nobody` (the process's user and group set by the bench when it starts it, so the
  PID the bench holds is the postmaster's own), its data directory owned by `nobody`;
- the real `temporal-server` (its four services in one process) and `temporal-sql-tool`, as `make temporal-bins`
  (tests/realcluster/build-temporal.sh) built them: the script is asked where (`--where`), never to build;
- the schemas by the server's init container's own script (temporal-sql-tool create-database, setup-schema and
  update-schema of `temporal` and `temporal_visibility`), with its environment;
- the server's config.yaml and dynamicconfig.yaml from its ConfigMap, the template's `{{ env ... }}` rendered with
  the Deployment's environment (PostgreSQL's address and password here), then only what a run on the loopback
  needs changed: every port a free one on 127.0.0.1 (membership ports below 32768: PostgreSQL keeps them in a
  smallint), the dynamic config's path, and TLS off (the install's frontend requires mTLS; the bench measures the
  server and its database, the operator's client reaches it in plain gRPC as it reaches the dev server);
- the operator's namespace and search attributes by `homelab-autoscaler temporal-setup` with the operator's init
  container's arguments (setup-init.yaml), less the PostgreSQL password Secret (there is no Kubernetes here: the
  password is the bench's own).
"""

from __future__ import annotations

import json
import os
import pwd
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.procs import BIN, ROOT, Proc, bounded, cpu_seconds, port_open, pss_mb, rss_mb, wait_until

MANIFESTS = ROOT / "deploy" / "components" / "temporal"
SERVER_YAML = MANIFESTS / "temporal-server.yaml"
POSTGRES_YAML = MANIFESTS / "temporal-postgresql.yaml"
SETUP_YAML = MANIFESTS / "setup-init.yaml"
BUILD_TEMPORAL = ROOT / "tests" / "realcluster" / "build-temporal.sh"
DEBIAN_POSTGRES = Path("/usr/lib/postgresql")
NAMESPACE_ENV = "HOMELAB_AUTOSCALER_TEMPORAL_NAMESPACE"
BENCH_NAMESPACE = "default"  # the namespace the bench's operators, workers and client use (the settings' default)
RUN_AS = "nobody"  # PostgreSQL refuses root; nobody owns nothing else on the machine
LOOPBACK = "127.0.0.1"
MEMBERSHIP_PORT_LIMIT = 32768  # cluster_membership keeps the ports in a PostgreSQL smallint
WHERE_TIMEOUT = 30.0
INITDB_TIMEOUT = 120.0
POSTGRES_READY_TIMEOUT = 60.0
SCHEMA_TIMEOUT = 360.0  # the init container's script waits up to 5 minutes for PostgreSQL itself
SERVER_PORT_TIMEOUT = 120.0
SETUP_TIMEOUT = 180.0
SETUP_WAIT_SECONDS = 120  # temporal-setup's own wait for the frontend


class Missing(Exception):
    """What this machine lacks for the stack, in one line: the bench then runs the dev server's rows only."""


# --- the manifests ----------------------------------------------------------------------------------------------
def _documents(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise Missing(f"{path.relative_to(ROOT)} is missing (the bundled Temporal's manifests)")
    return [doc for doc in yaml.safe_load_all(path.read_text()) if isinstance(doc, dict)]


def _one(docs: list[dict[str, Any]], kind: str, path: Path) -> dict[str, Any]:
    found = [doc for doc in docs if doc.get("kind") == kind]
    if len(found) != 1:
        raise ValueError(f"{path.relative_to(ROOT)}: expected one {kind}, found {len(found)}")
    return found[0]


def _plain_env(container: dict[str, Any]) -> dict[str, str]:
    """A container's environment with a literal value (those from a Secret or the Pod are the bench's to give)."""
    return {e["name"]: str(e["value"]) for e in container.get("env") or [] if "value" in e}


@dataclass(frozen=True)
class Manifests:
    """What the bench takes from deploy/components/temporal: the server's config template and dynamic config, its
    command and environment, its init container's schema script and environment, PostgreSQL's image and settings,
    the operator's temporal-setup arguments and namespace."""

    config_template: str
    dynamic_config: str
    server_command: list[str]
    server_env: dict[str, str]
    schema_script: str
    schema_env: dict[str, str]
    postgres_image: str
    postgres_settings: list[str]  # the StatefulSet's arguments after `postgres` (`-c name=value` pairs)
    postgres_user: str
    setup_args: list[str]
    namespace: str  # the operator's Temporal namespace (the init container's HOMELAB_AUTOSCALER_TEMPORAL_NAMESPACE)

    @property
    def postgres_major(self) -> str:
        """`postgres:15.18-bookworm` -> `15`."""
        found = re.match(r"(?:.*/)?postgres:(\d+)", self.postgres_image)
        if not found:
            raise ValueError(f"{POSTGRES_YAML.relative_to(ROOT)}: cannot read a major version from image "
                             f"{self.postgres_image!r}")  # fmt: skip
        return found.group(1)


def manifests(server: Path = SERVER_YAML, postgres: Path = POSTGRES_YAML, setup: Path = SETUP_YAML) -> Manifests:
    docs = _documents(server)
    data = _one(docs, "ConfigMap", server)["data"]
    pod = _one(docs, "Deployment", server)["spec"]["template"]["spec"]
    (schema,) = [c for c in pod["initContainers"] if c["name"] == "schema"]
    (main,) = [c for c in pod["containers"] if c["name"] == "server"]
    db = _one(_documents(postgres), "StatefulSet", postgres)["spec"]["template"]["spec"]["containers"][0]
    args = [str(a) for a in db.get("args") or []]
    patches = yaml.safe_load(setup.read_text()) if setup.is_file() else None
    if not isinstance(patches, list):
        raise Missing(f"{setup.relative_to(ROOT)} is missing or not a list of patches (the operator's init container)")
    (init,) = [c for p in patches if p.get("path") == "/spec/template/spec/initContainers" for c in p["value"]
               if c["name"] == "temporal-setup"]  # fmt: skip
    return Manifests(
        config_template=data["config.yaml"],
        dynamic_config=data["dynamicconfig.yaml"],
        server_command=[str(a) for a in main["command"]],
        server_env=_plain_env(main),
        schema_script=str(schema["args"][0]),
        schema_env=_plain_env(schema),
        postgres_image=str(db["image"]),
        postgres_settings=args[1:] if args[:1] == ["postgres"] else args,
        postgres_user=_plain_env(db).get("POSTGRES_USER", "postgres"),
        setup_args=[str(a) for a in init["args"]],
        namespace=_plain_env(init).get(NAMESPACE_ENV, "default"),
    )


# --- the server's configuration -----------------------------------------------------------------------------------
TEMPLATE = re.compile(r"\{\{(.*?)\}\}")


def render(template: str, env: Mapping[str, str]) -> str:
    """The server's own rendering of its config template, for the forms the ConfigMap uses: `{{ env "X" }}`,
    `| quote`, `| default "v"` (sprig's: an empty or unset variable takes the default). Another form is one line
    naming it."""

    def one(match: re.Match[str]) -> str:
        expr = match.group(1).strip()
        head, *pipes = (shlex.split(part) for part in expr.split("|"))
        if len(head) != 2 or head[0] != "env":
            raise ValueError(f"{SERVER_YAML.relative_to(ROOT)}: the bench renders only `env \"NAME\"` lookups, "
                             f"not {{{{ {expr} }}}}")  # fmt: skip
        value = env.get(head[1], "")
        for pipe in pipes:
            if pipe == ["quote"]:
                value = json.dumps(value)
            elif len(pipe) == 2 and pipe[0] == "default":
                value = value or pipe[1]
            else:
                raise ValueError(f"{SERVER_YAML.relative_to(ROOT)}: the bench renders only `quote` and `default`, "
                                 f"not | {' '.join(pipe)} in {{{{ {expr} }}}}")  # fmt: skip
        return value

    return TEMPLATE.sub(one, template)


def loopback_config(
    template: str, env: Mapping[str, str], port: Callable[[], int], dynamic_config: Path
) -> dict[str, Any]:
    """The ConfigMap's config.yaml rendered with `env`, changed only where a run on the loopback must: each service's
    gRPC and membership port from `port()` and bound on 127.0.0.1, the metrics on 127.0.0.1, the cluster's own
    frontend address, the dynamic config's path, and no TLS."""
    config: dict[str, Any] = yaml.safe_load(render(template, env))
    config.get("global", {}).pop("tls", None)
    services = config["services"]
    for service in services.values():
        rpc = service["rpc"]
        rpc["grpcPort"], rpc["membershipPort"], rpc["bindOnIP"] = port(), port(), LOOPBACK
    prometheus = config.get("global", {}).get("metrics", {}).get("prometheus")
    if prometheus is not None:
        prometheus["listenAddress"] = f"{LOOPBACK}:{port()}"
    cluster = config["clusterMetadata"]
    cluster["clusterInformation"][cluster["currentClusterName"]]["rpcAddress"] = (
        f"{LOOPBACK}:{services['frontend']['rpc']['grpcPort']}"
    )
    config["dynamicConfigClient"]["filepath"] = str(dynamic_config)
    return config


def low_port(limit: int = MEMBERSHIP_PORT_LIMIT, taken: set[int] | None = None) -> int:
    """A free loopback port below `limit` (and below the kernel's ephemeral range, so no outgoing connection is
    handed it meanwhile): bound once to prove it free, then released."""
    taken = taken if taken is not None else set()
    for _ in range(200):
        candidate = random.randrange(20000, limit)
        if candidate in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind((LOOPBACK, candidate))
            except OSError:
                continue
        taken.add(candidate)
        return candidate
    raise RuntimeError(f"no free loopback port found below {limit} in 200 tries")


# --- the command lines --------------------------------------------------------------------------------------------
def initdb_command(pg_bin: Path, data: Path, user: str, pwfile: Path) -> list[str]:
    """As the official image's entry point initialises an empty PGDATA (tests/realcluster/addons/postgres-entrypoint.sh
    mirrors it): the superuser and its password, trust on the local socket, scram-sha-256 over TCP."""
    return [str(pg_bin / "initdb"), f"--username={user}", f"--pwfile={pwfile}", "--auth-local=trust",
            "--auth-host=scram-sha-256", "--encoding=UTF8", "--locale=C.UTF-8", "-D", str(data)]  # fmt: skip


def postgres_command(pg_bin: Path, data: Path, socket_dir: Path, port: int, settings: list[str]) -> list[str]:
    return [str(pg_bin / "postgres"), "-D", str(data), "-k", str(socket_dir), "-h", LOOPBACK, "-p", str(port),
            *settings]  # fmt: skip


def server_command(command: list[str], bins: Path, config: Path) -> list[str]:
    """The Deployment's command with the binary from `bins` and the config file written here."""
    out = [str(bins / Path(command[0]).name), *command[1:]]
    if "--config-file" not in out:
        raise ValueError(f"{SERVER_YAML.relative_to(ROOT)}: the server's command has no --config-file")
    out[out.index("--config-file") + 1] = str(config)
    return out


def setup_command(args: list[str], address: str) -> list[str]:
    """`homelab-autoscaler temporal-setup` with the operator's init container's arguments, less the Secret's."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--postgresql-secret":
            skip = True
        elif not arg.startswith("--postgresql-secret="):
            kept.append(arg)
    return [str(BIN / "homelab-autoscaler"), *kept, "--temporal-address", address,
            "--wait-seconds", str(SETUP_WAIT_SECONDS)]  # fmt: skip


# --- what the machine has -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Found:
    manifests: Manifests
    temporal_bins: Path  # the directory holding temporal-server and temporal-sql-tool
    pg_bin: Path
    run_as: str | None  # None: this process is not root, PostgreSQL runs as its user


def find() -> Found:
    """The manifests, the built binaries and PostgreSQL's, or Missing naming the first thing absent."""
    found = manifests()
    try:
        where = (
            subprocess.run(
                [str(BUILD_TEMPORAL), "--where"], capture_output=True, text=True, timeout=WHERE_TIMEOUT, check=True
            )
            .stdout.strip()
            .splitlines()[-1]
        )
    except (OSError, subprocess.SubprocessError, IndexError) as err:
        raise Missing(f"{BUILD_TEMPORAL.relative_to(ROOT)} --where did not name the Temporal binaries' directory: "
                      f"{err}") from None  # fmt: skip
    bins = Path(where) / "bin"
    for name in ("temporal-server", "temporal-sql-tool"):
        if not os.access(bins / name, os.X_OK):
            raise Missing(f"{bins / name} is not built: `make temporal-bins` builds it from go.temporal.io/server")
    if found.namespace != BENCH_NAMESPACE:
        raise Missing(f"{SETUP_YAML.relative_to(ROOT)} sets up Temporal namespace {found.namespace!r}; the bench's "
                      f"operators and floors use {BENCH_NAMESPACE!r}")  # fmt: skip
    major = found.postgres_major
    pg_bin = DEBIAN_POSTGRES / major / "bin"
    for name in ("initdb", "postgres", "pg_isready"):
        if not os.access(pg_bin / name, os.X_OK):
            raise Missing(f"PostgreSQL {major} (the install's image's version) is not installed, no {pg_bin / name}:"
                          f" apt-get install -y postgresql-{major}")  # fmt: skip
    run_as = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(RUN_AS)
        except KeyError:
            raise Missing(f"no user {RUN_AS!r} to run PostgreSQL as (it refuses root)") from None
        run_as = RUN_AS
    if shutil.which("sh") is None:
        raise Missing("no `sh` on PATH for the schema init container's script")
    return Found(found, bins, pg_bin, run_as)


# --- the stack ----------------------------------------------------------------------------------------------------
@dataclass
class Stack:
    """PostgreSQL, the schemas, temporal-server and temporal-setup, started in that order by `start()`; `stop()`
    stops both servers by PID (the server first) and removes PostgreSQL's directory unless `keep`."""

    found: Found
    workdir: Path
    keep: bool = False
    password: str = field(default_factory=lambda: secrets.token_hex(16))
    pgdir: Path | None = None
    postgres: Proc | None = None
    server: Proc | None = None
    pg_port: int = 0
    frontend_port: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.frontend_port}"

    def _own(self, path: Path) -> None:
        if self.found.run_as is not None:
            who = pwd.getpwnam(self.found.run_as)
            os.chown(path, who.pw_uid, who.pw_gid)

    async def start(self) -> Stack:
        try:
            await self._start()
        except BaseException:
            self.stop()
            raise
        return self

    async def _start(self) -> None:
        m, taken = self.found.manifests, set[int]()
        began = time.monotonic()
        # Its own directory under the system's temporary one: the bench's may be closed to other users.
        self.pgdir = Path(tempfile.mkdtemp(prefix="bench-postgresql-"))
        self._own(self.pgdir)
        data, pwfile = self.pgdir / "data", self.pgdir / "pwfile"
        pwfile.write_text(self.password + "\n")
        self._own(pwfile)
        log = self.workdir / "postgresql.log"
        initdb = Proc("initdb", initdb_command(self.found.pg_bin, data, m.postgres_user, pwfile), log,
                      user=self.found.run_as, cwd=self.pgdir).start()  # fmt: skip
        await self._finished(initdb, INITDB_TIMEOUT, f"initdb of {data}")
        pwfile.unlink()
        self.pg_port = low_port(taken=taken)
        self.postgres = Proc(
            "postgres",
            postgres_command(self.found.pg_bin, data, self.pgdir, self.pg_port, m.postgres_settings),
            log,
            user=self.found.run_as,
            stop_signal=signal.SIGINT,  #: fast shutdown (SIGTERM would wait for every client to leave)
            cwd=self.pgdir,
        ).start()
        ready = [str(self.found.pg_bin / "pg_isready"), "-q", "-h", LOOPBACK, "-p", str(self.pg_port)]
        await wait_until(
            lambda: subprocess.run(ready, check=False, timeout=10).returncode == 0 or not self._alive(self.postgres),
            timeout=POSTGRES_READY_TIMEOUT,
            what=f"PostgreSQL on {LOOPBACK}:{self.pg_port} to accept connections (pg_isready)",
            every=0.25,
        )
        self._check(self.postgres)
        self.timings["postgresql"] = time.monotonic() - began

        began = time.monotonic()
        schema_env = {**m.schema_env, "SQL_HOST": LOOPBACK, "SQL_PORT": str(self.pg_port),
                      "SQL_USER": m.postgres_user, "SQL_PASSWORD": self.password,
                      "PATH": f"{self.found.temporal_bins}:{os.environ.get('PATH', '/usr/bin:/bin')}"}  # fmt: skip
        schema = Proc("schema (the init container's script)", ["sh", "-c", m.schema_script],
                      self.workdir / "temporal-schema.log", env=schema_env).start()  # fmt: skip
        await self._finished(schema, SCHEMA_TIMEOUT, "the schema init container's script (temporal-sql-tool)")
        self.timings["schemas"] = time.monotonic() - began

        began = time.monotonic()
        env = {**m.server_env, "POD_IP": LOOPBACK, "POSTGRES_HOST": LOOPBACK, "POSTGRES_PORT": str(self.pg_port),
               "POSTGRES_USER": m.postgres_user, "POSTGRES_PWD": self.password}  # fmt: skip
        dynamic = self.workdir / "temporal-dynamicconfig.yaml"
        dynamic.write_text(m.dynamic_config)
        config = loopback_config(m.config_template, env, lambda: low_port(taken=taken), dynamic)
        self.frontend_port = int(config["services"]["frontend"]["rpc"]["grpcPort"])
        config_file = self.workdir / "temporal-config.yaml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        self.server = Proc("temporal-server", server_command(m.server_command, self.found.temporal_bins, config_file),
                           self.workdir / "temporal-server.log", env=env).start()  # fmt: skip
        await wait_until(
            lambda: port_open(self.frontend_port) or not self._alive(self.server),
            timeout=SERVER_PORT_TIMEOUT,
            what=f"temporal-server's frontend to listen on {self.address}",
            every=0.25,
        )
        self._check(self.server)
        setup = Proc("temporal-setup", setup_command(m.setup_args, self.address), self.workdir / "temporal-setup.log",
                     env={NAMESPACE_ENV: m.namespace}).start()  # fmt: skip
        await self._finished(setup, SETUP_TIMEOUT, f"homelab-autoscaler temporal-setup against {self.address}")
        self.timings["temporal-server and temporal-setup"] = time.monotonic() - began

    @staticmethod
    def _alive(proc: Proc | None) -> bool:
        return proc is not None and proc.alive

    @staticmethod
    def _check(proc: Proc) -> None:
        if not proc.alive:
            tail = proc.tail(600).strip().replace("\n", " | ")
            raise RuntimeError(f"{proc.name} exited at start (log {proc.log}): {tail}")

    @staticmethod
    async def _finished(proc: Proc, timeout: float, what: str) -> None:
        """A one-shot process, waited for with a bound; a failure is one line with its log's tail."""
        try:
            await wait_until(lambda: not proc.alive, timeout=timeout, what=what, every=0.2)
        finally:
            proc.stop()  # past the bound (or cancelled): stopped by PID
        assert proc.popen is not None
        if proc.popen.returncode != 0:
            tail = proc.tail(600).strip().replace("\n", " | ")
            raise RuntimeError(f"{what} failed with code {proc.popen.returncode} (log {proc.log}): {tail}")

    def pids(self) -> tuple[int, int]:
        assert self.server is not None and self.postgres is not None
        return self.server.pid, self.postgres.pid

    def cpu_seconds(self) -> tuple[float, float]:
        """CPU seconds so far of temporal-server and of PostgreSQL (every process of it, those ended too)."""
        server, postgres = self.pids()
        return cpu_seconds(server, reaped=True), cpu_seconds(postgres, reaped=True)

    def memory(self) -> tuple[float, float, int]:
        """temporal-server's RSS, PostgreSQL's PSS over its processes (MB), and how many processes that is."""
        server, postgres = self.pids()
        pg_mb, processes = pss_mb(postgres)
        return rss_mb(server), pg_mb, processes

    def stop(self) -> None:
        for proc in (self.server, self.postgres):  # the server first: PostgreSQL's clients gone before it stops
            if proc is not None:
                proc.stop()
        if self.pgdir is not None and not self.keep:
            shutil.rmtree(self.pgdir, ignore_errors=True)


async def started(found: Found, workdir: Path, keep: bool, timeout: float) -> Stack:
    """The stack, up within `timeout` (each step is bounded too)."""
    stack = Stack(found, workdir, keep)
    return await bounded(stack.start(), timeout=timeout, what="the bundled Temporal stack to start")
