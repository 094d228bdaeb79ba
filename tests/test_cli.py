"""The CLI as people meet it: every subcommand has help, every bad setting is one clear line and exit 2, a
command offers only the settings its roles read, and `dev` checks what a person can get wrong (the homelab
file, every port) before it touches anything."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from homelab_autoscaler import autoscaler, cli, commands, roles
from homelab_autoscaler.cli import (
    ALL_SETTINGS,
    CLAIMS_SECTIONS,
    ENV_PREFIX,
    build_cli,
    load_settings,
    main,
    section_settings,
)
from homelab_autoscaler.settings import LoggingSettings, MetricsSettings, NamespaceSettings
from kube.settings import KubeSettings
from provider.settings import ProviderSettings
from tests.procs import BIN, ROOT, free_port

HELP = [
    (["run"], "--provider-address"),
    (["worker"], "--temporal-address"),
    (["provider"], "--tls-ca"),
    (["watch"], "--lease-name"),
    (["dev"], "--simulate"),
    (["claims", "list"], "--phase"),
    (["claims", "show"], "NAME"),
    (["claims", "reset-shutdown-streak"], "NAME"),
    (["autoscaler"], "--provider-address"),
    (["autoscaler", "nodes"], "GROUP"),
    (["autoscaler", "increase"], "DELTA"),
    (["autoscaler", "delete-nodes"], "NODES"),
]


@pytest.mark.parametrize(("argv", "mentions"), HELP, ids=[" ".join(a) for a, _ in HELP])
def test_every_subcommand_has_help(argv: list[str], mentions: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--help"]) == 0
    assert mentions in capsys.readouterr().out


def flags_in_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> set[str]:
    assert main([*argv, "--help"]) == 0
    return set(re.findall(r"(?m)^\s+(--[a-z-]+)", capsys.readouterr().out))


COMMANDS = {**{name: command.sections for name, command in roles.ROLES.items()}, "dev": commands.DEV_SECTIONS}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_offers_exactly_the_settings_of_its_sections(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = {s.flag for section in COMMANDS[command] for s in section_settings(section)}
    offered = flags_in_help([command], capsys) - {"--config", "--help"}
    assert offered == {f for f in offered if f.startswith("--no-")} | expected


@pytest.mark.parametrize("command", ["list", "show", "reset-shutdown-streak"])
def test_claims_commands_take_only_what_a_client_of_temporal_needs(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    offered = flags_in_help(["claims", command], capsys)
    assert CLAIMS_SECTIONS == ("temporal",)
    assert {f for f in offered if f.startswith("--temporal")} == {s.flag for s in section_settings("temporal")}
    own = {"--config", "--help", "--group", "--slot", "--phase", "--namespace"}
    assert offered - own == {s.flag for s in section_settings("temporal")}, "no worker, metrics or health setting"
    assert main(["claims", command, "--metrics-address", "127.0.0.1:9464"]) == 2, "claims bind no metrics port"


def test_no_flag_means_two_things() -> None:
    names = [s.name for s in ALL_SETTINGS.values()]
    assert len(names) == len(set(names))
    # the provider and the watchers read one namespaces setting, with one meaning
    assert ALL_SETTINGS["namespaces"].section == "namespaces"
    assert "namespaces" in roles.PROVIDER.sections and "namespaces" in roles.WATCH.sections
    assert not any(f.alias == "namespaces" for f in ProviderSettings.model_fields.values())


BAD = [
    (["worker", "--log-level", "LOUD"], "log_level"),
    (["worker", "--activity-threads", "0"], "activity_threads"),
    (["run", "--task-pollers", "0"], "task_pollers"),
    (["worker", "--kube-timeout-seconds", "soon"], "kube_timeout_seconds"),
    (["worker", "--temporal-tls-cert", "/nonexistent.pem"], "temporal_tls_cert"),
    (["provider", "--provider-address", "0.0.0.0:8086"], "insecure"),
    (["watch", "--health-port", "99999"], "health_port"),
    (["watch", "--lease-duration-seconds", "-1"], "lease_duration_seconds"),
    (["run", "--log-format", "xml"], "log_format"),
    (["dev", "--temporal-port", "0"], "temporal_port"),
    (["dev", "--time-scale", "-2"], "time_scale"),
    (["claims", "list", "--temporal-namespace", ""], "temporal_namespace"),
    (["worker", "--config", "/nonexistent/settings.yaml"], "config file"),
]


@pytest.mark.parametrize(("argv", "names"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_setting_is_one_clear_line(argv: list[str], names: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert names in err


def test_a_config_file_with_an_unknown_key_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text("temporal_adress: 10.0.0.1:7233\n")
    assert main(["worker", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "unknown setting temporal_adress (did you mean temporal_address?)" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("log_level: [DEBUG\n", "not valid YAML"),
        ("- log_level\n", "expected a mapping"),
        ("log_level: LOUD\n", "log_level"),
    ],
)
def test_a_bad_config_file_is_one_line(
    text: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text(text)
    assert main(["worker", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


def test_one_config_file_serves_every_role(tmp_path: Path) -> None:
    """Keys of another command's sections are ignored (one file for a Deployment's every container)."""
    config = tmp_path / "settings.yaml"
    config.write_text("provider_address: 0.0.0.0:8086\ninsecure: true\nlog_level: DEBUG\nnamespaces: [a, b]\n")
    worker = load_settings(roles.ROLES["worker"].sections, {}, config, environ={})
    assert worker.section(LoggingSettings).level == "DEBUG" and not worker.has(ProviderSettings)
    run = load_settings(roles.ROLES["run"].sections, {}, config, environ={})
    assert run.section(ProviderSettings).address == "0.0.0.0:8086" and run.section(ProviderSettings).insecure
    assert run.section(NamespaceSettings).namespaces == ["a", "b"]


def test_values_from_the_environment_are_read_as_written() -> None:
    env = {
        "HOMELAB_AUTOSCALER_METRICS_ADDRESS": "",  # set but empty: metrics off, not the default
        "HOMELAB_AUTOSCALER_NAMESPACES": "a, b",
        "HOMELAB_AUTOSCALER_KUBE_TIMEOUT_SECONDS": "3",
        "HOMELAB_AUTOSCALER_INSECURE": "yes",
        "HOMELAB_AUTOSCALER_PROVIDER_ADDRESS": "0.0.0.0:1",
    }
    s = load_settings(roles.ROLES["run"].sections, {}, None, environ=env)
    assert s.section(MetricsSettings).address == ""
    assert s.section(NamespaceSettings).namespaces == ["a", "b"]
    assert s.section(KubeSettings).timeout_seconds == 3.0
    assert s.section(ProviderSettings).insecure
    flags = load_settings(
        roles.ROLES["run"].sections, {"insecure": False, "provider_address": "127.0.0.1:1"}, None, env
    )
    assert not flags.section(ProviderSettings).insecure, "--no-insecure beats the environment"


def test_environment_and_file_and_flags_in_that_order(tmp_path: Path) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text("log_level: DEBUG\ntask_queue: from-file\n")
    res = subprocess.run(
        [str(BIN / "homelab-autoscaler"), "worker", "--config", str(config), "--log-level", "LOUD"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"HOMELAB_AUTOSCALER_LOG_LEVEL": "WARNING", "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 2 and "log_level" in res.stderr, "the flag wins over the environment and the file"


def test_log_lines_name_the_claim_from_temporal_context() -> None:
    import json
    import logging

    from homelab_autoscaler.roles import ClaimContext, JsonFormatter

    record = logging.LogRecord("temporalio.activity", logging.INFO, __file__, 1, "startup Job created", (), None)
    record.temporal_activity = {"workflow_id": "nodeclaim/homelab/worker-1-abc123", "activity_type": "create_job"}
    assert ClaimContext().filter(record)
    doc = json.loads(JsonFormatter().format(record))
    assert doc["claim"] == "worker-1-abc123" and doc["message"] == "startup Job created"
    plain = logging.LogRecord("x", logging.INFO, __file__, 1, "reloaded", (), None)
    plain.temporal_workflow = {"workflow_id": "group/homelab/workers"}
    ClaimContext().filter(plain)
    assert plain.context == "group=workers"  # type: ignore[attr-defined]


# --- dev: what a newcomer gets wrong, said in one line before anything starts ------------------------------------
CLI = str(BIN / "homelab-autoscaler")


def dev(args: list[str], state: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`dev --simulate` on free ports (unless `args` say otherwise), with its own state directory."""
    ports = {
        "--temporal-port": str(free_port()),
        "--ui-port": str(free_port()),
        "--kube-port": str(free_port()),
        "--provider-address": f"127.0.0.1:{free_port()}",
        "--health-port": str(free_port()),
        "--metrics-address": f"127.0.0.1:{free_port()}",
    }
    given = {a for a in args if a.startswith("--")}
    argv = [CLI, "dev", "--simulate", *args]
    for flag, value in ports.items():
        if flag not in given:
            argv += [flag, value]
    env = {**os.environ, "XDG_STATE_HOME": str(state)}
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    """A port something already listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s


def saying_one_line(state: Path) -> float:
    """Real seconds `dev` takes here and now to start and refuse a bad setting (before any port is looked at): what
    a refusal costs on this machine before it waits for anything. Beside pytest-xdist's workers on a busy 2-core
    box the bare start took half a minute, and a fixed bound on the busy-port refusal failed for it."""
    started = time.monotonic()
    res = dev(["--time-scale", "-2"], state)
    assert res.returncode == 2 and "time_scale" in res.stderr, res.stderr
    return time.monotonic() - started


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A state directory holding the database of a `dev --simulate` already running."""
    db = tmp_path / "homelab-autoscaler" / "temporal-simulated.db"
    db.parent.mkdir(parents=True)
    db.write_bytes(b"the first run's claims")
    return tmp_path


BUSY = [
    ("--temporal-port", "{port}", "the embedded Temporal server"),
    ("--ui-port", "{port}", "the Temporal Web UI"),
    ("--kube-port", "{port}", "the simulated homelab's API server"),
    ("--provider-address", "127.0.0.1:{port}", "the provider"),
    ("--health-port", "{port}", "the health endpoints"),
    ("--metrics-address", "127.0.0.1:{port}", "/metrics"),
]


@pytest.mark.parametrize(("flag", "value", "what"), BUSY, ids=[b[0] for b in BUSY])
@pytest.mark.system
def test_dev_stops_on_a_busy_port_before_touching_anything(
    flag: str, value: str, what: str, listening: socket.socket, state: Path
) -> None:
    port = listening.getsockname()[1]
    started = time.monotonic()
    res = dev([flag, value.format(port=port)], state)
    assert res.returncode == 2, res.stderr
    err = res.stderr.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert f"127.0.0.1:{port}" in err and what in err and f"move it with {flag}" in err, err
    assert not res.stdout, "nothing started"
    assert (state / "homelab-autoscaler" / "temporal-simulated.db").read_bytes() == b"the first run's claims"
    took = time.monotonic() - started
    # Within 30 s of what a bare refusal takes here and now, measured only when it took longer than 30 s.
    assert took < 30 or took < saying_one_line(state) + 30, f"it waited for something before refusing ({took:.0f} s)"


@pytest.mark.system
def test_dev_refuses_two_roles_on_one_port(state: Path) -> None:
    port = str(free_port())
    res = dev(["--kube-port", port, "--health-port", port], state)
    assert res.returncode == 2 and "--kube-port and --health-port both ask for port" in res.stderr, res.stderr


HOMELABS = [
    (None, "no such file"),
    ("", "is empty"),
    ("groups: [workers\n", ":2:1: not valid YAML"),
    ("apiVersion: sim.homelab-autoscaler.dev/v1\nkind: Homelab\nslots: 3\n", "slots"),
]


@pytest.mark.parametrize(("text", "says"), HOMELABS, ids=["missing", "empty", "malformed", "invalid"])
@pytest.mark.system
def test_a_bad_homelab_file_is_one_line(text: str | None, says: str, tmp_path: Path, state: Path) -> None:
    homelab = tmp_path / "homelab.yaml"
    if text is not None:
        homelab.write_text(text)
    res = dev(["--homelab", str(homelab)], state)
    assert res.returncode == 2, res.stderr
    err = res.stderr.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert f"--homelab {homelab}" in err and says in err and "deploy/examples/homelab.yaml" in err, err
    assert (state / "homelab-autoscaler" / "temporal-simulated.db").exists(), "nothing deleted"


# --- every setting of every command, a bad value each: one line, exit 2, nothing started (issue 23) ----------
# One representative mistake per setting. A new setting without one fails the first test below.
BAD_VALUES: dict[str, str] = {
    "temporal_address": "nonsense",
    "temporal_namespace": "",
    "temporal_tls_ca": "/nonexistent/ca.pem",
    "temporal_tls_cert": "/nonexistent/client.pem",
    "temporal_tls_key": "/nonexistent/client.key",
    "temporal_tls_server_name": "not a host",
    "temporal_api_key": "two words",
    "task_queue": "",
    "kube_server": "nonsense",
    "kubeconfig": "/nonexistent/kubeconfig",
    "kube_context": "no-such-context",
    "kube_timeout_seconds": "soon",
    "namespaces": "Not_A_Namespace",
    "activity_threads": "0",
    "task_pollers": "0",
    "poller_autoscaling": "maybe",
    "workflow_task_slots": "0",
    "cached_workflows": "0",
    "provider_address": "nonsense",
    "tls_cert": "/nonexistent/server.pem",
    "tls_key": "/nonexistent/server.key",
    "tls_ca": "/nonexistent/ca.pem",
    "insecure": "maybe",
    "gpu_label": "not a label",
    "gpu_types": "not a label value",
    "pricing_window_seconds": "0",
    "rpc_timeout_seconds": "60",
    "catalog_ttl_seconds": "-1",
    "webhook_address": "nonsense",
    "webhook_tls_cert": "/nonexistent/webhook.pem",
    "webhook_tls_key": "/nonexistent/webhook.key",
    "lease_namespace": "Not_A_Namespace",
    "lease_name": "Not_A_Name",
    "lease_duration_seconds": "0",
    "lease_renew_seconds": "0",
    "identity": "",
    "watch_window_seconds": "0",
    "resync_seconds": "0",
    "stuck_check_seconds": "-1",
    "stuck_after_seconds": "0",
    "stuck_failures": "0",
    "temporal_ip": "nonsense",
    "temporal_port": "0",
    "ui_port": "0",
    "temporal_db": "/nonexistent/temporal.db",
    "simulate": "maybe",
    "homelab": "/nonexistent/homelab.yaml",
    "kube_port": "-1",
    "time_scale": "-2",
    "demo": "maybe",
    "watt_hour_gauges": "maybe",
    "health_host": "not a host",
    "health_port": "99999",
    "metrics_address": "bogus",
    "log_level": "LOUD",
    "log_format": "xml",
}
SETTINGS_COMMANDS: list[tuple[list[str], tuple[str, ...]]] = [
    *[([name], command.sections) for name, command in roles.ROLES.items()],
    (["dev"], commands.DEV_SECTIONS),
    *[(["claims", name, "some-claim"] if name != "list" else ["claims", name], CLAIMS_SECTIONS)
      for name in ("list", "show", "reset-shutdown-streak")],
]  # fmt: skip
EVERY_BAD_SETTING = [
    (argv, setting.name) for argv, sections in SETTINGS_COMMANDS for section in sections
    for setting in section_settings(section)
]  # fmt: skip


def test_every_setting_has_a_representative_bad_value() -> None:
    assert set(BAD_VALUES) == set(ALL_SETTINGS), "give the new setting a bad value here"
    assert {name for _, name in EVERY_BAD_SETTING} == set(ALL_SETTINGS), "every setting is some command's"


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """What reached the point where a command starts things (`_finish` runs roles and clients; `autoscaler.main`
    dials the provider): none may. A clean environment: no settings, no kubeconfig, no pod."""
    started: list[str] = []
    monkeypatch.setattr(cli, "_finish", lambda command, _run: started.append(command))

    def dial(*_: object) -> int:
        started.append("autoscaler")
        return 0

    monkeypatch.setattr(autoscaler, "main", dial)
    for key in list(os.environ):
        if key.startswith(ENV_PREFIX) or key in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))
    return started


@pytest.mark.parametrize("command", ["run", "provider", "dev"])
def test_a_webhook_without_its_certificate_stops_in_one_line(
    command: str, nothing_starts: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An API server calls a webhook over HTTPS only: an address alone, or a certificate without its key, is a
    mistake of the settings, found before anything starts."""
    assert main([command, "--webhook-address", "127.0.0.1:9443"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "webhook_address needs webhook_tls_cert and webhook_tls_key" in err, err
    cert = tmp_path / "tls.crt"
    cert.write_text("not checked before the key is given")
    assert main([command, "--webhook-tls-cert", str(cert)]) == 2
    assert "webhook_tls_cert and webhook_tls_key go together" in capsys.readouterr().err
    assert not nothing_starts


@pytest.mark.parametrize(
    ("argv", "name"), EVERY_BAD_SETTING, ids=[f"{' '.join(a[:2])}-{n}" for a, n in EVERY_BAD_SETTING]
)
def test_a_bad_value_of_any_setting_stops_any_command_in_one_line_before_anything_starts(
    argv: list[str],
    name: str,
    nothing_starts: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    setting = ALL_SETTINGS[name]
    if setting.is_bool:  # a switch's flag takes no value: a bad one comes from the environment (or the file)
        monkeypatch.setenv(setting.env, BAD_VALUES[name])
        args = argv
    else:
        args = [*argv, setting.flag, BAD_VALUES[name]]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err and err.count("\n") == 0 and "Traceback" not in err, err
    assert setting.name in err or setting.flag in err, err
    assert not nothing_starts


AUTOSCALER_BAD = {
    "provider_address": "nonsense",
    "tls_cert": "/nonexistent/client.pem",
    "tls_key": "/nonexistent/client.key",
    "tls_ca": "/nonexistent/ca.pem",
    "server_name": "not a host",
    "timeout": "-1",
}


@pytest.mark.parametrize("name", sorted(AUTOSCALER_BAD))
def test_a_bad_autoscaler_option_stops_it_in_one_line_before_any_call(
    name: str, nothing_starts: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    group = build_cli().commands["autoscaler"]
    assert {p.name for p in group.params if p.name != "help"} == set(AUTOSCALER_BAD), "a new option needs a case"
    flag = "--" + name.replace("_", "-")
    assert main(["autoscaler", flag, AUTOSCALER_BAD[name], "target-size", "workers"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and flag in err and not nothing_starts, err


def test_an_autoscaler_call_that_reaches_nothing_says_where_it_looked_and_which_flag() -> None:
    port = free_port()
    done = subprocess.run([CLI, "autoscaler", "--provider-address", f"127.0.0.1:{port}", "increase", "workers", "1"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert f"cannot reach the provider at 127.0.0.1:{port}" in done.stderr and "--provider-address" in done.stderr


# --- a reader that closes the pipe, and the words of cluster-autoscaler's error classes (issue 44) --------------
def _into_a_closed_pipe(args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run the CLI with its stdout a pipe whose reader has already gone (`... | head` once head has read enough)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([str(BIN / "homelab-autoscaler"), *args], cwd=ROOT, stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=60)  # fmt: skip
    finally:
        os.close(write)


def quiet_into_a_closed_pipe(args: list[str]) -> subprocess.CompletedProcess[str]:
    """The command's run into a closed pipe, checked to say nothing of it: no `[Errno 32] Broken pipe`, no traceback,
    no "Exception ignored" at exit."""
    done = _into_a_closed_pipe(args)
    assert "Broken pipe" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
    return done


@pytest.mark.parametrize("args", [["--help"], ["autoscaler", "--help"]])
def test_a_reader_that_closed_the_pipe_ends_help_quietly(args: list[str]) -> None:
    """click's own printing (help) ends quietly with status 1; the claims commands' output, printed by the
    operator's code, ends with the status a shell gives a writer SIGPIPE ended (tests/test_claims_cli.py)."""
    done = quiet_into_a_closed_pipe(args)
    assert done.returncode != 0 and not done.stderr, done.stderr


def test_a_command_that_fails_before_printing_still_says_why_with_the_pipe_closed() -> None:
    done = quiet_into_a_closed_pipe(["claims", "list", "--temporal-address", "127.0.0.1:1"])
    assert done.returncode == 1 and "cannot reach Temporal" in done.stderr, done.stderr


def test_an_error_class_is_said_in_words() -> None:
    from api import names

    assert names.error_class_words(99) == "class 99, other error: cluster-autoscaler backs the group off"
    assert names.error_class_words(1) == "class 1, out of resources"
    assert "does not name" in names.error_class_words(7)


def test_the_command_line_loads_no_role_until_one_runs() -> None:
    """`--help`, `--version` and a bad flag answer without the Temporal SDK, the Kubernetes client or any role: on the
    small boards the operator runs on that import was seconds before each one-line answer."""
    heavy = "temporalio kubernetes activities watchers.main provider.service homelab_autoscaler.roles"
    heavy += " homelab_autoscaler.claims"
    probe = (
        "import sys; from homelab_autoscaler import cli; cli.build_cli(); "
        f"print(' '.join(m for m in {heavy.split()!r} if m in sys.modules))"
    )
    res = subprocess.run([str(BIN / "python"), "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "", f"imported by the command tree alone: {res.stdout.strip()}"
