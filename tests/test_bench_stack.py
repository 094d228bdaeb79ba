"""The bench's bundled stack (bench/stack.py) without starting it: the server's configuration rendered from the
install's ConfigMap, the command lines taken from the manifests, what a machine without the stack is told, and how
the rows on PostgreSQL sit in the table and the JSON. Seconds; the stack itself runs in `make bench`."""

from __future__ import annotations

import json
import os
import pwd
import time
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from temporalio.client import Client

from bench import stack
from bench.figures import Figures, Sizes
from bench.procs import Proc, cpu_seconds, pss_mb
from bench.report import Report, Row

ENV = {"POD_IP": "127.0.0.1", "POSTGRES_HOST": "127.0.0.1", "POSTGRES_PORT": "25432", "POSTGRES_USER": "temporal",
       "POSTGRES_PWD": 'pa"ss word'}  # fmt: skip


def _ports(start: int = 21000) -> Any:
    counter = iter(range(start, start + 100))
    return lambda: next(counter)


def test_the_config_is_the_configmaps_rendered_with_the_env_on_the_loopback_and_without_tls(tmp_path: Path) -> None:
    m = stack.manifests()
    assert m.config_template.startswith("# enable-template"), "the ConfigMap is a template the server renders"
    installed = yaml.safe_load(stack.render(m.config_template, ENV))
    config = stack.loopback_config(m.config_template, ENV, _ports(), tmp_path / "dynamicconfig.yaml")

    assert "tls" in installed["global"] and "tls" not in config["global"], "TLS off for the bench, and only that"
    assert config["persistence"] == installed["persistence"], "the stores as the install has them"
    for name in ("default", "visibility"):
        sql = config["persistence"]["datastores"][name]["sql"]
        assert sql["connectAddr"] == "127.0.0.1:25432"
        assert (sql["user"], sql["password"]) == ("temporal", 'pa"ss word'), "quoted as the server's `quote` does"
        assert sql["tls"]["enabled"] is False, '`default "false"` of an unset POSTGRES_TLS_ENABLED'
    ports = [p for svc in config["services"].values() for p in (svc["rpc"]["grpcPort"], svc["rpc"]["membershipPort"])]
    assert set(config["services"]) == set(installed["services"]) and len(set(ports)) == len(ports)
    assert all(svc["rpc"]["bindOnIP"] == "127.0.0.1" for svc in config["services"].values())
    assert all(p < stack.MEMBERSHIP_PORT_LIMIT for p in ports)
    cluster = config["clusterMetadata"]
    frontend = config["services"]["frontend"]["rpc"]["grpcPort"]
    assert cluster["clusterInformation"][cluster["currentClusterName"]]["rpcAddress"] == f"127.0.0.1:{frontend}"
    assert config["global"]["membership"]["broadcastAddress"] == "127.0.0.1"
    assert config["global"]["metrics"]["prometheus"]["listenAddress"].startswith("127.0.0.1:")
    assert config["dynamicConfigClient"]["filepath"] == str(tmp_path / "dynamicconfig.yaml")
    assert "history.maxInFlightUpdates" in yaml.safe_load(m.dynamic_config)


def test_the_renderer_takes_the_configmaps_forms_and_names_any_other() -> None:
    assert stack.render('a: {{ env "X" }}:{{ env "Y" | default "7" }} {{ env "X" | quote }}', {"X": "h"}) == (
        'a: h:7 "h"'
    )
    with pytest.raises(ValueError, match=r"only `env \"NAME\"` lookups, not \{\{ \.Env\.X \}\}"):
        stack.render("a: {{ .Env.X }}", {})
    with pytest.raises(ValueError, match=r"not \| upper"):
        stack.render('a: {{ env "X" | upper }}', {})


def test_the_command_lines_come_from_the_manifests() -> None:
    m = stack.manifests()
    assert m.postgres_major.isdigit() and m.postgres_user == "temporal"
    for db, schema in (("temporal", "temporal"), ("temporal_visibility", "visibility")):
        assert f"temporal-sql-tool --db {db} setup-schema" in m.schema_script
        assert f"--db {db} update-schema --schema-name postgresql/v12/{schema}" in m.schema_script
    assert m.schema_env["SQL_PLUGIN"] == "postgres12"

    pg = stack.postgres_command(Path("/pg/bin"), Path("/d/data"), Path("/d"), 25432, m.postgres_settings)
    assert pg[:9] == ["/pg/bin/postgres", "-D", "/d/data", "-k", "/d", "-h", "127.0.0.1", "-p", "25432"]
    assert pg[9:] == m.postgres_settings and "shared_buffers=64MB" in pg, "the StatefulSet's settings"
    initdb = stack.initdb_command(Path("/pg/bin"), Path("/d/data"), "temporal", Path("/d/pw"))
    assert {"--username=temporal", "--pwfile=/d/pw", "--auth-host=scram-sha-256", "--auth-local=trust"} <= set(initdb)

    server = stack.server_command(m.server_command, Path("/bins"), Path("/w/config.yaml"))
    assert server[0] == "/bins/temporal-server"
    assert server[server.index("--config-file") + 1] == "/w/config.yaml" and server[-1] == "start"
    assert "--allow-no-auth" in server

    setup = stack.setup_command(m.setup_args, "127.0.0.1:21000")
    assert setup[1] == "temporal-setup" and "--postgresql-secret" not in setup, "no Secret: no Kubernetes here"
    assert setup[setup.index("--retention") + 1] == m.setup_args[m.setup_args.index("--retention") + 1]
    assert setup[setup.index("--temporal-address") + 1] == "127.0.0.1:21000"
    assert m.namespace == stack.BENCH_NAMESPACE


def test_low_ports_are_free_distinct_and_below_the_membership_limit() -> None:
    taken: set[int] = set()
    ports = [stack.low_port(taken=taken) for _ in range(10)]
    assert len(set(ports)) == 10 and all(p < stack.MEMBERSHIP_PORT_LIMIT for p in ports)


def _bins(tmp_path: Path, names: tuple[str, ...]) -> Path:
    built = tmp_path / "cache"
    (built / "bin").mkdir(parents=True)
    for name in names:
        (built / "bin" / name).write_text("#!/bin/sh\n")
        (built / "bin" / name).chmod(0o755)
    script = tmp_path / "build-temporal.sh"
    script.write_text(f'#!/bin/sh\n[ "$1" = --where ] || exit 9\necho "{built}"\n')
    script.chmod(0o755)
    return script


def test_a_machine_without_the_stack_is_told_what_is_missing_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stack, "BUILD_TEMPORAL", _bins(tmp_path, ("temporal-server",)))
    with pytest.raises(stack.Missing, match=r"temporal-sql-tool is not built: `make temporal-bins` builds it") as e:
        stack.find()
    assert "\n" not in str(e.value)

    monkeypatch.setattr(stack, "BUILD_TEMPORAL", _bins(tmp_path / "2", ("temporal-server", "temporal-sql-tool")))
    monkeypatch.setattr(stack, "DEBIAN_POSTGRES", tmp_path / "no-postgresql")
    major = stack.manifests().postgres_major
    with pytest.raises(stack.Missing, match=rf"PostgreSQL {major} .*apt-get install -y postgresql-{major}$") as e:
        stack.find()
    assert "\n" not in str(e.value)


def test_rows_on_postgresql_sit_after_their_figures_rows_and_apart_in_the_json(tmp_path: Path) -> None:
    report = Report(sizes={})
    dev = Figures(cast(Client, None), "127.0.0.1:1", tmp_path, Sizes(), report)
    pg = Figures(cast(Client, None), "127.0.0.1:2", tmp_path, Sizes(), report, on="PostgreSQL", tag="-pg")
    for figure in ("P5 idle footprint", "P1 reaction, a", "P1 staggered, b", "P2 burst, c", "P3 Refresh"):
        dev.add(Row(figure, "m", "f", 1.0, "g"))
    for figure in ("P5 the bundled stack's memory", "P1 reaction, a", "P2 burst, c"):
        pg.add(Row(figure, "m", "f", 1.0, "g"))
    assert [r.figure for r in report.ordered()] == [
        "P5 idle footprint", "P5 on PostgreSQL: the bundled stack's memory",
        "P1 reaction, a", "P1 staggered, b", "P1 on PostgreSQL: reaction, a",
        "P2 burst, c", "P2 on PostgreSQL: burst, c",
        "P3 Refresh",
    ]  # fmt: skip
    report.write(tmp_path / "out.json")
    doc = json.loads((tmp_path / "out.json").read_text())
    assert [r["figure"] for r in doc["rows"]] == ["P5 idle footprint", "P1 reaction, a", "P1 staggered, b",
                                                   "P2 burst, c", "P3 Refresh"]  # fmt: skip
    assert {r["server"] for r in doc["rows_on_other_servers"]} == {"PostgreSQL"}


def test_process_measures_for_a_server_of_many_processes() -> None:
    assert cpu_seconds(os.getpid(), reaped=True) >= cpu_seconds(os.getpid())
    mb, processes = pss_mb(os.getpid())
    assert mb > 0 and processes >= 1


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs a process as another user")
def test_a_proc_runs_as_the_user_it_names_and_is_its_pid(tmp_path: Path) -> None:
    log = tmp_path / "id.log"
    proc = Proc("id", ["sh", "-c", "id -u; id -G"], log, user=stack.RUN_AS, cwd=tmp_path).start()
    deadline = time.monotonic() + 10
    while proc.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.popen is not None and proc.popen.returncode == 0, log.read_text()
    who = pwd.getpwnam(stack.RUN_AS)
    assert log.read_text().split() == [str(who.pw_uid), str(who.pw_gid)], "its own group only, none of root's"


def test_the_bench_says_in_one_line_why_it_has_no_rows_on_postgresql(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.__main__ import find_stack, parse

    def missing() -> stack.Found:
        raise stack.Missing("PostgreSQL 15 is not installed: apt-get install -y postgresql-15")

    monkeypatch.setattr(stack, "find", missing)
    report = Report(sizes={})
    assert find_stack(parse([]), report) is None
    assert (
        capsys.readouterr().out
        == "bench: no rows on PostgreSQL: PostgreSQL 15 is not installed: apt-get install -y postgresql-15\n"
    )
    assert report.notes == ["no rows on PostgreSQL: PostgreSQL 15 is not installed: apt-get install -y postgresql-15"]
    assert not report.failures, "a machine without the stack runs the dev server's rows and succeeds"
    for argv, why in ((["--no-postgresql"], "--no-postgresql"), (["--only", "p3,p4"], "--only names none of p5,p1,p2")):
        report = Report(sizes={})
        assert find_stack(parse(argv), report) is None and report.notes == [f"no rows on PostgreSQL: {why}"]
