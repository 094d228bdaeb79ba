"""The pure parts of the power images' build (tests/machineroom/power_images.py, run by tests/machineroom/images.sh;
issue 42): the stand-in base's recipe and keys, the image keys (one per platform), the size measure and the printed
line, the version commands, the Containerfiles' shape, and platforms.json read from OCI archives made here."""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.machineroom import power_images as pi

IMAGES = Path(__file__).resolve().parent.parent / "deploy" / "examples" / "power" / "images"
CONTAINERFILES = sorted(IMAGES.glob("*.Containerfile"))
# The Debian package a checked command comes from, when it is not named like the command.
PACKAGE = {"ssh": "openssh-client", "ping": "iputils-ping", "python3": "python3-minimal"}


def test_the_base_is_debian_slims_recipe() -> None:
    args = pi.base_args("arm64", Path("/x y/hook.sh"))
    assert "--variant=minbase" in args
    assert "--architectures=arm64" in args
    assert f"--hook-dir={pi.MERGED_USR_HOOKS}" in args, "debootstrap's merged /usr, not the usrmerge package (perl)"
    for pattern in pi.SLIM_EXCLUDES:
        assert f"--dpkgopt=path-exclude={pattern}" in args
    for pattern in pi.SLIM_INCLUDES:
        assert f"--dpkgopt=path-include={pattern}" in args
    assert "/usr/share/doc/*/copyright" in pi.SLIM_INCLUDES, "the copyright files stay, as in debian:bookworm-slim"
    assert args[-1] == "--customize-hook=sh '/x y/hook.sh' \"$1\""


def test_the_base_key_is_its_platform_and_its_recipe() -> None:
    amd64 = pi.base_key("bookworm", "amd64", "hook")
    assert re.fullmatch(r"debian-bookworm-slim-[0-9a-f]{12}-amd64", amd64)
    assert pi.base_key("bookworm", "amd64", "hook") == amd64
    assert pi.base_key("bookworm", "arm64", "hook").endswith("-arm64")
    assert pi.base_key("bookworm", "amd64", "hook 2") != amd64, "a changed hook is a new base"
    assert pi.base_key("trixie", "amd64", "hook") != amd64


def test_an_image_key_includes_each_platform_and_its_base() -> None:
    text = "FROM ${BASE_IMAGE}\n"
    amd64 = pi.image_key(text, {"linux/amd64": "base-1"})
    assert re.fullmatch(r"[0-9a-f]{16}", amd64)
    assert pi.image_key(text, {"linux/arm64": "base-1"}) != amd64, "the platform is in the key"
    assert pi.image_key(text, {"linux/amd64": "base-2"}) != amd64
    assert pi.image_key(text + "RUN true\n", {"linux/amd64": "base-1"}) != amd64
    both = pi.image_key(text, {"linux/amd64": "a", "linux/arm64": "b"})
    assert both == pi.image_key(text, {"linux/arm64": "b", "linux/amd64": "a"})
    assert both not in (pi.image_key(text, {"linux/amd64": "a"}), pi.image_key(text, {"linux/arm64": "b"}))
    with pytest.raises(ValueError):
        pi.image_key(text, {})


@pytest.mark.parametrize(
    ("nbytes", "printed"),
    [(61_400_000, "61"), (61_500_000, "62"), (79_999_999, "80"), (499_999, "0"), (1_234_567_890, "1235")],
)
def test_the_printed_line(nbytes: int, printed: str) -> None:
    assert pi.line("power-redfish", "linux/arm64", nbytes) == f"image power-redfish linux/arm64 {printed} MB"


def test_the_line_format_is_exact() -> None:
    assert re.fullmatch(r"image \S+ linux/(amd64|arm64) \d+ MB", pi.line("power-ssh", "linux/amd64", 75_000_000))


def test_the_limit_is_80_million_bytes() -> None:
    assert not pi.over_limit(80_000_000)
    assert pi.over_limit(80_000_001)
    assert not pi.over_limit(80_400_000, 81)


def _layer(size: int, media: str = "application/vnd.oci.image.layer.v1.tar") -> dict[str, Any]:
    return {"mediaType": media, "digest": f"sha256:{size:064x}", "size": size}


def test_the_size_is_the_uncompressed_layers() -> None:
    manifest = {"layers": [_layer(77_561_344), _layer(19_460_608)]}
    assert pi.uncompressed_bytes(manifest) == 97_021_952
    inspect = {"Manifest": json.dumps(manifest)}
    assert pi.inspected_bytes(inspect) == 97_021_952
    docker = {"layers": [_layer(10, "application/vnd.docker.image.rootfs.diff.tar")]}
    assert pi.uncompressed_bytes(docker) == 10


@pytest.mark.parametrize(
    "media", ["application/vnd.oci.image.layer.v1.tar+gzip", "application/vnd.oci.image.layer.v1.tar+zstd"]
)
def test_a_compressed_layer_is_refused(media: str) -> None:
    with pytest.raises(ValueError, match="not an uncompressed tar"):
        pi.uncompressed_bytes({"layers": [_layer(1), _layer(2, media)]})


def test_an_image_without_layers_is_refused() -> None:
    with pytest.raises(ValueError):
        pi.uncompressed_bytes({"layers": []})


def test_machines_and_archives() -> None:
    assert pi.machine("linux/arm64") == "aarch64"
    assert pi.machine("linux/amd64") == "x86_64"
    with pytest.raises(ValueError):
        pi.machine("linux/riscv64")
    assert pi.archive_name("linux/amd64") == "image.oci.tar", "what the machine room and the real node load"
    assert pi.archive_name("linux/arm64") == "image-arm64.oci.tar"
    with pytest.raises(ValueError):
        pi.arch("arm64")


@pytest.mark.parametrize("path", CONTAINERFILES, ids=[p.stem for p in CONTAINERFILES])
def test_every_power_image_runs_its_tools_at_build_time(path: Path) -> None:
    checks = pi.CHECKS[f"power-{path.stem}"]
    assert checks, f"{path.name}: images.sh runs its tools' version commands (under emulation for arm64)"
    tools = _tools(path.read_text())
    for command in checks:
        program = command.split()[0]
        assert PACKAGE.get(program, program) in tools, f"{path.name}: {command} comes from a package it installs"


def _tools(text: str) -> list[str]:
    found = re.search(r'tools="([^"]+)"', text)
    assert found, "the packages are named once, in `tools`"
    return found.group(1).split()


@pytest.mark.parametrize("path", CONTAINERFILES, ids=[p.stem for p in CONTAINERFILES])
def test_a_containerfile_builds_on_the_official_base_and_keeps_only_what_the_job_runs(path: Path) -> None:
    """Each image builds with `docker build` on debian:bookworm-slim (nothing only the stand-in has), for any
    platform: the tools installed, then marked as what stays while apt and what only installs use go, and the root
    flattened into one layer (removing in a later layer would not make the image smaller)."""
    text = path.read_text()
    assert "ARG BASE_IMAGE=debian:bookworm-slim\nFROM ${BASE_IMAGE} AS build\n" in text
    assert "apt-get install -y --no-install-recommends $tools" in text
    assert "rm -rf /var/lib/apt/lists/*" in text
    assert "apt-mark manual $tools" in text, "what the Job runs is never autoremoved"
    assert "--auto-remove apt " in text
    assert "rm -rf /usr/lib/*-linux-gnu/gconv " in text, "about 20 MB on arm64, where each module is padded to 64 KB"
    assert text.rstrip().endswith(
        "FROM scratch\nCOPY --from=build / /\nENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        'CMD ["bash"]'
    )
    assert "--platform" not in text and "amd64" not in text, "the same file builds for every platform"


def test_the_containerfiles_trim_alike() -> None:
    """The four differ only in their first comment line and their packages."""

    def shape(p: Path) -> str:
        return re.sub(r'tools="[^"]+"', 'tools="..."', p.read_text().split("\n", 1)[1])

    assert len({shape(p) for p in CONTAINERFILES}) == 1


def test_the_hook_writes_the_slim_configuration(tmp_path: Path) -> None:
    for d in ("usr/sbin", "etc/apt/apt.conf.d", "var/log/apt", "var/cache/ldconfig"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "etc" / "resolv.conf").write_text("nameserver 10.0.0.1\n")
    (tmp_path / "var" / "log" / "dpkg.log").write_text("x")
    (tmp_path / "var" / "cache" / "apt").mkdir(parents=True)
    (tmp_path / "var" / "cache" / "apt" / "pkgcache.bin").write_text("37 MB in the bootstrap")
    subprocess.run(["sh", str(pi.HOOK), str(tmp_path)], check=True, timeout=30)
    policy = tmp_path / "usr" / "sbin" / "policy-rc.d"
    assert subprocess.run([str(policy)], timeout=30, check=False).returncode == 101
    clean = (tmp_path / "etc" / "apt" / "apt.conf.d" / "docker-clean").read_text()
    assert 'Dir::Cache::pkgcache "";' in clean
    assert "DPkg::Post-Invoke" in clean and "/var/cache/apt/archives/*.deb" in clean
    assert not (tmp_path / "etc" / "resolv.conf").exists(), "the host's resolv.conf is not in the base"
    assert not (tmp_path / "var" / "log" / "dpkg.log").exists()
    assert not (tmp_path / "var" / "cache" / "apt" / "pkgcache.bin").exists(), "no apt cache in the base"


# OCI archives as buildah writes them (oci-archive:), made here from documents.
def _doc(obj: dict[str, Any]) -> tuple[str, bytes]:
    data = json.dumps(obj).encode()
    return f"sha256:{hashlib.sha256(data).hexdigest()}", data


GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"


def _image(arch: str, layers: int = 1) -> tuple[dict[str, bytes], dict[str, Any]]:
    """An image's blobs and its descriptor (no platform on it, as in a one-image archive)."""
    config_digest, config = _doc({"os": "linux", "architecture": arch, "variant": "v8" if arch == "arm64" else ""})
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                           "size": len(config)},
                "layers": [_layer(1000 + i, GZIP) for i in range(layers)]}  # fmt: skip
    digest, data = _doc(manifest)
    return {config_digest: config, digest: data}, {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": digest,
        "size": len(data),
    }


def _archive(path: Path, blobs: dict[str, bytes], top: dict[str, Any]) -> None:
    with tarfile.open(path, "w") as tar:
        files = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": json.dumps({
            "schemaVersion": 2, "manifests": [{**top, "annotations": {"org.opencontainers.image.ref.name": "r"}}]
        }).encode(), **{f"blobs/{d.replace(':', '/')}": b for d, b in blobs.items()},
                 "blobs/sha256/" + "0" * 64: b"\x1f\x8b a gzipped layer"}  # fmt: skip
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _index(images: dict[str, tuple[dict[str, bytes], dict[str, Any]]]) -> tuple[dict[str, bytes], dict[str, Any]]:
    blobs: dict[str, bytes] = {}
    entries = []
    for platform, (image_blobs, descriptor) in images.items():
        blobs.update(image_blobs)
        os_, arch = platform.split("/")
        entries.append({**descriptor, "platform": {"os": os_, "architecture": arch,
                                                   **({"variant": "v8"} if arch == "arm64" else {})}})  # fmt: skip
    digest, data = _doc({"schemaVersion": 2, "mediaType": pi.INDEX_TYPES[0], "manifests": entries})
    blobs[digest] = data
    return blobs, {"mediaType": pi.INDEX_TYPES[0], "digest": digest, "size": len(data)}


def test_manifests_are_found_through_an_index_or_directly() -> None:
    amd64, arm64 = _image("amd64"), _image("arm64", layers=2)
    blobs, top = _index({"linux/amd64": amd64, "linux/arm64": arm64})
    found = pi.manifests({"manifests": [top]}, blobs.__getitem__)
    assert found == {"linux/amd64": {"digest": amd64[1]["digest"], "size": amd64[1]["size"]},
                     "linux/arm64": {"digest": arm64[1]["digest"], "size": arm64[1]["size"]}}  # fmt: skip
    alone = pi.manifests({"manifests": [arm64[1]]}, arm64[0].__getitem__)
    assert alone == {"linux/arm64": {"digest": arm64[1]["digest"], "size": arm64[1]["size"]}}, "from its config"


def _build_dir(out: Path, *, arm64_archive: str = "arm64") -> tuple[dict[str, Any], dict[str, Any]]:
    amd64, arm64 = _image("amd64"), _image("arm64", layers=2)
    _archive(out / "image.oci.tar", *amd64)
    _archive(out / "image-arm64.oci.tar", *(arm64 if arm64_archive == "arm64" else _image("arm64", layers=3)))
    _archive(out / "index.oci.tar", *_index({"linux/amd64": amd64, "linux/arm64": arm64}))
    (out / ".platform-amd64.json").write_text(
        json.dumps({"platform": "linux/amd64", "bytes": 69_273_600, "seconds": 14})
    )
    (out / ".platform-arm64.json").write_text(
        json.dumps({"platform": "linux/arm64", "bytes": 71_500_001, "seconds": 301})
    )
    return amd64[1], arm64[1]


def test_platforms_json_names_each_platforms_manifest_in_the_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    amd64, arm64 = _build_dir(tmp_path)
    assert pi.main(["platforms", "power-redfish", str(tmp_path), "localhost/hlmr/power-redfish:k"]) == 0
    assert capsys.readouterr().out.splitlines() == ["image power-redfish linux/amd64 69 MB",
                                                    "image power-redfish linux/arm64 72 MB"]  # fmt: skip
    doc = json.loads((tmp_path / "platforms.json").read_text())
    index, _ = pi.read_archive(tmp_path / "index.oci.tar")
    assert doc["reference"] == "localhost/hlmr/power-redfish:k"
    assert doc["index"] == index["manifests"][0]["digest"]
    assert doc["platforms"]["linux/arm64"] == {"digest": arm64["digest"], "manifest_size": arm64["size"],
                                               "bytes": 71_500_001, "mb": 72, "archive": "image-arm64.oci.tar",
                                               "seconds": 301}  # fmt: skip
    assert doc["platforms"]["linux/amd64"]["digest"] == amd64["digest"]
    assert doc["platforms"]["linux/amd64"]["archive"] == "image.oci.tar"
    assert pi.main(["lines", "power-redfish", str(tmp_path)]) == 0, "the lines again when cached"
    assert capsys.readouterr().out.splitlines()[1] == "image power-redfish linux/arm64 72 MB"


def test_an_archive_that_is_not_the_indexs_image_fails(tmp_path: Path) -> None:
    _build_dir(tmp_path, arm64_archive="another")
    with pytest.raises(ValueError, match=r"image-arm64\.oci\.tar holds"):
        pi.main(["platforms", "power-redfish", str(tmp_path), "r"])


def test_one_platform_without_an_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    image = _image("amd64")
    _archive(tmp_path / "image.oci.tar", *image)
    (tmp_path / ".platform-amd64.json").write_text(json.dumps({"platform": "linux/amd64", "bytes": 150_000_000}))
    assert pi.main(["platforms", "machine-os", str(tmp_path), "localhost/hlmr/machine-os:k"]) == 0
    assert capsys.readouterr().out.strip() == "image machine-os linux/amd64 150 MB"
    doc = json.loads((tmp_path / "platforms.json").read_text())
    assert doc["index"] is None
    assert doc["platforms"]["linux/amd64"]["digest"] == image[1]["digest"]


def test_a_build_missing_a_platform_fails() -> None:
    with pytest.raises(ValueError, match="the index holds"):
        pi.platforms_doc(
            "r",
            "sha256:i",
            {"linux/amd64": {"digest": "d", "size": 1}, "linux/arm64": {"digest": "e", "size": 1}},
            {"linux/amd64": {"digest": "d"}},
            {"linux/amd64": {"bytes": 1}},
        )


def test_record_keeps_the_size_or_refuses_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    def stdin(nbytes: int) -> None:
        monkeypatch.setattr(
            "sys.stdin", io.StringIO(json.dumps({"Manifest": json.dumps({"layers": [_layer(nbytes)]})}))
        )

    stdin(80_000_000)
    assert pi.main(["record", str(tmp_path), "linux/arm64", "7", "80"]) == 0
    kept = json.loads((tmp_path / ".platform-arm64.json").read_text())
    assert kept == {"platform": "linux/arm64", "bytes": 80_000_000, "seconds": 7}
    stdin(80_000_001)
    assert pi.main(["record", str(tmp_path), "linux/amd64", "7", "80"]) == 1
    assert "over 80 MB" in capsys.readouterr().err
    assert not (tmp_path / ".platform-amd64.json").exists(), "an image over the limit is not kept as built"
    stdin(200_000_000)
    assert pi.main(["record", str(tmp_path), "linux/amd64", "7", "0"]) == 0, "0: no limit (the machine OS)"


def test_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert pi.main(["checks", "power-redfish"]) == 0
    assert capsys.readouterr().out.splitlines() == ["curl --version", "jq --version"]
    assert pi.main(["checks", "machine-os"]) == 0
    assert capsys.readouterr().out == "", "no command, not an empty one"
    assert pi.main(["machine", "linux/arm64"]) == 0
    assert capsys.readouterr().out.strip() == "aarch64"
    assert pi.main(["nonsense"]) == 2
