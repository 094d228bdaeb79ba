"""The Temporal client's certificate renewed under a running process (homelab_autoscaler/renewal.py): a change of the
mounted files connects again, once; a failed attempt is said and tried again, the connection in use kept."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from homelab_autoscaler.renewal import FilesSeen, renew_on_change


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


async def test_a_renewal_connects_again_once_and_a_failed_one_is_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cert, key, ca = files(tmp_path)
    stop = asyncio.Event()
    calls: list[bytes] = []
    fail = [True]

    async def renew() -> None:
        calls.append(cert.read_bytes())
        if fail[0]:
            fail[0] = False
            raise RuntimeError("the frontend refused the new certificate")

    watching = asyncio.create_task(renew_on_change([cert, key, ca], renew, stop, every=0.05))

    async def until(what: str, check: Callable[[], bool]) -> None:
        for _ in range(200):
            if check():
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"waited 4 s for {what}")

    await asyncio.sleep(0.2)
    assert calls == [] and not watching.done()  # unchanged files: nothing to do
    with caplog.at_level(logging.INFO, logger="homelab_autoscaler.renewal"):
        cert.write_bytes(b"tls.crt v2")
        await until("a second attempt after the failed one", lambda: len(calls) == 2)
        await asyncio.sleep(0.3)
    assert calls == [b"tls.crt v2", b"tls.crt v2"], calls  # tried again, then taken: once more only
    assert "connecting with it failed" in caplog.text and "connected to Temporal again" in caplog.text
    assert not stop.is_set(), "a renewal never stops the process"
    stop.set()
    await asyncio.wait_for(watching, timeout=2)
