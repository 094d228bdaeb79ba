"""Regenerate the Python modules of `proto/*.proto`: `python -m proto.generate` (or `--out DIR` to compare).

Generated with protoc from `grpcio-tools`, with the repository root as the include path, so the modules import
one another as `proto.<name>_pb2` and the package works wherever the project is installed. The output is
committed; `tests/test_proto.py` regenerates into a temporary directory and fails when the committed files
are stale.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCES = ("externalgrpc.proto", "k8s_node.proto")
# protoc writes these for each source; only the service file gets a *_pb2_grpc.py.
SERVICES = ("externalgrpc.proto",)
# protoc's gRPC plugin writes untyped code and no stub; mypy follows our imports into it, so it is told to
# accept the file as it is (the message modules come with .pyi stubs and stay checked through them).
GRPC_HEADER = "# mypy: ignore-errors\n"


def outputs(source: str) -> list[str]:
    """The file names protoc generates for one source, relative to the output's `proto/` directory."""
    stem = source.removesuffix(".proto")
    names = [f"{stem}_pb2.py", f"{stem}_pb2.pyi"]
    if source in SERVICES:
        names.append(f"{stem}_pb2_grpc.py")
    return names


def generate(out: Path) -> list[Path]:
    """Run protoc for every source into `out/proto/`; return the files written."""
    target = out / "proto"
    target.mkdir(parents=True, exist_ok=True)
    well_known = str(resources.files("grpc_tools") / "_proto")
    for source in SOURCES:
        args = [
            "grpc_tools.protoc",
            f"-I{ROOT}",
            f"-I{well_known}",
            f"--python_out={out}",
            f"--pyi_out={out}",
        ]
        if source in SERVICES:
            args.append(f"--grpc_python_out={out}")
        args.append(str(ROOT / "proto" / source))
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on proto/{source}")
    for source in SERVICES:
        stub = target / f"{source.removesuffix('.proto')}_pb2_grpc.py"
        stub.write_text(GRPC_HEADER + stub.read_text())
    return [target / name for source in SOURCES for name in outputs(source)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proto.generate", description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT, help="directory that receives proto/*_pb2*.py")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
