"""The image's virtualenv cut to what a Pod runs (issue 42), in the Dockerfile's build stage after `pip check`.

- Removed, as never run in a Pod: pip and setuptools (no installer in a running image), the asyncio twin of the
  Kubernetes client (`kubernetes.aio`: the operator uses the threaded client; tests/test_slim_venv.py holds the
  project to never importing it),
  the Rust sources temporalio's wheel carries beside its compiled bridge, temporalio's integrations but the one the
  project uses (the others need packages it never installs), type stubs, and the tests wheels ship.
- Packed: every pure-Python top-level package or module (no extension module, nothing that needs a real file beside
  it: `__file__` paths, importlib.resources' `as_file`) goes into one zip on sys.path, read by Python's zipimport:
  its sources with bytecode compiled now (unchecked-hash, so nothing is compiled or checked at start and tracebacks
  keep their lines). The project's
  own packages stay plain files, to be read in a running Pod. Generated protobuf modules of the dependencies left
  as files keep only their bytecode (their source is a serialized descriptor).

    python slim_venv.py VENV --check PACKAGE ...    prints what it removed and packed, in MB
    python slim_venv.py VENV --slim-only ...        the same without the import (a venv for another platform)
    python slim_venv.py VENV --import-only --check PACKAGE ...    the import alone, on the venv's own platform

The Dockerfile slims in its build stage, on the builder's platform (`--slim-only`, the target's `--strip-program`),
and imports in its last stage, on the target's (`--import-only`).

`--check` names the project's packages: every module of each is imported afterwards by the venv's Python with no
temporary files to be had (a Pod's root file system is read-only), so a dependency that cannot run from the zip, or a
removed part something imports, fails the build, not a Pod.
"""

from __future__ import annotations

import argparse
import fnmatch
import py_compile
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

# Paths under site-packages that no Pod runs (globs; a directory goes with everything in it).
UNUSED = (
    "pip", "pip-*.dist-info", "setuptools", "setuptools-*.dist-info", "pkg_resources", "_distutils_hack",
    "distutils-precedence.pth", "kubernetes/aio", "temporalio/bridge/sdk-core", "*-stubs",
)  # fmt: skip
# Optional integrations of a dependency, all but the ones the project uses (the rest need packages it never installs,
# so they could not even be imported): directory -> what stays.
INTEGRATIONS = {"temporalio/contrib": ("__init__.py", "pydantic.py")}
# Inside any package: tests and type stubs.
UNUSED_INSIDE = ("tests", "test", "*_test.py", "test_*.py", "*.pyi")
# What, in a package's source, asks for a real file beside it: a path from `__file__`, or importlib.resources'
# `as_file` (which, from a zip, writes the resource to a temporary file: a Pod's root file system is read-only).
NEEDS_A_FILE = re.compile(r"\b__file__\b|from importlib[._]resources import [^\n]*\bas_file\b|resources\.as_file\(|"
                          r"resource_filename\(")  # fmt: skip
# Packages that mention `__file__` only to name where they are, never to read a file beside them: zip-safe.
NAMES_ITS_PATH_ONLY = {
    "pydantic": "version_info() prints its install path",
    "pycparser": "_ast_gen.py, a generator run when pycparser is built, finds its template",
}
# Generated protobuf modules: their source is a serialized descriptor no person reads, so only bytecode is kept.
GENERATED = ("*_pb2.py", "*_pb2_grpc.py")
ZIP_NAME = "site-packages.zip"
# Run by the venv's Python: every module of the packages named, and that the packed ones came from the zip.
IMPORT_ALL = """
import importlib, pkgutil, sys, tempfile
def no_temporary_files(*args, **kwargs):
    raise OSError("a Pod's root file system is read-only: nothing may need a temporary file to import")
tempfile.mkstemp = tempfile.mkdtemp = tempfile.gettempdir = no_temporary_files
skip = set(sys.argv[1].split(","))
for top in sys.argv[2:]:
    package = importlib.import_module(top)
    for module in pkgutil.walk_packages(package.__path__, top + "."):
        if module.name not in skip:
            importlib.import_module(module.name)
import kubernetes
assert ".zip" in kubernetes.__file__, kubernetes.__file__
"""
PTH_NAME = "site-packages-zip.pth"
EXTENSIONS = (".so", ".pyd")


def site_packages(venv: Path) -> Path:
    (found,) = venv.glob("lib/python3*/site-packages")
    return found


def size(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() or f.is_symlink())


def _sources(path: Path) -> Iterator[Path]:
    """A package's modules, less the tests `remove` deletes anyway."""
    for f in [path] if path.is_file() else sorted(path.rglob("*.py")):
        parts = f.relative_to(path.parent).parts
        if not any(fnmatch.fnmatch(part, pattern) for part in parts for pattern in UNUSED_INSIDE):
            yield f


def packable(path: Path) -> bool:
    """A top-level package or module zipimport can load as it is: pure Python, reading nothing beside it by path
    (pure: tests/test_slim_venv.py)."""
    if path.name.endswith((".dist-info", ".egg-info", ".data")) or path.name in ("__pycache__", "bin"):
        return False
    if path.is_file():
        return path.suffix == ".py"
    if not (path / "__init__.py").exists():
        return False  # a namespace package's parts may live elsewhere (google/, for one)
    if any(f.suffix in EXTENSIONS or f.name.endswith(EXTENSIONS) for f in path.rglob("*") if f.is_file()):
        return False
    if path.name in NAMES_ITS_PATH_ONLY:
        return True
    return not any(NEEDS_A_FILE.search(f.read_text(errors="replace")) for f in _sources(path))


def _doomed(site: Path, patterns: Iterable[str], inside: Iterable[str]) -> Iterator[Path]:
    """What `remove` deletes, in order: the patterns at the top, the ones anywhere inside a package (never in its
    metadata), and every integration of INTEGRATIONS' packages but the ones that stay."""
    for pattern in patterns:
        yield from sorted(site.glob(pattern))
    for pattern in inside:
        yield from (
            p for p in sorted(site.glob(f"*/**/{pattern}")) if not p.relative_to(site).parts[0].endswith(".dist-info")
        )
    for directory, stays in INTEGRATIONS.items():
        found = sorted((site / directory).glob("*")) if (site / directory).is_dir() else []
        yield from (p for p in found if p.name not in stays and p.name != "__pycache__")


def remove(site: Path, patterns: Iterable[str], inside: Iterable[str]) -> list[tuple[str, int]]:
    """Delete what matches; what went and its size in bytes."""
    gone: list[tuple[str, int]] = []
    for path in _doomed(site, patterns, inside):
        if path.exists():  # a directory already gone with its parent
            gone.append((str(path.relative_to(site)), size(path)))
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for bin_script in ("pip", "pip3", f"pip3.{sys.version_info.minor}"):
        (site.parents[2] / "bin" / bin_script).unlink(missing_ok=True)
    return gone


def pack(site: Path, names: list[str]) -> int:
    """`names` (top-level packages and modules of `site`) moved into one zip with their bytecode; its size."""
    archive = site / ZIP_NAME
    with (
        tempfile.TemporaryDirectory() as scratch,
        zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z,
    ):
        compiled = Path(scratch) / "module.pyc"
        for name in names:
            top = site / name
            for f in [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file()):
                if "__pycache__" in f.parts or f.suffix == ".pyc":
                    continue
                arc = f.relative_to(site).as_posix()
                z.write(f, arc)
                if f.suffix == ".py":
                    py_compile.compile(str(f), cfile=str(compiled), dfile=f"{archive}/{arc}", doraise=True,
                                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)  # fmt: skip
                    z.write(compiled, arc + "c")
    for name in names:
        top = site / name
        shutil.rmtree(top) if top.is_dir() else top.unlink()
        if top.suffix == ".py":
            for cached in (site / "__pycache__").glob(f"{top.stem}.*.pyc"):
                cached.unlink()
    # A path line in a .pth file is appended to sys.path at start (site.py), after site-packages itself.
    (site / PTH_NAME).write_text(f"{archive}\n")
    return archive.stat().st_size


def strip(site: Path, program: str = "strip") -> int:
    """binutils' strip on every extension module (the symbols the loader needs stay); the bytes it saved. `program`:
    the target's own (`aarch64-linux-gnu-strip`) when the image is built for another platform than the builder's."""
    libraries = sorted(f for f in site.rglob("*.so*") if f.is_file() and not f.is_symlink())
    before = sum(f.stat().st_size for f in libraries)
    if libraries:
        subprocess.run([program, "--strip-unneeded", *map(str, libraries)], check=True, timeout=600)
    return before - sum(f.stat().st_size for f in libraries)


def bytecode_only(site: Path, keep: Iterable[str] = (), patterns: Iterable[str] = GENERATED) -> int:
    """The generated modules left as files (in packages with extension modules) as bytecode beside where their source
    was, which Python loads without the source; the bytes it saved."""
    saved = 0
    for pattern in patterns:
        for source in sorted(site.rglob(pattern)):
            if source.relative_to(site).parts[0] in keep:
                continue
            compiled = source.with_suffix(".pyc")
            py_compile.compile(str(source), cfile=str(compiled), dfile=str(source), doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)  # fmt: skip
            saved += source.stat().st_size - compiled.stat().st_size
            source.unlink()
            for cached in (source.parent / "__pycache__").glob(f"{source.stem}.*.pyc"):
                saved += cached.stat().st_size
                cached.unlink()
    return saved


def import_all(venv: Path, packages: list[str], skip: str) -> None:
    """Every module of `packages` imported by the venv's Python, with no temporary file to be had; exits saying what
    failed. From an empty directory: the build's working directory holds the sources, which must not stand in for the
    installed packages."""
    with tempfile.TemporaryDirectory() as elsewhere:
        check = subprocess.run([str(venv / "bin" / "python"), "-c", IMPORT_ALL, skip, *packages],
                               capture_output=True, text=True, timeout=600, cwd=elsewhere)  # fmt: skip
    if check.returncode != 0:
        raise SystemExit(f"slim_venv: the slimmed virtualenv cannot import the project:\n{check.stderr[-3000:]}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("venv", type=Path)
    parser.add_argument("--check", nargs="+", default=[], help="the project's packages, imported module by module")
    parser.add_argument("--skip", default="", help="modules --check leaves out, comma-separated (a dev tool's)")
    parser.add_argument("--strip", action="store_true", help="extension modules without their symbol tables")
    parser.add_argument("--strip-program", default="strip", help="binutils' strip for the extension modules' platform")
    step = parser.add_mutually_exclusive_group()
    step.add_argument(
        "--slim-only",
        action="store_true",
        help="no import afterwards: the venv is for another platform (the image's stage imports it)",
    )
    step.add_argument("--import-only", action="store_true", help="only import the --check packages (no slimming)")
    args = parser.parse_args(argv)
    if args.import_only:
        import_all(args.venv, args.check, args.skip)
        print(f"slim_venv: every module of {', '.join(args.check)} imports from {args.venv}")
        return 0
    site = site_packages(args.venv)
    before = size(args.venv)
    gone = remove(site, UNUSED, UNUSED_INSIDE)
    names = sorted(p.name for p in site.iterdir() if p.name not in args.check and packable(p))
    plain = sum(size(site / n) for n in names)
    zipped = pack(site, names)
    generated = bytecode_only(site, keep=args.check)
    stripped = strip(site, args.strip_program) if args.strip else 0
    if not args.slim_only:
        import_all(args.venv, args.check, args.skip)
    mb = 1e6
    named = [p for p, _ in gone if any(fnmatch.fnmatch(p, pattern) for pattern in UNUSED)]
    integrations = [p for p, _ in gone if any(p.startswith(d + "/") for d in INTEGRATIONS)]
    print(
        f"slim_venv: removed {sum(n for _, n in gone) / mb:.1f} MB never run: {', '.join(named)}, "
        f"{len(integrations)} unused integrations ({', '.join(integrations)}), and "
        f"{len(gone) - len(named) - len(integrations)} tests and stubs inside packages"
    )
    print(
        f"slim_venv: packed {len(names)} pure-Python packages, {plain / mb:.1f} MB as files, into "
        f"{ZIP_NAME} of {zipped / mb:.1f} MB"
    )
    print(f"slim_venv: generated protobuf modules as bytecode only: {generated / mb:.1f} MB less")
    if args.strip:
        print(f"slim_venv: stripped extension modules' symbol tables: {stripped / mb:.1f} MB")
    print(f"slim_venv: {args.venv} {before / mb:.1f} MB -> {size(args.venv) / mb:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
