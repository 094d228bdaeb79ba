"""Every image the real node runs, built here as a user builds them (no public registry is reachable), cached by
content, and pushed to a registry of the run's own on the loopback (Debian's docker-registry).

- the operator: the repository's Dockerfile, unchanged, with `buildah bud`, its PYTHON_IMAGE a base made from
  Debian's packages with mmdebstrap (python3, python3-venv, ca-certificates, passwd), with the official image's
  PATH. pip in the build verifies PyPI with the machine's CA bundle, mounted for the build only (no layer keeps it);
- from one static binary each: the Pod sandbox (pause), CoreDNS, local-path-provisioner, cluster-autoscaler;
- busybox from Debian's busybox-static: local-path-provisioner's helper Pods and the power Jobs' tool.

An image's tag is a digest of what goes into it (the files the Dockerfile copies, a binary's bytes, the recipe),
so a change is a new image and an unchanged one is never rebuilt. Images live in buildah's store under
~/.cache/homelab-autoscaler/images (or $HOMELAB_IMAGE_CACHE).
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests import binfmt
from tests.machineroom import power_images
from tests.procs import ROOT, free_port
from tests.realcluster.cluster import Proc, wait_until

_XDG_CACHE = Path(os.environ.get("XDG_CACHE_HOME", "") or Path.home() / ".cache")
CACHE = Path(os.environ.get("HOMELAB_IMAGE_CACHE", "") or _XDG_CACHE / "homelab-autoscaler" / "images")
MACHINE_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# What python:3.11-slim-bookworm gives the Dockerfile: an interpreter with venv, CA certificates, groupadd/useradd.
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates", "passwd")
# Issue 42's bounds on the operator's image, each platform: in all, and what the Dockerfile adds to its base.
OPERATOR_MAX_MB, OPERATOR_ADDS_MAX_MB = 250, 120
OFFICIAL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BUSYBOX_APPLETS = ("sh", "mkdir", "rm", "rmdir", "sleep", "cat", "echo", "wget", "ls", "test", "[", "true", "false",
                   "env", "printf", "chmod", "nc", "id", "date", "hostname", "nslookup")  # fmt: skip
# A recipe's version: bump it when the way an image is made changes, and every image of that recipe is rebuilt.
RECIPE = "hlas-images-2"
# The official Temporal images' user, as their /etc/passwd and /etc/group say it: Go's os/user (the server's
# OpenTelemetry resource detection calls user.Current) fails without an entry for the uid the Pod runs as.
TEMPORAL_PASSWD = "root:x:0:0:root:/root:/sbin/nologin\ntemporal:x:1000:1000:temporal:{home}:/sbin/nologin\n"
TEMPORAL_GROUP = "root:x:0:\ntemporal:x:1000:\n"


class Unavailable(RuntimeError):
    """A tool the images need is missing: the tier skips, naming it."""


def require_tools() -> None:
    missing = [f"{t} (apt-get install {p})" for t, p in (("buildah", "buildah"), ("mmdebstrap", "mmdebstrap"),
               ("docker-registry", "docker-registry"), ("skopeo", "skopeo")) if shutil.which(t) is None]  # fmt: skip
    if not Path("/bin/busybox").exists():
        missing.append("/bin/busybox (apt-get install busybox-static)")
    if missing:
        raise Unavailable("the images need: " + "; ".join(missing))


# --- content keys (pure: tests/test_realnode.py) ----------------------------------------------------------------------
def dockerfile_inputs(dockerfile: str) -> list[str]:
    """The context paths a Dockerfile's COPY and ADD lines read (a `--from=` copy reads a stage, not the context)."""
    paths: list[str] = []
    for line in dockerfile.replace("\\\n", " ").splitlines():
        if line.strip().split(" ", 1)[0].upper() not in ("COPY", "ADD"):
            continue
        words = shlex.split(line.strip())
        args = [w for w in words[1:] if not w.startswith("--")]
        if any(w.startswith("--from") for w in words[1:]) or len(args) < 2:
            continue
        paths += [a.rstrip("/") for a in args[:-1]]
    return paths


def ignored(rel: str, patterns: Iterable[str]) -> bool:
    """A .dockerignore match: a pattern matches the path or one of its parent directories (`**/` any depth)."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pat in patterns:
        pat = pat.strip().rstrip("/")
        if not pat or pat.startswith("#"):
            continue
        if pat.startswith("**/"):
            tail = pat[3:]
            if any(fnmatch.fnmatch(part, tail) for part in parts):
                return True
        elif any(fnmatch.fnmatch(prefix, pat) for prefix in prefixes):
            return True
    return False


def context_files(root: Path, dockerfile: str, ignore: Iterable[str] = ()) -> list[Path]:
    """Every file of the build context a Dockerfile copies, minus .dockerignore's, sorted."""
    pats = list(ignore)
    files: set[Path] = set()
    for rel in dockerfile_inputs(dockerfile):
        p = root / rel
        candidates: Iterator[Path] = p.rglob("*") if p.is_dir() else iter([p])
        for f in candidates:
            if f.is_file() and not ignored(f.relative_to(root).as_posix(), pats):
                files.add(f)
    return sorted(files)


def content_key(*parts: bytes | str | Path) -> str:
    """A digest of what goes into an image: bytes, strings, and files (by their path and content). A path into this
    checkout counts from the checkout, so every clone has the same keys: CI clones afresh each run, and a key that
    named the clone's directory missed the cache every time (the stand-in bases and the operator's images)."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            h.update(_in_checkout(str(part)).encode() + b"\0")
            h.update(part.read_bytes())
        elif isinstance(part, str):
            h.update(_in_checkout(part).encode())
        else:
            h.update(part)
        h.update(b"\0\0")
    return h.hexdigest()[:16]


def _in_checkout(text: str) -> str:
    return text.replace(str(ROOT), "<checkout>")


# An image's recipe: given the local name, it builds the image under that name.
Build = Callable[[str], None]


def image_inputs(root: Path) -> list[str]:
    """What decides the operator's image: its Dockerfile, .dockerignore, and what the Dockerfile copies."""
    return ["Dockerfile", ".dockerignore", *dockerfile_inputs((root / "Dockerfile").read_text())]


def previous_image_commit(root: Path = ROOT, *, depth: int = 200) -> str | None:
    """The nearest commit before HEAD (first parents: the previous releases of a branch) whose image differs from
    the checkout's; None when the history has none (a shallow clone). An upgrade from it changes the image."""
    inputs = image_inputs(root)
    listed = subprocess.run(["git", "rev-list", "--first-parent", f"--max-count={depth}", "HEAD~1", "--"],
                            cwd=root, capture_output=True, text=True, timeout=60)  # fmt: skip
    if listed.returncode != 0:
        return None
    for commit in listed.stdout.split():
        # Against the working tree: the current image is built from it, committed or not.
        same = subprocess.run(["git", "diff", "--quiet", commit, "--", *inputs], cwd=root, timeout=60)
        if same.returncode == 1:
            return commit
    return None


def resolve_commit(ref: str, root: Path = ROOT) -> str:
    """A commit named by a ref of the repository (a hash, a tag, `main~3`), or ValueError naming it."""
    done = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=root,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    if done.returncode != 0:
        raise ValueError(f"HOMELAB_E2E_PREVIOUS={ref}: no such commit in {root}")
    return done.stdout.strip()


def export_commit(commit: str, dest: Path, root: Path = ROOT) -> Path:
    """The commit's files (`git archive`) in `dest`, as a checkout of it would have them."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=root, capture_output=True,
                             timeout=300, check=True).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest


# --- building ---------------------------------------------------------------------------------------------------------
@dataclass
class Built:
    """An image in the cache: its local name, whether this run built it, and how long that took; an index (one tag,
    several platforms) lists its members."""

    name: str
    local: str
    built: bool
    seconds: float
    platform: str = "linux/amd64"
    members: tuple[Built, ...] = ()

    @property
    def is_index(self) -> bool:
        return bool(self.members)


@dataclass
class Builder:
    """buildah with its store in the cache; each image built once per content key."""

    run_dir: Path
    cache: Path = CACHE
    log: list[Built] = field(default_factory=list)

    def __post_init__(self) -> None:
        require_tools()
        self.cache.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def _buildah(self, *args: str) -> list[str]:
        """buildah with its store in the cache and its run state under the run."""
        return ["buildah", "--root", str(self.cache / "storage"), "--runroot", str(self.run_dir / "buildah-run"),
                "--storage-driver", "overlay", *args]  # fmt: skip

    def buildah(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(self._buildah(*args), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        if done.returncode != 0:
            raise AssertionError(f"buildah {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
        return done

    def buildah_ok(self, *args: str) -> bool:
        """Whether a buildah command succeeds (an image or a manifest list is in the store)."""
        return subprocess.run(self._buildah(*args), capture_output=True, timeout=120).returncode == 0

    def has(self, local: str) -> bool:
        return self.buildah_ok("inspect", "--type", "image", local)

    def ensure(self, name: str, key: str, build: Build, note: str = "", platform: str = "linux/amd64") -> Built:
        """`localhost/hlas/<name>:<key>`, built by `build(local)` unless the store has it; `note` says which."""
        local = f"localhost/hlas/{name}:{key}"
        began = time.monotonic()
        if self.has(local):
            result = Built(name, local, False, time.monotonic() - began, platform)
        else:
            build(local)
            result = Built(name, local, True, time.monotonic() - began, platform)
        self.log.append(result)
        print(f"image {name}{note} {platform}: {'built in' if result.built else 'cached'} {result.seconds:.0f} s "
              f"({local})", flush=True)  # fmt: skip
        return result

    def size(self, built: Built) -> int:
        """The image's size unpacked: its layers' sum, as `buildah images` and `docker images` count it (the tar of
        each layer, read from the store's layer list)."""
        config = json.loads(self.buildah("inspect", "--type", "image", built.local).stdout)
        listed = json.loads((self.cache / "storage" / "overlay-layers" / "layers.json").read_text())
        sizes = {layer.get("diff-digest"): int(layer.get("diff-size", 0)) for layer in listed}
        return sum(sizes[d] for d in config["OCIv1"]["rootfs"]["diff_ids"])

    # --- the recipes ------------------------------------------------------------------------------------------------
    def from_binary(self, name: str, binary: Path, *, at: str, entrypoint: list[str], workdir: str = "/",
                    user: str = "") -> Built:  # fmt: skip
        """A scratch image holding one static binary."""
        key = content_key(RECIPE, name, at, " ".join(entrypoint), workdir, user, binary)

        def build(local: str) -> None:
            ctr = self.buildah("from", "scratch").stdout.strip()
            try:
                self.buildah("copy", "--chmod", "0755", ctr, str(binary), at)
                cfg = ["config", "--entrypoint", _json(entrypoint), "--cmd", "", "--workingdir", workdir]
                if user:
                    cfg += ["--user", user]
                self.buildah(*cfg, ctr)
                self.buildah("commit", "--rm", ctr, local)
            except BaseException:
                self.buildah("rm", ctr)
                raise

        return self.ensure(name, key, build)

    def busybox(self) -> Built:
        """Debian's busybox-static with the applets the helper Pods and the power tool use."""
        binary = Path("/bin/busybox")
        key = content_key(RECIPE, "busybox", " ".join(BUSYBOX_APPLETS), binary)

        def build(local: str) -> None:
            rootfs = self.run_dir / "busybox-rootfs"
            shutil.rmtree(rootfs, ignore_errors=True)
            (rootfs / "bin").mkdir(parents=True)
            (rootfs / "tmp").mkdir(mode=0o1777)
            shutil.copy2(binary, rootfs / "bin" / "busybox")
            for applet in BUSYBOX_APPLETS:
                (rootfs / "bin" / applet).symlink_to("busybox")
            ctr = self.buildah("from", "scratch").stdout.strip()
            try:
                self.buildah("copy", ctr, str(rootfs), "/")
                self.buildah("config", "--entrypoint", "", "--cmd", '["sh"]', "--env", "PATH=/bin", ctr)
                self.buildah("commit", "--rm", ctr, local)
            except BaseException:
                self.buildah("rm", ctr)
                raise
            finally:
                shutil.rmtree(rootfs, ignore_errors=True)

        return self.ensure("busybox", key, build)

    def python_base(self, platform: str = "linux/amd64") -> Built:
        """What python:3.11-slim-bookworm is to the Dockerfile, from Debian's packages (mmdebstrap, by the official
        slim image's recipe), keyed by the packages' candidate versions in the machine's apt sources. A foreign
        platform's maintainer scripts run under emulation (tests/binfmt.py)."""
        arch = platform.split("/")[1]
        versions = _candidate_versions(BASE_PACKAGES)
        # debian:bookworm-slim's recipe, the power images' stand-in base's (tests/machineroom/power_images.py), with
        # the packages the Python image adds.
        recipe = power_images.base_args(arch)
        key = content_key(RECIPE, "python-base", platform, OFFICIAL_PATH, *recipe, power_images.HOOK,
                          *[f"{p}={v}" for p, v in versions.items()])  # fmt: skip

        def build(local: str) -> None:
            tar = self.run_dir / f"python-base-{arch}.tar"
            _mmdebstrap([*recipe, "--include=" + ",".join(BASE_PACKAGES), "--aptopt=Acquire::Retries=3",
                         "bookworm", str(tar)])  # fmt: skip
            ctr = self.buildah("from", "--arch", arch, "scratch").stdout.strip()
            try:
                self.buildah("add", ctr, str(tar), "/")
                self.buildah("config", "--arch", arch, "--os", "linux", "--env", f"PATH={OFFICIAL_PATH}",
                             "--env", "LANG=C.UTF-8", "--cmd", '["python3"]', ctr)  # fmt: skip
                self.buildah("commit", "--rm", ctr, local)
            except BaseException:
                self.buildah("rm", ctr)
                raise
            finally:
                tar.unlink(missing_ok=True)

        with _emulating(platform):
            return self.ensure("python-base", key, build, platform=platform)

    def operator(self, source: Path = ROOT, *, base: Built, note: str = "", builder_base: Built | None = None) -> Built:
        """The repository's Dockerfile, unchanged, built with `buildah bud` on the Debian base for the base's
        platform; the machine's CA bundle is mounted for the build only (pip verifies PyPI through it). For another
        platform than the machine's, `builder_base` is the machine's base, which the Dockerfile's build stages run
        on (`BUILD_PYTHON_IMAGE`: the stand-in bases are one platform each, where the official image is an index)."""
        dockerfile = (source / "Dockerfile").read_text()
        ignore_file = source / ".dockerignore"
        ignore = ignore_file.read_text().splitlines() if ignore_file.exists() else []
        files = context_files(source, dockerfile, ignore)
        # Debian's buildah (1.28) sets TARGETARCH but not BUILDPLATFORM, which BuildKit and later buildah set.
        builder = [
            "--build-arg",
            f"BUILDPLATFORM=linux/{machine_arch()}",
            "--build-arg",
            f"TARGETPLATFORM={base.platform}",
            "--build-arg",
            f"TARGETARCH={base.platform.split('/')[1]}",
        ]
        if builder_base is not None:
            builder += ["--build-arg", f"BUILD_PYTHON_IMAGE={builder_base.local}"]
        key = content_key(RECIPE, "operator", base.local, base.platform, *builder, dockerfile, *[
            str(f.relative_to(source)).encode() + b"\0" + f.read_bytes() for f in files])  # fmt: skip

        def build(local: str) -> None:
            args = ["bud", "--layers", "--network", "host", "--platform", base.platform, "--build-arg",
                    f"PYTHON_IMAGE={base.local}", *builder, "-t", local, "-f", str(source / "Dockerfile")]  # fmt: skip
            if MACHINE_CA_BUNDLE.exists():
                args += ["--volume", f"{MACHINE_CA_BUNDLE}:/etc/ssl/certs/ca-certificates.crt:ro"]
            self.buildah(*args, str(source), timeout=3600)

        with _emulating(base.platform):
            return self.ensure("homelab-autoscaler", key, build, note, platform=base.platform)

    def index(self, name: str, members: list[Built]) -> Built:
        """One tag for the members' platforms: an OCI image index (`buildah manifest`), as a multi-platform image is
        pushed to a registry."""
        key = content_key(RECIPE, "index", *[f"{m.platform}={m.local}" for m in members])
        local = f"localhost/hlas/{name}:{key}"
        began = time.monotonic()
        exists = self.buildah_ok("manifest", "inspect", local)
        if not exists:
            self.buildah("manifest", "create", local)
            for m in members:
                self.buildah("manifest", "add", local, m.local)
        result = Built(name, local, not exists, time.monotonic() - began, ",".join(m.platform for m in members),
                       tuple(members))  # fmt: skip
        print(f"image {name} index of {result.platform} ({local})", flush=True)
        return result

    def say_sizes(self, built: Built, bases: list[Built] | None = None) -> list[tuple[str, float, float]]:
        """`image <name> <platform> <MB> MB` per platform of an image (issue 42's line), with the base's share; per
        platform (platform, MB, MB over the base)."""
        sizes = []
        for member in built.members or (built,):
            mb = self.size(member) / 1e6
            line = f"image {built.name} {member.platform} {mb:.0f} MB"
            base_mb = 0.0
            if bases is not None:
                (own_base,) = [b for b in bases if b.platform == member.platform]
                base_mb = self.size(own_base) / 1e6
                line += f" (base {base_mb:.0f} MB, the Dockerfile adds {mb - base_mb:.0f} MB)"
            print(line, flush=True)
            sizes.append((member.platform, mb, mb - base_mb))
        return sizes

    def run_in(self, built: Built, *command: str, timeout: float = 300) -> str:
        """What `command` prints in a container of the image (its platform's, under emulation when foreign)."""
        ctr = self.buildah("from", "--pull-never", "--platform", built.platform, built.local).stdout.strip()
        try:
            with _emulating(built.platform):
                done = self.buildah("run", "--network", "none", ctr, "--", *command, timeout=timeout)
        finally:
            self.buildah("rm", ctr)
        return done.stdout.strip()

    # --- the bundled Temporal's stand-ins (issue 40) --------------------------------------------------------------
    # Same-version stand-ins for the official images deploy/components/temporal names, with their entry contract:
    # the binaries at the official paths, the same user, working directory, environment and ports. Each build says
    # it is a stand-in, as the pause and CoreDNS images are.
    def _rootfs_image(self, name: str, key: str, files: dict[str, Path], *, config: list[str], home: str,
                      busybox: bool = False, dirs: tuple[str, ...] = ()) -> Built:  # fmt: skip
        """A scratch image of `files` (image path → local file), with busybox's applets when asked, and the user
        temporal (1000) whose home is `home` in /etc/passwd, as the official image has it."""
        key = content_key(key, TEMPORAL_PASSWD.format(home=home), TEMPORAL_GROUP)

        def build(local: str) -> None:
            rootfs = self.run_dir / f"{name}-rootfs"
            shutil.rmtree(rootfs, ignore_errors=True)
            rootfs.mkdir(parents=True)
            (rootfs / "tmp").mkdir(mode=0o1777)
            (rootfs / "etc").mkdir()
            (rootfs / "etc" / "passwd").write_text(TEMPORAL_PASSWD.format(home=home))
            (rootfs / "etc" / "group").write_text(TEMPORAL_GROUP)
            for d in dirs:
                (rootfs / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
            if busybox:
                (rootfs / "bin").mkdir()
                shutil.copy2("/bin/busybox", rootfs / "bin" / "busybox")
                for applet in (*BUSYBOX_APPLETS, "grep", "sed", "awk", "tr", "cut", "head", "tail"):
                    link = rootfs / "bin" / applet
                    if not link.exists():
                        link.symlink_to("busybox")
            for at, source in files.items():
                target = rootfs / at.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
            ctr = self.buildah("from", "scratch").stdout.strip()
            try:
                self.buildah("copy", ctr, str(rootfs), "/")
                self.buildah("config", *config, ctr)
                self.buildah("commit", "--rm", ctr, local)
            except BaseException:
                self.buildah("rm", ctr)
                raise
            finally:
                shutil.rmtree(rootfs, ignore_errors=True)

        return self.ensure(name, key, build, " (a stand-in for the official image)")

    def temporal_server(self, bins: Path) -> Built:
        """temporalio/server: /usr/local/bin/temporal-server, user temporal (1000), working directory /etc/temporal."""
        binary = bins / "bin" / "temporal-server"
        key = content_key(RECIPE, "temporal-server", binary)
        config = ["--entrypoint", _json(["/usr/local/bin/temporal-server"]), "--cmd", '["start"]',
                  "--workingdir", "/etc/temporal", "--user", "1000:1000", "--port", "7233",
                  "--env", "PATH=/usr/local/bin:/bin", "--env", "TEMPORAL_HOME=/etc/temporal"]  # fmt: skip
        return self._rootfs_image(
            "temporal-server",
            key,
            {"/usr/local/bin/temporal-server": binary},
            home="/etc/temporal",
            dirs=("/etc/temporal/config",),
            config=config,
        )

    def temporal_admin_tools(self, bins: Path, cli: Path) -> Built:
        """temporalio/admin-tools: temporal-sql-tool (its schemas embedded) and the `temporal` CLI in
        /usr/local/bin, with a shell; user temporal (1000)."""
        sql_tool = bins / "bin" / "temporal-sql-tool"
        key = content_key(RECIPE, "temporal-admin-tools", sql_tool, cli)
        return self._rootfs_image("temporal-admin-tools", key, {"/usr/local/bin/temporal-sql-tool": sql_tool,
                                  "/usr/local/bin/temporal": cli}, busybox=True, dirs=("/etc/temporal",),
                                  home="/etc/temporal", config=[
            "--entrypoint", "", "--cmd", '["sh"]', "--workingdir", "/etc/temporal", "--user", "1000:1000",
            "--env", "PATH=/usr/local/bin:/bin"])  # fmt: skip

    def temporal_ui(self, bins: Path) -> Built:
        """temporalio/ui: /home/ui-server/ui-server and its config/docker.yaml (the template of the TEMPORAL_*
        environment), user temporal (1000), port 8080. The official entry script only adds a legacy template path
        and a debugging shell, so the stand-in starts the server as that script ends: `./ui-server --env docker
        start`."""
        binary, config = bins / "bin" / "ui-server", bins / "ui-config" / "docker.yaml"
        key = content_key(RECIPE, "temporal-ui", binary, config)
        return self._rootfs_image("temporal-ui", key, {"/home/ui-server/ui-server": binary,
                                  "/home/ui-server/config/docker.yaml": config}, home="/home/ui-server", config=[
            "--entrypoint", _json(["./ui-server", "--env", "docker", "start"]), "--cmd", "",
            "--workingdir", "/home/ui-server", "--user", "1000:1000", "--port", "8080"])  # fmt: skip

    def postgresql(self) -> Built:
        """postgres:15-bookworm from Debian's postgresql-15: the postgres user and group 999, the server's programs
        first on PATH, PGDATA /var/lib/postgresql/data, and /usr/local/bin/docker-entrypoint.sh
        (tests/realcluster/addons/postgres-entrypoint.sh) with the official entry point's contract for what
        deploy/ uses: POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB, PGDATA; `postgres` as the command."""
        versions = _candidate_versions(["postgresql-15"])
        entry = Path(__file__).resolve().parent / "addons" / "postgres-entrypoint.sh"
        key = content_key(RECIPE, "postgresql", *[f"{p}={v}" for p, v in versions.items()], entry)

        def build(local: str) -> None:
            tar = self.run_dir / "postgresql.tar"
            # Before postgresql-common's postinst makes its own: groupadd is not in the essential set yet.
            user = (
                "echo 'postgres:x:999:999:PostgreSQL:/var/lib/postgresql:/bin/bash' >> \"$1\"/etc/passwd && "
                "echo 'postgres:x:999:' >> \"$1\"/etc/group && echo 'postgres:*:19000::::::' >> \"$1\"/etc/shadow"
            )
            tidy = ('rm -rf "$1"/var/lib/postgresql/15/main "$1"/etc/postgresql/15/main "$1"/var/cache/apt/* '
                    '"$1"/var/lib/apt/lists/* "$1"/usr/share/doc "$1"/usr/share/man "$1"/usr/share/locale && '
                    'mkdir -p "$1"/var/lib/postgresql/data "$1"/var/run/postgresql && '
                    'chown -R 999:999 "$1"/var/lib/postgresql "$1"/var/run/postgresql && '
                    'chmod 3777 "$1"/var/run/postgresql')  # fmt: skip
            subprocess.run(
                ["mmdebstrap", "--variant=minbase", "--include=postgresql-15", "--quiet",
                 "--aptopt=Acquire::Retries=3", f"--essential-hook={user}", f"--customize-hook={tidy}",
                 "bookworm", str(tar)],
                check=True, capture_output=True, timeout=1800,
            )  # fmt: skip
            ctr = self.buildah("from", "scratch").stdout.strip()
            try:
                self.buildah("add", ctr, str(tar), "/")
                self.buildah("copy", "--chmod", "0755", ctr, str(entry), "/usr/local/bin/docker-entrypoint.sh")
                self.buildah("config", "--env", "PATH=/usr/lib/postgresql/15/bin:" + OFFICIAL_PATH,
                             "--env", "PGDATA=/var/lib/postgresql/data", "--env", "LANG=C.UTF-8",
                             "--entrypoint", _json(["docker-entrypoint.sh"]), "--cmd", '["postgres"]',
                             "--user", "999:999", "--port", "5432", ctr)  # fmt: skip
                self.buildah("commit", "--rm", ctr, local)
            except BaseException:
                self.buildah("rm", ctr)
                raise
            finally:
                tar.unlink(missing_ok=True)

        return self.ensure("postgresql", key, build, " (a stand-in for the official image)")

    def push(self, built: Built, ref: str) -> None:
        """The image to the run's registry, as `docker push` would (plain HTTP on the loopback); an index with every
        platform's image (`buildah manifest push --all`)."""
        if built.is_index:
            self.buildah("manifest", "push", "--all", "--tls-verify=false", built.local, f"docker://{ref}",
                         timeout=1800)  # fmt: skip
        else:
            self.buildah("push", "--tls-verify=false", built.local, f"docker://{ref}", timeout=900)

    def archive(self, built: Built, path: Path, name: str) -> Path:
        """The image as an OCI archive named `name` (what `RealNode.load_image` imports)."""
        self.buildah("push", built.local, f"oci-archive:{path}:{name}", timeout=900)
        return path


def _mmdebstrap(args: list[str]) -> None:
    done = subprocess.run(["mmdebstrap", *args], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise AssertionError(f"mmdebstrap {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")


@contextlib.contextmanager
def _emulating(platform: str) -> Iterator[None]:
    """arm64's programs run for a foreign platform's build or run (tests/binfmt.py); nothing for the machine's own."""
    if platform == f"linux/{machine_arch()}":
        yield
        return
    with binfmt.arm64():
        yield


def machine_arch() -> str:
    """The machine's architecture as an image platform names it (amd64, arm64)."""
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)


def _json(words: list[str]) -> str:
    return json.dumps(words)


def _candidate_versions(packages: Iterable[str]) -> dict[str, str]:
    out = subprocess.run(["apt-cache", "policy", *packages], capture_output=True, text=True, timeout=60).stdout
    versions: dict[str, str] = {}
    current = ""
    for line in out.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1]
        elif line.strip().startswith("Candidate:") and current:
            versions[current] = line.split(":", 1)[1].strip()
    return versions


# --- the registry -----------------------------------------------------------------------------------------------------
@dataclass
class Registry:
    """Debian's docker-registry on 127.0.0.1 for the run's length. Its storage is kept in the image cache (blobs by
    digest, as buildah's store keeps them), so a push of an image pushed before uploads nothing; its process,
    configuration and log live under the run."""

    dir: Path
    storage: Path = CACHE / "registry"
    port: int = field(default_factory=free_port)
    proc: Proc | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Registry:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.storage.mkdir(parents=True, exist_ok=True)
        cfg = self.dir / "registry.yml"
        cfg.write_text(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {self.storage}\n"
            f"http:\n  addr: {self.address}\n"
        )
        self.proc = Proc("registry", ["docker-registry", "serve", str(cfg)], self.dir / "registry.log").start()

        def up() -> bool:
            with urllib.request.urlopen(f"http://{self.address}/v2/", timeout=2) as r:
                return bool(r.status == 200)

        wait_until("the image registry to answer /v2/", up, within=30, procs=[self.proc])
        return self

    def has(self, repository: str, tag: str) -> bool:
        """Whether the registry holds `repository:tag` (a tag is a content key: the same tag, the same image)."""
        request = urllib.request.Request(f"http://{self.address}/v2/{repository}/manifests/{tag}", method="HEAD",
                                         headers={"Accept": "application/vnd.oci.image.manifest.v1+json, "
                                                  "application/vnd.docker.distribution.manifest.v2+json"})  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                return bool(r.status == 200)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return False
            raise

    def platform_digest(self, repository: str, tag: str, platform: str) -> str:
        """The digest of one platform's image in the index `repository:tag` (what pins a node to that platform)."""
        accept = "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json"
        request = urllib.request.Request(f"http://{self.address}/v2/{repository}/manifests/{tag}",
                                         headers={"Accept": accept})  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as r:
            index = json.loads(r.read())
        os_name, arch = platform.split("/")
        for manifest in index.get("manifests", []):
            p = manifest.get("platform", {})
            if p.get("os") == os_name and p.get("architecture") == arch:
                return str(manifest["digest"])
        raise AssertionError(f"{repository}:{tag} in the registry has no {platform} image: {index}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
