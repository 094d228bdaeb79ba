"""The machine room's peers and hooks, each a module run inside a network namespace (`python3 -m
tests.machineroom.peers.<name> ...`, the repository on PYTHONPATH): they import nothing of the project but each
other, so they run under the machine room's own Python (sushy-tools lives there).

Every one of them keeps its machine's state in the machine's directory, the protocol `state.py` reads:
`power` ("on"/"off", written whole by rename), `events.log` (one line per thing that happened), `config.json`
(the machine's firmware settings: wake-on-LAN, power on after AC loss, whether its OS boots)."""
