"""The one console script, `homelab-autoscaler`: each subcommand is a role of the operator or a tool for people.

The commands that run roles come from one table (`homelab_autoscaler.commands.COMMANDS`), and each takes exactly the
settings sections its roles read (`homelab_autoscaler.settings`). Every setting is a flag (`--temporal-address`),
an environment variable (`HOMELAB_AUTOSCALER_TEMPORAL_ADDRESS`) and a key of the YAML file given with
`--config` (`temporal_address`), in that order of precedence over the defaults. A bad value, a busy port or a
missing file stops the command with one line naming it, and exit code 2.

The variables are named explicitly rather than with click's `auto_envvar_prefix`, which would put the
subcommand into the name (`..._RUN_TEMPORAL_ADDRESS`): one variable must mean one thing for every command, as
in a Deployment whose containers run different roles from one environment.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, get_args

import click
import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from api.addresses import check_dns_label, check_host, check_host_port
from homelab_autoscaler import autoscaler
from homelab_autoscaler.commands import COMMANDS, DEV_HELP, DEV_SECTIONS
from homelab_autoscaler.errors import UserError
from homelab_autoscaler.settings import SECTIONS, LoggingSettings, Settings, TemporalSettings

PROG = "homelab-autoscaler"
ENV_PREFIX = "HOMELAB_AUTOSCALER_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
PHASES = ("pending", "booting", "ready", "failed", "completed")
CLAIMS_NAMESPACE = "homelab-autoscaler-system"


# --- settings as flags, variables and config keys -------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """One setting: a field of a section, known by one name as a flag, a variable and a config key."""

    section: str
    field: str
    info: FieldInfo

    @property
    def name(self) -> str:
        return self.info.alias or self.field

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def is_bool(self) -> bool:
        return self.info.annotation is bool

    @property
    def metavar(self) -> str:
        kinds = {self.info.annotation, *get_args(self.info.annotation)}
        if Path in kinds:
            return "FILE"
        if list in kinds or any(getattr(k, "__origin__", None) is list for k in kinds):
            return "A,B"
        if self.name.endswith("_seconds"):
            return "SECONDS"
        if int in kinds:
            return "INTEGER"
        if float in kinds:
            return "NUMBER"
        return "HOST:PORT" if self.name.endswith("_address") else "TEXT"

    @property
    def default_text(self) -> str:
        """The default as a person would write it in a flag."""
        extra = self.info.json_schema_extra
        if isinstance(extra, dict) and "shown_default" in extra:
            return str(extra["shown_default"])
        value = self.info.get_default(call_default_factory=True)
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, list):
            return ",".join(str(v) for v in value) or "empty"
        return str(value)

    def option(self) -> click.Option:
        """The click option; its default is None, so a flag not given leaves the variable and file their say."""
        default = f"default: {self.default_text}; " if self.default_text else ""
        help_text = f"{self.info.description}  [{default}env: {self.env}]"
        if self.is_bool:
            off = "--no-" + self.flag.removeprefix("--")
            return click.Option([f"{self.flag}/{off}", self.name], default=None, help=help_text)
        return click.Option([self.flag, self.name], default=None, metavar=self.metavar, help=help_text)


def section_settings(section: str) -> list[Setting]:
    model: type[BaseModel] = SECTIONS[section]
    return [Setting(section, field, info) for field, info in model.model_fields.items()]


def _every_setting() -> dict[str, Setting]:
    """Every setting of every section by name; a name in two sections would mean two things, and is refused."""
    found: dict[str, Setting] = {}
    for section in SECTIONS:
        for setting in section_settings(section):
            other = found.setdefault(setting.name, setting)
            if other is not setting:
                raise AssertionError(f"setting {setting.name} is in sections {other.section} and {section}")
    return found


ALL_SETTINGS = _every_setting()


def read_config(path: Path) -> dict[str, Any]:
    """The YAML file of `--config`: a mapping of setting names. A key that is no setting of any command is a
    typo and refused; a key of another command's sections is ignored, so one file serves every role."""
    if not path.is_file():
        raise UserError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        raise UserError(f"config file {where}: not valid YAML: {getattr(err, 'problem', None) or err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config file {path}: expected a mapping of settings (temporal_address: ...)")
    for key in data:
        if key not in ALL_SETTINGS:
            close = difflib.get_close_matches(str(key), ALL_SETTINGS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UserError(f"config file {path}: unknown setting {key}{hint}")
    return data


def load_settings(
    sections: tuple[str, ...],
    flags: Mapping[str, Any],
    config: Path | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Settings:
    """The command's sections from flags over `HOMELAB_AUTOSCALER_*` over the config file over the defaults,
    each validated once; the first bad value is one `UserError` naming the setting and where it came from.

    A variable counts when it is set, even to "" (`HOMELAB_AUTOSCALER_METRICS_ADDRESS=` turns metrics off).
    """
    from_file = read_config(config) if config is not None else {}
    built: dict[str, BaseModel] = {}
    for section in sections:
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for setting in section_settings(section):
            if flags.get(setting.name) is not None:
                values[setting.name], sources[setting.name] = flags[setting.name], setting.flag
            elif setting.env in environ:
                values[setting.name], sources[setting.name] = environ[setting.env], setting.env
            elif setting.name in from_file:
                values[setting.name], sources[setting.name] = from_file[setting.name], f"config file {config}"
        try:
            built[section] = SECTIONS[section].model_validate(values)
        except ValidationError as err:
            raise UserError(_one_line(err, sources)) from None
    return Settings.model_validate(built)


def _one_line(err: ValidationError, sources: Mapping[str, str]) -> str:
    first = err.errors(include_url=False)[0]
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["loc"]:
        name = str(first["loc"][0])
        got = "" if repr(first["input"]) in message else f"; got {first['input']!r}"
        return f"bad setting {name} (from {sources.get(name, 'its default')}): {message}{got}"
    return f"bad settings: {message}"


# --- commands --------------------------------------------------------------------------------------------------
class SettingsCommand(click.Command):
    """A command with settings sections: its --help lists the settings by section, each with its variable."""

    def __init__(
        self,
        name: str,
        sections: tuple[str, ...],
        run: Callable[[Settings, dict[str, Any]], int],
        *,
        help: str,
        params: list[click.Parameter] | None = None,
    ) -> None:
        self.sections = sections
        self.run = run
        options = [s.option() for section in sections for s in section_settings(section)]
        config = click.Option(
            ["--config", "config"],
            type=click.Path(path_type=Path, dir_okay=False),
            default=None,
            envvar=CONFIG_ENV,
            help=f"YAML file of settings (keys are the setting names; lowest precedence)  [env: {CONFIG_ENV}]",
        )
        super().__init__(name, params=[*(params or []), config, *options], callback=self._invoke, help=help)

    def _invoke(self, **kwargs: Any) -> int:
        names = {s.name for section in self.sections for s in section_settings(section)}
        flags = {k: v for k, v in kwargs.items() if k in names}
        args = {k: v for k, v in kwargs.items() if k not in names and k != "config"}
        try:
            settings = load_settings(self.sections, flags, kwargs.get("config"))
            return self.run(settings, args)  # a role's preflight refuses in one line too, before anything starts
        except UserError as err:
            raise click.UsageError(str(err)) from None

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = {s.name for section in self.sections for s in section_settings(section)}
        own = [r for p in self.get_params(ctx) if p.name not in names and (r := p.get_help_record(ctx))]
        with formatter.section("Options"):
            formatter.write_dl(own)
        for section in self.sections:
            title = Settings.model_fields[section].title or section
            records = [r for s in section_settings(section) if (r := s.option().get_help_record(ctx))]
            with formatter.section(f"{title} settings"):
                formatter.write_dl(records)


#: A reader that closed the pipe (`claims show ... | head`): what a shell reports for a writer SIGPIPE ended.
BROKEN_PIPE_EXIT = 128 + 13


def _pipe_closed() -> int:
    """The reader of stdout went away: nothing more is printed (nor Python's "Exception ignored" at exit, which a
    flush to the closed pipe would say), as `cat` and `grep` end under `head`."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return BROKEN_PIPE_EXIT


def _finish(command: str, run: Callable[[], int]) -> NoReturn:
    """Run a command that used a Temporal client, say any failure in one line, and leave through os._exit."""
    try:
        rc = run()
        sys.stdout.flush()
    except KeyboardInterrupt:
        rc = 130
    except BrokenPipeError:
        rc = _pipe_closed()
    except UserError as err:
        print(f"{PROG} {command}: {err}", file=sys.stderr)
        rc = 2
    except Exception as err:
        # Here, not at the top: the SDK is imported by the command that ran, never by `--help` or a bad flag.
        from temporalio.service import RPCError

        if isinstance(err, RPCError):  # Temporal answered, and refused: its words, not the SDK's frames
            print(f"{PROG} {command}: Temporal refused: {err.message} ({err.status.name})", file=sys.stderr)
        elif isinstance(err, (OSError, RuntimeError, TimeoutError)):
            print(f"{PROG} {command}: {err}", file=sys.stderr)
        else:
            raise
        rc = 1
    # A process that used a Temporal client can abort in interpreter teardown while the SDK's Rust threads still
    # run (PyGILState_Release, temporalio/sdk-python#300). Everything is stopped and flushed by now: skip it.
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(rc)


def _role_command(name: str) -> SettingsCommand:
    def run(settings: Settings, _: dict[str, Any]) -> int:
        from homelab_autoscaler.roles import preflight, run_command, setup_logging

        preflight(name, settings)
        setup_logging(settings.section(LoggingSettings))
        _finish(name, lambda: asyncio.run(run_command(name, settings)))

    command = COMMANDS[name]
    return SettingsCommand(name, command.sections, run, help=command.help)


def _dev_command() -> SettingsCommand:
    def run(settings: Settings, _: dict[str, Any]) -> int:
        from homelab_autoscaler.roles import dev_preflight, dev_role, setup_logging

        simulate = dev_preflight(settings)
        setup_logging(settings.section(LoggingSettings))
        _finish("dev", lambda: asyncio.run(dev_role(settings, simulate)))

    return SettingsCommand("dev", DEV_SECTIONS, run, help=DEV_HELP)


# --- temporal-setup: the bundled Temporal's namespace, search attributes and PostgreSQL password --------------------
SETUP_SECTIONS = ("temporal", "kube")


def _duration(value: str) -> object:
    """`72h`, `7d`, `30m`: a retention as Temporal's CLI writes one."""
    from datetime import timedelta

    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    if len(value) < 2 or value[-1] not in units or not value[:-1].isdigit() or int(value[:-1]) <= 0:
        raise ValueError(f"{value!r} is not a duration like 72h, 7d or 30m")
    return timedelta(seconds=int(value[:-1]) * units[value[-1]])


def _setup_command() -> SettingsCommand:
    def run(settings: Settings, args: dict[str, Any]) -> int:
        from datetime import timedelta

        from homelab_autoscaler.setup import SetupPlan, setup_temporal
        from kube.adapter import Kube
        from kube.settings import KubeSettings

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        temporal = settings.section(TemporalSettings)
        retention = _duration(args["retention"])
        assert isinstance(retention, timedelta)
        plan = SetupPlan(args["secret_namespace"], args["postgresql_secret"] or "", retention, args["wait_seconds"])
        core = None
        if plan.secret_name:
            from kubernetes import client as k8s

            core = k8s.CoreV1Api(Kube.for_settings(settings.section(KubeSettings)).api_client)
        _finish("temporal-setup", lambda: asyncio.run(setup_temporal(temporal, plan, core)))

    params: list[click.Parameter] = [
        click.Option(["--retention"], default="7d", show_default=True, callback=_checked(_duration),
                     help="how long Temporal keeps a closed claim's history (set when the namespace is registered)"),
        click.Option(["--postgresql-secret"], default="", envvar=ENV_PREFIX + "POSTGRESQL_SECRET",
                     help="a Secret to create with a random `password` when absent (never replaced)  "
                          f"[env: {ENV_PREFIX}POSTGRESQL_SECRET]"),
        click.Option(["--secret-namespace"], default=CLAIMS_NAMESPACE, envvar=ENV_PREFIX + "POD_NAMESPACE",
                     show_default=True, help=f"the Secret's namespace  [env: {ENV_PREFIX}POD_NAMESPACE]"),
        click.Option(["--wait-seconds"], type=click.FloatRange(min=1, max=3600), default=600.0, show_default=True,
                     help="how long to wait for the Temporal frontend to answer"),
    ]  # fmt: skip
    return SettingsCommand(
        "temporal-setup",
        SETUP_SECTIONS,
        run,
        help="the bundled Temporal's PostgreSQL password Secret, the operator's namespace and search attributes "
        "(idempotent: the operator's init container runs it on every start)",
        params=params,
    )


# --- claims: a client of Temporal, nothing more --------------------------------------------------------------------
CLAIMS_SECTIONS = ("temporal",)


def _claims_command(
    name: str,
    help: str,
    params: list[click.Parameter],
    action: str,
) -> SettingsCommand:
    """`action` names the coroutine of homelab_autoscaler.claims, imported (with the Temporal client) when it runs."""

    def run(settings: Settings, args: dict[str, Any]) -> int:
        from homelab_autoscaler import claims

        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        temporal = settings.section(TemporalSettings)
        command: Callable[..., Coroutine[Any, Any, int]] = getattr(claims, action)
        _finish(f"claims {name}", lambda: asyncio.run(command(temporal, **args)))

    return SettingsCommand(name, CLAIMS_SECTIONS, run, help=help, params=params)


def _claims_group() -> click.Group:
    namespace = click.Option(
        ["--namespace"], default=CLAIMS_NAMESPACE, show_default=True, help="the claim's Kubernetes namespace"
    )
    group = click.Group("claims", help="claims from the terminal: list, show, reset-shutdown-streak")
    group.add_command(
        _claims_command(
            "list",
            "claims from Temporal visibility, newest first",
            [
                click.Option(["--group"], help="only the claims of this Group"),
                click.Option(["--slot"], help="only the claims of this slot"),
                click.Option(["--phase"], type=click.Choice(PHASES), help="only the claims in this phase"),
            ],
            "list_command",
        )
    )
    group.add_command(
        _claims_command(
            "show",
            "a claim's timeline from its workflow history, then what it waits for now",
            [click.Argument(["name"]), namespace],
            "show_command",
        )
    )
    group.add_command(
        _claims_command(
            "reset-shutdown-streak",
            "let a paused scale-down fire again now",
            [click.Argument(["name"]), namespace],
            "reset_command",
        )
    )
    return group


# --- certs: the install's own certificates (mTLS with no cert-manager) ------------------------------------------------
CERTS_SECTIONS = ("kube", "logging")


def _certs_command() -> SettingsCommand:
    def run(settings: Settings, args: dict[str, Any]) -> int:
        from homelab_autoscaler.certs import CertSetup
        from homelab_autoscaler.roles import setup_logging
        from kube.adapter import Kube
        from kube.errors import KubeError
        from kube.settings import KubeSettings

        setup_logging(settings.section(LoggingSettings))

        def once() -> int:
            kube = Kube.for_settings(settings.section(KubeSettings))
            try:
                setup = CertSetup(
                    kube, args["namespace"], client_namespace=args["client_namespace"], temporal=args["temporal"]
                )
                for line in setup.run():
                    print(line, flush=True)
            except (KubeError, ValueError) as err:
                raise UserError(str(err)) from None
            finally:
                kube.close()
            return 0

        _finish("certs", once)

    namespace = click.Option(
        ["--namespace"],
        default=CLAIMS_NAMESPACE,
        show_default=True,
        envvar=ENV_PREFIX + "CERTS_NAMESPACE",
        help=f"the operator's namespace, where the Secrets are  [env: {ENV_PREFIX}CERTS_NAMESPACE]",
        callback=_checked(check_dns_label),
    )
    client_namespace = click.Option(
        ["--client-namespace"],
        default=None,
        envvar=ENV_PREFIX + "CERTS_CLIENT_NAMESPACE",
        help=f"cluster-autoscaler's namespace, where its client certificate goes (default: --namespace)  "
        f"[env: {ENV_PREFIX}CERTS_CLIENT_NAMESPACE]",
        callback=_checked(check_dns_label),
    )
    temporal = click.Option(
        ["--temporal/--no-temporal"],
        default=False,
        show_default=True,
        envvar=ENV_PREFIX + "CERTS_TEMPORAL",
        help="also the bundled Temporal's: its frontend's certificate, the operator's and the Web UI's client "
        f"certificates  [env: {ENV_PREFIX}CERTS_TEMPORAL]",
    )
    return SettingsCommand(
        "certs",
        CERTS_SECTIONS,
        run,
        help="issue or renew the provider's, the webhook's and cluster-autoscaler's certificates into Secrets "
        "(idempotent; Secrets it did not write are left alone)",
        params=[namespace, client_namespace, temporal],
    )


# --- autoscaler: the provider called as cluster-autoscaler calls it ------------------------------------------------
def _checked(check: Callable[[str], object]) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback that refuses a value `check` refuses, in one line naming the option."""

    def callback(_ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None:
            try:
                check(value)
            except ValueError as err:
                raise click.BadParameter(str(err), param=param) from None
        return value

    return callback


def _provider_address(value: str) -> None:
    if not value.startswith("unix:"):
        check_host_port(value)


def _autoscaler_group() -> click.Group:
    file = click.Path(path_type=Path, dir_okay=False, exists=True)

    def connect(ctx: click.Context, **kwargs: Any) -> None:
        ctx.obj = autoscaler.Target(**kwargs)

    group = click.Group(
        "autoscaler",
        help="call the provider exactly as cluster-autoscaler would",
        callback=click.pass_context(connect),
        params=[
            click.Option(
                ["--provider-address"],
                default="127.0.0.1:8086",
                show_default=True,
                help="the provider's host:port",
                callback=_checked(_provider_address),
            ),
            click.Option(["--tls-cert"], type=file, help="client certificate (PEM) for mTLS"),
            click.Option(["--tls-key"], type=file, help="client key (PEM)"),
            click.Option(["--tls-ca"], type=file, help="CA (PEM) that signed the provider's certificate"),
            click.Option(
                ["--server-name"], help="name to verify in the provider's certificate", callback=_checked(check_host)
            ),
            click.Option(
                ["--timeout"],
                type=click.FloatRange(min=0, min_open=True),
                default=5.0,
                show_default=True,
                help="deadline of each call (cluster-autoscaler: 5 s)",
            ),
        ],
    )
    for name, (what, _) in autoscaler.COMMANDS.items():
        params: list[click.Parameter] = []
        if name not in ("node-groups", "for-node"):
            params.append(click.Argument(["group"]))
        if name in ("increase", "decrease"):
            params.append(click.Argument(["delta"], type=int))
        if name == "delete-nodes":
            params.append(click.Argument(["nodes"], nargs=-1, required=True))
        if name == "for-node":
            params += [click.Argument(["node"]), click.Option(["--provider-id"], default="", help="spec.providerID")]

        def call(ctx: click.Context, name: str = name, **kwargs: Any) -> int:
            target: autoscaler.Target = ctx.obj
            try:
                return autoscaler.main(target, autoscaler.Call(name, timeout=target.timeout, **kwargs))
            except (ValueError, OSError) as err:
                raise UserError(str(err)) from None

        group.add_command(click.Command(name, params=params, help=what, callback=click.pass_context(call)))
    return group


def build_cli() -> click.Group:
    """The whole command tree: the role commands from `commands.COMMANDS`, dev, claims and autoscaler. Nothing of
    the roles is imported until one runs."""
    context = {"help_option_names": ["-h", "--help"], "max_content_width": 120}
    cli = click.Group(PROG, help=__doc__.split("\n\n")[0], context_settings=context)
    # The release, as pyproject.toml says and the image's tag repeats (CHANGELOG.md).
    click.version_option(package_name="homelab-autoscaler", prog_name=PROG, message="%(prog)s %(version)s")(cli)
    for name in COMMANDS:
        cli.add_command(_role_command(name))
    cli.add_command(_dev_command())
    cli.add_command(_setup_command())
    cli.add_command(_claims_group())
    cli.add_command(_autoscaler_group())
    cli.add_command(_certs_command())
    return cli


def commands() -> Iterator[tuple[str, tuple[str, ...]]]:
    """Every command that takes settings and its sections, for docs/configuration.md."""
    for name, command in COMMANDS.items():
        yield name, command.sections
    yield "dev", DEV_SECTIONS
    yield "temporal-setup", SETUP_SECTIONS
    yield "claims list/show/reset-shutdown-streak", CLAIMS_SECTIONS


def main(argv: list[str] | None = None) -> int:
    """Parse, validate the settings, run the chosen role or tool; a mistake is one line and exit code 2."""
    try:
        result = build_cli().main(args=argv, prog_name=PROG, standalone_mode=False)
        sys.stdout.flush()
    except BrokenPipeError:
        return _pipe_closed()
    except click.UsageError as err:
        where = err.ctx.command_path if err.ctx else PROG
        print(f"{where}: {err.format_message()} (see {where} --help)", file=sys.stderr)
        return 2
    except UserError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    except click.ClickException as err:
        print(f"{PROG}: {err.format_message()}", file=sys.stderr)
        return err.exit_code
    except click.Abort:
        return 130
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
