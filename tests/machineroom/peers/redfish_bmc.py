"""A Redfish BMC: sushy-tools' dynamic emulator (its Flask application, unchanged) with its fake systems driver (the
backend that needs no hypervisor: libvirt's test:///default would need libvirt's Python binding built against
libvirt here, and nova/ironic a cloud), over HTTPS with a certificate of the machine room's CA and HTTP basic
authentication from an htpasswd file (bcrypt), as sushy-tools configures both.

What the harness adds around it, and nothing inside it:
- the machine's power follows the BMC's: a thread reads the system's PowerState through the driver every 0.3 s
  (the fake driver applies a pending reset when it is read, 1 to 11 s after it was asked, as hardware is slow)
  and writes it to the machine's state directory;
- a fault switch (`fault.json` in the state directory: `{"status": 503, "message": "...", "times": 1}`) answers the
  next POSTs to the Reset action with that status and a Redfish error body, as a busy or refusing BMC does.

    python3 -m tests.machineroom.peers.redfish_bmc <config.json>
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tests.machineroom.peers import state

FAULT = "fault.json"
StartResponse = Callable[..., Any]


def redfish_error(status: int, message: str) -> bytes:
    """A Redfish error body (DSP0266 §9.6, as sushy-tools renders its own errors)."""
    message_id = {400: "Base.1.8.ActionParameterValueNotInList", 409: "Base.1.8.ResourceInUse",
                  503: "Base.1.8.ServiceTemporarilyUnavailable"}.get(status, "Base.1.8.InternalError")  # fmt: skip
    return json.dumps({"error": {"code": message_id, "message": message,
                                 "@Message.ExtendedInfo": [{"MessageId": message_id, "Message": message,
                                                             "Severity": "Critical"}]}}).encode()  # fmt: skip


class Faults:
    """WSGI middleware in front of sushy-tools: the fault switch for the Reset action."""

    def __init__(self, app: Callable[[dict[str, Any], StartResponse], Iterable[bytes]], machine: Path) -> None:
        self.app = app
        self.machine = machine

    def __call__(self, env: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = self.machine / FAULT
        if env.get("REQUEST_METHOD") == "POST" and env.get("PATH_INFO", "").endswith("/ComputerSystem.Reset"):
            state.event(self.machine, "redfish", "POST ComputerSystem.Reset")
            try:
                fault = json.loads(path.read_text())
            except FileNotFoundError:
                fault = None
            if fault:
                times = int(fault.get("times", 1)) - 1
                if times > 0:
                    state.write(path, json.dumps({**fault, "times": times}))
                else:
                    path.unlink(missing_ok=True)
                status = int(fault["status"])
                body = redfish_error(status, str(fault["message"]))
                state.event(self.machine, "redfish", f"fault: answered {status} to a Reset")
                reason = {400: "BAD REQUEST", 409: "CONFLICT", 500: "INTERNAL SERVER ERROR"}.get(status, "ERROR")
                start_response(f"{status} {reason}", [("Content-Type", "application/json"),
                                                      ("Content-Length", str(len(body)))])  # fmt: skip
                return [body]
        return self.app(env, start_response)


def follow_power(app: Any, uuid: str, machine: Path) -> None:
    """The machine's power is the BMC's: read it as a client would, and write it where the harness looks."""
    while True:
        try:
            now = "on" if app.systems.get_power_state(uuid) == "On" else "off"
        except Exception as exc:  # the thread reports, never dies
            state.event(machine, "redfish", f"reading the power state failed: {exc}")
            time.sleep(1)
            continue
        state.set_power(machine, now, "redfish", "the BMC's PowerState")
        time.sleep(0.3)


def main(argv: list[str]) -> int:
    cfg = json.loads(Path(argv[0]).read_text())
    machine = Path(cfg["state"])
    from sushy_tools.emulator import main as sushy

    app = sushy.app
    app.wsgi_app = Faults(app.wsgi_app, machine)  # behind sushy-tools' authentication, which configure() adds
    app.configure(extra_config={
        "SUSHY_EMULATOR_FAKE_DRIVER": True,
        "SUSHY_EMULATOR_STATE_DIR": str(machine / "sushy"),
        "SUSHY_EMULATOR_FAKE_SYSTEMS": [{
            "uuid": cfg["uuid"], "name": cfg["name"], "power_state": "On" if state.power(machine) == "on" else "Off",
            "nics": [{"mac": cfg["mac"], "ip": cfg["os_address"]}],
        }],
        "SUSHY_EMULATOR_AUTH_FILE": cfg["htpasswd"],
        "SUSHY_EMULATOR_LISTEN_IP": cfg["address"],
        "SUSHY_EMULATOR_LISTEN_PORT": cfg["port"],
        "SUSHY_EMULATOR_SSL_CERT": cfg["cert"],
        "SUSHY_EMULATOR_SSL_KEY": cfg["key"],
    })  # fmt: skip
    threading.Thread(target=follow_power, args=(app, cfg["uuid"], machine), daemon=True).start()
    state.event(machine, "redfish", f"sushy-tools (fake driver) listening on https://{cfg['address']}:{cfg['port']}")
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cfg["cert"], cfg["key"])
    app.run(host=cfg["address"], port=cfg["port"], ssl_context=ctx, threaded=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
