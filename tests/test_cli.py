"""The CLI as people meet it: every subcommand has help, every bad setting is one clear line and exit 2."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from homelab_autoscaler.cli import main
from tests.procs import BIN

HELP = [
    (["run"], "--provider-address"),
    (["worker"], "--temporal-address"),
    (["provider"], "--tls-ca"),
    (["watch"], "--lease-name"),
    (["dev"], "--simulate"),
    (["claims", "list"], "--phase"),
    (["claims", "show"], "name"),
    (["claims", "reset-shutdown-streak"], "name"),
    (["autoscaler"], "--provider-address"),
    (["autoscaler", "nodes"], "group"),
    (["autoscaler", "increase"], "delta"),
    (["autoscaler", "delete-nodes"], "nodes"),
]


@pytest.mark.parametrize(("argv", "mentions"), HELP, ids=[" ".join(a) for a, _ in HELP])
def test_every_subcommand_has_help(argv: list[str], mentions: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    assert mentions in capsys.readouterr().out


BAD = [
    (["worker", "--log-level", "LOUD"], "log_level"),
    (["worker", "--activity-threads", "0"], "activity_threads"),
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
    assert "temporal_adress" in capsys.readouterr().err


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
