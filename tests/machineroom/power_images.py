"""The pure parts of the power images' build (tests/machineroom/images.sh, issue 42): the stand-in base's recipe,
the cache keys, the size measure and the line printed for each image and platform, the version commands run in each
built image, and platforms.json, read from the image index's OCI archive. The shell script runs the tools (mmdebstrap,
buildah, qemu through tests/binfmt.py); every decision it makes is here, tested by tests/test_power_images.py.

    python3 -m tests.machineroom.power_images base-args SUITE ARCH      mmdebstrap's options, one a line
    python3 -m tests.machineroom.power_images base-key SUITE ARCH       the base's cache key (its recipe's content)
    python3 -m tests.machineroom.power_images key FILE PLATFORM=BASE_KEY...   an image's cache key
    python3 -m tests.machineroom.power_images checks NAME               the commands a built image must run
    python3 -m tests.machineroom.power_images machine PLATFORM          what `uname -m` says on it
    python3 -m tests.machineroom.power_images bytes < `buildah inspect --type image` of an image: its size
    python3 -m tests.machineroom.power_images record OUT PLATFORM SECONDS LIMIT_MB < the same: kept (0: no limit)
    python3 -m tests.machineroom.power_images platforms NAME OUT REFERENCE    writes OUT/platforms.json, prints lines
    python3 -m tests.machineroom.power_images lines NAME OUT            the lines again, from OUT/platforms.json
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
import tarfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
HOOK = HERE / "debian-slim-hook.sh"

# debian:bookworm-slim is debuerreotype's minbase with these dpkg filters (its scripts/.slimify-excludes and
# .slimify-includes): the stand-in base gets the same ones, kept in its /etc/dpkg/dpkg.cfg.d so the images' own
# installs are filtered too, as they are on the official base.
SLIM_EXCLUDES = (
    "/usr/share/doc/*",
    "/usr/share/groff/*",
    "/usr/share/info/*",
    "/usr/share/linda/*",
    "/usr/share/lintian/overrides/*",
    "/usr/share/locale/*",
    "/usr/share/man/*",
)
SLIM_INCLUDES = (
    "/usr/share/doc/*/copyright",
    "/usr/share/doc/kde/HTML/C/*",
    "/usr/share/gnome/help/*/C/*",
    "/usr/share/locale/all_languages",
    "/usr/share/locale/currency/*",
    "/usr/share/locale/l10n/*",
    "/usr/share/locale/languages",
    "/usr/share/locale/locale.alias",
    "/usr/share/omf/*/*-C.emf",
)
# debootstrap merges /usr itself (symlinks and the usr-is-merged package), as debuerreotype does; without this hook
# mmdebstrap installs the usrmerge package for bookworm, and with it perl (about 45 MB the official image lacks).
MERGED_USR_HOOKS = "/usr/share/mmdebstrap/hooks/merged-usr"

MB = 1_000_000  # as `buildah images` prints sizes (and docker's MB)
LIMIT_MB = 80  # each power image, each platform (issue 42)
MACHINES = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}
# Each power image's tools, run in the built image (under emulation for arm64): the build fails if one does not run.
CHECKS: dict[str, tuple[str, ...]] = {
    "power-ipmitool": ("ipmitool -V",),
    "power-redfish": ("curl --version", "jq --version"),
    "power-ssh": ("ssh -V", "ping -V", "curl --version"),
    "power-wake-on-lan": ("python3 --version",),
}
UNCOMPRESSED = ("application/vnd.oci.image.layer.v1.tar", "application/vnd.docker.image.rootfs.diff.tar")
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")


def base_args(arch: str, hook: Path = HOOK) -> list[str]:
    """mmdebstrap's options for the stand-in base of `arch`: debian:bookworm-slim's recipe (minbase, merged /usr
    as debootstrap does it, the slim dpkg filters, the minimizing config of tests/machineroom/debian-slim-hook.sh)."""
    return [
        "--quiet",
        "--variant=minbase",
        f"--architectures={arch}",
        f"--hook-dir={MERGED_USR_HOOKS}",
        *(f"--dpkgopt=path-exclude={p}" for p in SLIM_EXCLUDES),
        *(f"--dpkgopt=path-include={p}" for p in SLIM_INCLUDES),
        "--dpkgopt=force-unsafe-io",
        f'--customize-hook=sh {shlex.quote(str(hook))} "$1"',
    ]


def _digest(parts: Iterable[str]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def base_key(suite: str, arch: str, hook_text: str) -> str:
    """The base's cache key: its suite, its platform and its recipe (the options and the hook's content, not the
    hook's path), so a change to the recipe builds a new base."""
    recipe = _digest([suite, arch, *base_args(arch, Path("HOOK")), hook_text])[:12]
    return f"debian-{suite}-slim-{recipe}-{arch}"


def image_key(containerfile: str, bases: Mapping[str, str]) -> str:
    """An image's cache key: its Containerfile and, for each platform built, the platform and its base's key."""
    if not bases:
        raise ValueError("an image is built for one platform at least")
    return _digest([containerfile, *(f"{p}={bases[p]}" for p in sorted(bases))])[:16]


def uncompressed_bytes(manifest: Mapping[str, Any]) -> int:
    """The image's size as buildah counts it (`buildah images`): its layers uncompressed, as containers/storage keeps
    an image buildah built. A compressed layer would count less than it takes, so it is refused."""
    layers = manifest.get("layers") or []
    if not layers:
        raise ValueError("the manifest has no layers")
    for layer in layers:
        if layer.get("mediaType") not in UNCOMPRESSED:
            raise ValueError(f"layer {layer.get('digest')}: {layer.get('mediaType')} is not an uncompressed tar")
    return sum(int(layer["size"]) for layer in layers)


def inspected_bytes(inspect: Mapping[str, Any]) -> int:
    """`buildah inspect --type image`'s JSON: the manifest it stores, as uncompressed_bytes counts it."""
    manifest = inspect["Manifest"]
    return uncompressed_bytes(json.loads(manifest) if isinstance(manifest, str) else manifest)


def mb(nbytes: int) -> int:
    """Whole megabytes (10^6 bytes, as buildah prints them), rounded half up."""
    return (nbytes + MB // 2) // MB


def line(name: str, platform: str, nbytes: int) -> str:
    """What images.sh prints for each image and platform, built now or cached."""
    return f"image {name} {platform} {mb(nbytes)} MB"


def over_limit(nbytes: int, limit_mb: int = LIMIT_MB) -> bool:
    """Whether an image weighs more than the limit (in bytes: 80 MB is 80,000,000 bytes)."""
    return nbytes > limit_mb * MB


def machine(platform: str) -> str:
    """What `uname -m` says in an image of the platform (the arm64 ones under emulation)."""
    try:
        return MACHINES[platform]
    except KeyError:
        raise ValueError(f"{platform}: not a platform the power images are built for ({', '.join(MACHINES)})") from None


def arch(platform: str) -> str:
    """`linux/arm64` -> `arm64` (buildah's --arch, the archive's suffix)."""
    os_, _, architecture = platform.partition("/")
    if os_ != "linux" or not architecture:
        raise ValueError(f"{platform!r}: not linux/<arch>")
    return architecture


def archive_name(platform: str, primary: str = "linux/amd64") -> str:
    """The OCI archive of one platform's image: image.oci.tar for amd64 (what the machine room and the real node
    load, as before), image-<arch>.oci.tar for the others."""
    return "image.oci.tar" if platform == primary else f"image-{arch(platform)}.oci.tar"


# An OCI archive (oci-archive: transport): index.json names the image (or the image index), blobs/<alg>/<hex> hold
# every document. `blob` reads one by digest, so the parsing below needs no archive (tests give it dictionaries).
Blob = Callable[[str], bytes]


def manifests(index: Mapping[str, Any], blob: Blob) -> dict[str, dict[str, Any]]:
    """Platform -> {"digest", "size"} of each image manifest an OCI layout's index.json reaches: through an image
    index (its descriptors name their platform), or directly (the platform from the image's config)."""
    found: dict[str, dict[str, Any]] = {}

    def visit(descriptor: Mapping[str, Any]) -> None:
        media = descriptor.get("mediaType")
        document = json.loads(blob(descriptor["digest"]))
        if media in INDEX_TYPES or "manifests" in document:
            for child in document.get("manifests", []):
                visit(child)
            return
        platform = descriptor.get("platform")
        if not platform:
            config = json.loads(blob(document["config"]["digest"]))
            platform = {"os": config["os"], "architecture": config["architecture"]}
        name = f"{platform['os']}/{platform['architecture']}"
        if platform.get("variant") and platform["architecture"] != "arm64":
            name += f"/{platform['variant']}"
        if name in found:
            raise ValueError(f"two manifests for {name}: {found[name]['digest']} and {descriptor['digest']}")
        found[name] = {"digest": descriptor["digest"], "size": int(descriptor["size"])}

    for descriptor in index.get("manifests", []):
        visit(descriptor)
    return found


def read_archive(path: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    """An OCI archive's index.json and its blobs by digest (the documents only: layers are not read)."""
    documents: dict[str, bytes] = {}
    with tarfile.open(path) as tar:
        names = {m.name.removeprefix("./"): m for m in tar.getmembers() if m.isfile()}
        index = json.loads(_read(tar, names["index.json"]))
        for name, member in names.items():
            parts = name.split("/")
            if len(parts) == 3 and parts[0] == "blobs" and member.size < 1_000_000:
                data = _read(tar, member)
                if data[:1] == b"{":
                    documents[f"{parts[1]}:{parts[2]}"] = data
    return index, documents


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    f = tar.extractfile(member)
    if f is None:
        raise ValueError(f"{member.name}: not a file")
    return f.read()


Documents = Mapping[str, Mapping[str, Any]]


def platforms_doc(reference: str, index_digest: str | None, index_manifests: Documents, archives: Documents,
                  records: Documents) -> dict[str, Any]:  # fmt: skip
    """platforms.json: the one reference, the index's digest (None for an image of one platform), and per platform
    the manifest digest a registry serves for it once the index is pushed, its size (bytes, MB), its own archive
    and how long it took to build. Each platform's own archive must hold the very manifest the index names."""
    if set(index_manifests) != set(records):
        raise ValueError(f"the index holds {sorted(index_manifests)}, the build made {sorted(records)}")
    out: dict[str, Any] = {"reference": reference, "index": index_digest, "platforms": {}}
    for platform in sorted(index_manifests):
        m, record = index_manifests[platform], records[platform]
        own = archives.get(platform, {})
        if own.get("digest") != m["digest"]:
            raise ValueError(f"{platform}: {archive_name(platform)} holds {own.get('digest')}, the index {m['digest']}")
        out["platforms"][platform] = {
            "digest": m["digest"],
            "manifest_size": m["size"],
            "bytes": int(record["bytes"]),
            "mb": mb(int(record["bytes"])),
            "archive": archive_name(platform),
            "seconds": record.get("seconds"),
        }
    return out


def lines(name: str, doc: Mapping[str, Any]) -> list[str]:
    """The printed lines of platforms.json, amd64 first."""
    platforms = doc["platforms"]
    order = sorted(platforms, key=lambda p: (p != "linux/amd64", p))
    return [line(name, p, int(platforms[p]["bytes"])) for p in order]


def _platforms(name: str, out: Path, reference: str) -> dict[str, Any]:
    records = {r["platform"]: r for r in (json.loads(p.read_text()) for p in sorted(out.glob(".platform-*.json")))}
    archives: dict[str, dict[str, Any]] = {}
    for platform in records:
        index, blobs = read_archive(out / archive_name(platform))
        archives[platform] = manifests(index, blobs.__getitem__).get(platform, {})
    if (out / "index.oci.tar").exists():
        index, blobs = read_archive(out / "index.oci.tar")
        (top,) = index["manifests"]
        doc = platforms_doc(reference, top["digest"], manifests(index, blobs.__getitem__), archives, records)
    else:
        doc = platforms_doc(reference, None, archives, archives, records)
    (out / "platforms.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return doc


def main(argv: list[str]) -> int:
    match argv:
        case ["base-args", _suite, arch_]:
            print("\n".join(base_args(arch_)))
        case ["base-key", suite, arch_]:
            print(base_key(suite, arch_, HOOK.read_text()))
        case ["key", file, *bases] if bases:
            print(image_key(Path(file).read_text(), dict(b.split("=", 1) for b in bases)))
        case ["checks", name]:
            for command in CHECKS.get(name, ()):
                print(command)
        case ["machine", platform]:
            print(machine(platform))
        case ["bytes"]:
            print(inspected_bytes(json.load(sys.stdin)))
        case ["record", out, platform, seconds, limit]:
            nbytes = inspected_bytes(json.load(sys.stdin))
            if int(limit) and over_limit(nbytes, int(limit)):
                print(f"images.sh: {Path(out).name} {platform} is {nbytes} bytes ({mb(nbytes)} MB), over {limit} MB",
                      file=sys.stderr)  # fmt: skip
                return 1
            record = {"platform": platform, "bytes": nbytes, "seconds": int(seconds)}
            (Path(out) / f".platform-{arch(platform)}.json").write_text(json.dumps(record) + "\n")
        case ["platforms", name, out, reference]:
            print("\n".join(lines(name, _platforms(name, Path(out), reference))))
        case ["lines", name, out]:
            print("\n".join(lines(name, json.loads((Path(out) / "platforms.json").read_text()))))
        case _:
            print(__doc__.strip().split("\n\n", 1)[1], file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
