"""The slow images of `make e2e-pods` (the operator's for both platforms, the previous release's, their bases and
PostgreSQL's stand-in), by the recipes the tier uses and into the cache it reads: `python -m
tests.realcluster.prebuild` is how .ci/run builds them ahead, niced, while the test phases leave the CPU idle. The
tier then finds them cached; what this run did not build, the tier builds as before.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests import releases
from tests.realcluster.images import (
    Builder,
    Built,
    export_commit,
    machine_arch,
    previous_image_commit,
    resolve_commit,
)
from tests.realcluster.node import remove_strays, strays
from tests.upgrade.previous import source_of

PREVIOUS = "homelab-autoscaler-previous"


@dataclass
class OperatorImages:
    """What `operator_images` made: by the tier's names, the two bases, the index's members, the previous commit."""

    built: dict[str, Built] = field(default_factory=dict)
    bases: list[Built] = field(default_factory=list)
    members: list[Built] = field(default_factory=list)
    previous_commit: str | None = None


def operator_images(b: Builder, workdir: Path) -> OperatorImages:
    """PostgreSQL's stand-in; the operator's image for both platforms under one tag (issue 42: the arm64 one built
    under emulation); the release before this checkout's, for the rollout while claims are in flight."""
    out = OperatorImages()
    out.built["postgresql"] = b.postgresql()
    base = b.python_base()
    out.built["python-base"] = base
    out.bases = [base, b.python_base("linux/arm64")]
    # A foreign platform's image: its build stages on the machine's base (the Dockerfile's BUILD_PYTHON_IMAGE).
    machine = f"linux/{machine_arch()}"
    own = next((each for each in out.bases if each.platform == machine), None)
    out.members = [b.operator(base=each, builder_base=None if each.platform == machine else own) for each in out.bases]
    out.built["homelab-autoscaler"] = b.index("homelab-autoscaler", out.members)
    # tests/releases.py's previous release (the one `make upgrade` upgrades from, the supported upgrade), built from
    # its own Dockerfile; with none recorded, the nearest earlier commit whose image differs (a clone without it says
    # so there). HOMELAB_E2E_PREVIOUS names another (an older release, to roll across more history).
    given = os.environ.get("HOMELAB_E2E_PREVIOUS", "")
    release = releases.previous()
    if given:
        out.previous_commit = resolve_commit(given)
    elif release is not None:
        out.previous_commit = source_of(release)  # its tag, or its commit in a clone without tags
    else:
        out.previous_commit = previous_image_commit()
    if out.previous_commit is not None:
        source = export_commit(out.previous_commit, workdir / "previous")
        out.built[PREVIOUS] = b.operator(source, base=base, note=f" (the previous release, {out.previous_commit[:10]})")
    return out


def main() -> int:
    began = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="hlas-prebuild-"))
    before = strays()  # buildah's CNI lock, as PodStack removes it: what this run adds outside its directory goes
    try:
        operator_images(Builder(workdir / "images"), workdir)
    finally:
        remove_strays(before)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"prebuild: the operator's images ready in {time.monotonic() - began:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
