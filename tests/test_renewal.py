"""The Temporal client's certificate renewed under a running process (homelab_autoscaler/renewal.py): the process
stops so that its container starts again with it, and nothing else makes it stop."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from homelab_autoscaler.renewal import FilesSeen, stop_on_renewal


def files(tmp_path: Path) -> list[Path]:
    out = []
    for name in ("tls.crt", "tls.key", "ca.crt"):
        path = tmp_path / name
        path.write_bytes(f"{name} v1".encode())
        out.append(path)
    return out


def test_a_changed_file_is_named_a_missing_or_unchanged_one_is_not(tmp_path: Path) -> None:
    cert, key, ca = files(tmp_path)
    seen = FilesSeen([cert, key, ca])
    assert seen.changed() is None
    key.unlink()  # the kubelet swaps the volume's directory: a moment without the file is no renewal
    assert seen.changed() is None
    key.write_bytes(b"tls.key v1")
    ca.write_bytes(b"ca.crt v2")
    assert seen.changed() == ca


async def test_the_process_stops_once_the_certificate_is_renewed_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cert, key, ca = files(tmp_path)
    stop = asyncio.Event()
    watching = asyncio.create_task(stop_on_renewal([cert, key, ca], stop, every=0.05))
    await asyncio.sleep(0.2)
    assert not stop.is_set() and not watching.done()  # unchanged files: it keeps running
    with caplog.at_level(logging.WARNING, logger="homelab_autoscaler.renewal"):
        cert.write_bytes(b"tls.crt v2")
        await asyncio.wait_for(watching, timeout=5)
    assert stop.is_set()
    assert f"{cert} changed" in caplog.text and "starts again" in caplog.text


async def test_a_stop_for_another_reason_ends_the_watch_at_once(tmp_path: Path) -> None:
    stop = asyncio.Event()
    watching = asyncio.create_task(stop_on_renewal(files(tmp_path), stop, every=60))
    await asyncio.sleep(0)
    stop.set()
    await asyncio.wait_for(watching, timeout=2)
