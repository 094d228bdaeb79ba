"""A STAND-IN for a Shelly Gen2 smart plug (no real plug exists here), written from Shelly's published Gen2 API
(shelly-api-docs.shelly.cloud, "Gen2+ Device API": RPC over HTTP, the Switch component, authentication). What it
serves, as the firmware does:

- `GET /rpc/<Method>?<params>` and `POST /rpc` with a JSON-RPC frame `{"id", "method", "params"}`;
- `Shelly.GetDeviceInfo` (always without authentication, as on the device), `Switch.Set` (`id`, `on`; answers
  `{"was_on": bool}`), `Switch.Toggle`, `Switch.GetStatus` (`id`, `source`, `output`, `apower`, `voltage`, ...);
- authentication when a password is set: HTTP Digest (RFC 7616) with `algorithm=SHA-256`, `qop="auth"`, user
  `admin` and the device id as the realm; a wrong or missing answer gets 401 and a fresh challenge;
- errors as the device words them: `{"code": <n>, "message": "..."}` with 404 for an unknown method and 400
  (code -103) for an invalid argument.

The plug feeds the machine: switching on restores AC, and a machine whose firmware powers on after AC loss boots;
switching off cuts the power, and cutting it under a running OS is logged as the harm it is.

    python3 -m tests.machineroom.peers.plug <address> <port> <state-dir> <device-id> <password-file or "">
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sys
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.machineroom.peers import state

RELAY = "relay"
USER = "admin"


class Plug:
    def __init__(self, machine: Path, device_id: str, password: str) -> None:
        self.machine = machine
        self.device_id = device_id
        self.password = password
        self.nonces: set[str] = set()

    @property
    def output(self) -> bool:
        try:
            return (self.machine / RELAY).read_text().strip() == "on"
        except FileNotFoundError:
            return False

    def switch(self, on: bool) -> bool:
        was_on = self.output
        if on == was_on:
            return was_on
        state.write(self.machine / RELAY, "on" if on else "off")
        state.event(self.machine, "plug", f"relay {'on' if on else 'off'}")
        if on and state.config(self.machine)["ac_power_on"]:
            state.set_power(self.machine, "on", "plug", "AC restored; the firmware powers on after AC loss")
        elif on:
            state.event(self.machine, "plug", "AC restored; the firmware stays off after AC loss")
        elif state.power(self.machine) == "on":
            state.set_power(self.machine, "off", "plug", "POWER CUT UNDER A RUNNING OS")
        return was_on

    def call(self, method: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if method == "Shelly.GetDeviceInfo":
            return 200, {"name": None, "id": self.device_id, "mac": self.device_id.rsplit("-", 1)[-1].upper(),
                         "model": "SNPL-00112EU", "gen": 2, "fw_id": "20231107-164738/1.0.8-g8c7bb8d",
                         "ver": "1.0.8", "app": "PlusPlugS", "auth_en": bool(self.password),
                         "auth_domain": self.device_id if self.password else None}  # fmt: skip
        if method not in ("Switch.Set", "Switch.Toggle", "Switch.GetStatus"):
            return 404, {"code": 404, "message": f"No handler for {method}"}
        if str(params.get("id", "")) != "0":
            return 400, {"code": -105, "message": f"Argument 'id', value {params.get('id')} not found!"}
        if method == "Switch.GetStatus":
            on = self.output
            watts, amps = (38.4, 0.17) if on else (0.0, 0.0)
            return 200, {"id": 0, "source": "http", "output": on, "apower": watts, "voltage": 230.1, "current": amps,
                         "aenergy": {"total": 1234.5}, "temperature": {"tC": 31.2}}  # fmt: skip
        if method == "Switch.Toggle":
            return 200, {"was_on": self.switch(not self.output)}
        given = params.get("on")
        wanted = {"true": True, "false": False}.get(given) if isinstance(given, str) else given
        if not isinstance(wanted, bool):
            return 400, {"code": -103, "message": "Invalid argument 'on': expected boolean!"}
        return 200, {"was_on": self.switch(wanted)}

    # --- Digest authentication (RFC 7616, SHA-256), as the Gen2 firmware asks for it --------------------------
    def challenge(self) -> str:
        nonce = secrets.token_hex(16)
        self.nonces.add(nonce)
        return f'Digest qop="auth", realm="{self.device_id}", nonce="{nonce}", algorithm=SHA-256'

    def authorized(self, method: str, header: str | None) -> bool:
        if not self.password:
            return True
        if not header or not header.startswith("Digest "):
            return False
        fields = dict(urllib.request.parse_keqv_list(urllib.request.parse_http_list(header[len("Digest ") :])))
        if fields.get("algorithm", "MD5").upper() != "SHA-256" or fields.get("nonce") not in self.nonces:
            return False

        def h(text: str) -> str:
            return hashlib.sha256(text.encode()).hexdigest()

        ha1 = h(f"{fields.get('username')}:{self.device_id}:{self.password}")
        ha2 = h(f"{method}:{fields.get('uri')}")
        want = h(f"{ha1}:{fields['nonce']}:{fields.get('nc')}:{fields.get('cnonce')}:{fields.get('qop')}:{ha2}")
        return fields.get("username") == USER and secrets.compare_digest(want, fields.get("response", ""))


def handler(plug: Plug) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "ShellyGen2-standin"

        def _answer(self, code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _rpc(self, method: str, params: dict[str, Any], frame_id: Any = None) -> None:
            if method != "Shelly.GetDeviceInfo" and not plug.authorized(
                self.command, self.headers.get("Authorization")
            ):
                state.event(plug.machine, "plug", f"401 for {method}")
                self._answer(401, {"code": 401, "message": "Unauthorized"}, {"WWW-Authenticate": plug.challenge()})
                return
            code, result = plug.call(method, params)
            if frame_id is not None:
                result = {
                    "id": frame_id,
                    "src": plug.device_id,
                    **({"result": result} if code == 200 else {"error": result}),
                }
            self._answer(code, result)

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            if not url.path.startswith("/rpc/"):
                self._answer(404, {"code": 404, "message": "Not found"})
                return
            self._rpc(url.path[len("/rpc/") :], dict(urllib.parse.parse_qsl(url.query)))

        def do_POST(self) -> None:
            if self.path != "/rpc":
                self._answer(404, {"code": 404, "message": "Not found"})
                return
            try:
                frame = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            except ValueError:
                self._answer(400, {"code": -32700, "message": "Parse error"})
                return
            self._rpc(str(frame.get("method", "")), dict(frame.get("params") or {}), frame.get("id", 0))

        def log_message(self, format: str, *args: Any) -> None:
            sys.stderr.write(f"plug {self.address_string()} {format % args}\n")

    return Handler


def main(argv: list[str]) -> int:
    address, port, machine, device_id, password_file = argv[0], int(argv[1]), Path(argv[2]), argv[3], argv[4]
    password = Path(password_file).read_text().strip() if password_file else ""
    plug = Plug(machine, device_id, password)
    server = ThreadingHTTPServer((address, port), handler(plug))
    state.event(machine, "plug", f"Shelly Gen2 RPC stand-in listening on {address}:{port}")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
