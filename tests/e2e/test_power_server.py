"""The e2e power switch against a stand-in `docker` (a shell script keeping container states in files), so
its contract holds here even though the kind suite itself only runs where docker and kind exist."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.power_server import Machines, serve

FAKE_DOCKER = """#!/bin/sh
# docker start|stop|inspect --format ... NAME, with state in $DIR/NAME; a name containing "broken" fails.
dir="$(dirname "$0")/state"
verb="$1"; eval name=\\${$#}
case "$name" in *broken*) echo "Error: cannot $verb $name" >&2; exit 1;; esac
case "$verb" in
  start) echo true > "$dir/$name";;
  stop) echo false > "$dir/$name";;
  inspect) cat "$dir/$name";;
esac
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    docker = tmp_path / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    (tmp_path / "state").mkdir()
    for name in ("m1", "m2-broken", "control-plane"):
        (tmp_path / "state" / name).write_text("true\n")
    srv = serve(Machines(["m1", "m2-broken"], docker=str(docker)), host="127.0.0.1", port=0)
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def call(url: str, method: str = "GET") -> tuple[int, Any]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_off_and_on_again(server: str) -> None:
    assert call(f"{server}/machines/m1") == (200, {"machine": "m1", "power": "on"})
    assert call(f"{server}/machines/m1/off", "POST") == (200, {"machine": "m1", "power": "off"})
    assert call(f"{server}/machines/m1")[1]["power"] == "off"
    assert call(f"{server}/machines/m1/on", "POST")[0] == 200
    assert [(e["machine"], e["power"]) for e in call(f"{server}/log")[1]] == [("m1", "off"), ("m1", "on")]


def test_only_listed_machines_can_be_switched(server: str) -> None:
    status, body = call(f"{server}/machines/control-plane/off", "POST")
    assert status == 404 and "not a machine" in body["error"]


def test_a_docker_failure_is_an_http_error_so_curl_f_fails_the_job(server: str) -> None:
    status, body = call(f"{server}/machines/m2-broken/off", "POST")
    assert status == 502 and "cannot stop" in body["error"]


def test_unknown_paths_are_404(server: str) -> None:
    assert call(f"{server}/machines/m1/reboot", "POST")[0] == 404
    assert call(f"{server}/nothing")[0] == 404
