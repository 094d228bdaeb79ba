"""The releases, oldest first: each one's version, its git tag, and the commit it was cut from.

The version being built is pyproject.toml's. Its previous release is the newest one here older than it: `make
upgrade` upgrades from it (tests/upgrade/), the retirement rule counts from it (tests/test_patches.py), and the replay
corpus keeps no history older than it (tests/test_replay.py). Cutting a release: tag its commit `v<version>`, add
its row here, and move pyproject.toml to the next version (tests/test_release.py holds every row older than it).

`python -m tests.releases history-tag` prints the prefix of this version's recorded histories (`make histories`).
"""

from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Release:
    version: str
    tag: str  # "" when none was made: the commit is then the release
    commit: str  # the full hash the release was cut from (the tag's commit, once there is a tag)


RELEASES: tuple[Release, ...] = (
    # The 0.2 line was never tagged: its last commit before 0.3.0 folded its workflow patches stands for it.
    Release("0.2.0a0", "", "d16e06029f7738a7524246af4f92bdb10a8e4e2c"),
    Release("0.3.0", "v0.3.0", "c35c1300b72467b0fe80ef1d9dcd3c3cdd84da50"),
)


def current() -> str:
    """The version being built (pyproject.toml: the one place it is written)."""
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def release_of(version: str) -> Version:
    """The release a version belongs to: a development version (0.4.0.dev1) is on its way to its release."""
    return Version(Version(version).base_version) if Version(version).is_devrelease else Version(version)


def previous(version: str | None = None, releases: tuple[Release, ...] = RELEASES) -> Release | None:
    """The newest release older than `version` (the current one by default): what an upgrade comes from."""
    line = release_of(version or current())
    older = [r for r in releases if Version(r.version) < line]
    return max(older, key=lambda r: Version(r.version), default=None)


def history_tag(version: str | None = None) -> str:
    """The prefix of the histories recorded by a version: `r<release>` (`r0.3.0-boot_ends_ready-00.json`)."""
    return f"r{release_of(version or current())}"


if __name__ == "__main__":
    if sys.argv[1:] != ["history-tag"]:
        sys.exit("usage: python -m tests.releases history-tag")
    print(history_tag())
