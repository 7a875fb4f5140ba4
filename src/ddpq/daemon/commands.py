"""``ddpq serve``, ``ddpq server`` and ``ddpq worker``: the daemon's commands.

Their options are the settings, made from the settings' declarations (``ddpq.config_decl``,
``ddpq.daemon.options``) when one of these commands is used or shown, not when the command
line is built: `ddpq --help` need not import pydantic-settings. Every option defaults to
unset (None): an absent flag never overrides a ``DDPQ_*`` variable or the config file;
``ddpq.daemon.settings.load_settings`` merges them and holds the defaults. The server, the
worker and SQLAlchemy are imported by the command that runs.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperCommand, TyperOption

app = typer.Typer(rich_markup_mode=None)


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"ddpq: {message}", err=True)
    raise typer.Exit(code)


def not_found(exc: LookupError) -> str:
    """A store's "no such ..." in its own words (a KeyError's str() adds quotes)."""
    return str(exc.args[0]) if exc.args else str(exc)


class ShowsSettingsDefaults(TyperCommand):
    """A command whose help shows ``--config``'s default, and each setting's help and
    default from its declaration (``--home`` of the admin's commands).

    Read when help is asked for, not when the command line is built: that would import the
    settings on every `ddpq` command.
    """

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from ddpq.config import public_fields
        from ddpq.daemon.options import option_help
        from ddpq.daemon.settings import DEFAULT_CONFIG_FILE

        declared = {public.name: (public, info) for public, info in public_fields().values()}
        for param in self.params:
            if not isinstance(param, TyperOption):
                continue
            if param.name == "config" and "[default:" not in (param.help or ""):
                param.help = f"{param.help}  [default: {DEFAULT_CONFIG_FILE}, if it exists]"
            elif param.name in declared and not param.help:
                param.help = option_help(*declared[param.name])
                if param.name != "home":  # its help says where it is found already
                    # What the daemon is set to counts first: the declaration's default
                    # applies only where nothing sets it (`admin prune` with a config's
                    # keep_finished showed "[default: forever]").
                    param.help = param.help.replace(
                        "[default: ", "[default: as set for the daemon (config, DDPQ_*), else "
                    )
        super().format_help(ctx, formatter)


# A setting as an option of another command (the admin's, which find the state folder as
# the daemon does): the option is named as the setting, and its help and default are the
# declaration's (ShowsSettingsDefaults).
HomeOpt = Annotated[Path | None, typer.Option()]
SettingText = Annotated[str | None, typer.Option()]
SettingSwitch = Annotated[bool | None, typer.Option()]
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help='settings file (TOML, keys named as these options: grace = "30s"); flags and '
        "DDPQ_* variables override it",
    ),
]


def _run_daemon(*, api: bool, worker: bool, config: Path | None, flags: dict[str, Any]) -> None:
    """``flags``: the command's options, named as the settings are (``grace``, ``log_cap``)."""
    from ddpq.config import ConfigError
    from ddpq.daemon.run import run
    from ddpq.daemon.settings import load_settings
    from ddpq.daemon.watchdog import WorkerDied

    try:
        run(load_settings(flags, config), api=api, worker=worker)
    except ConfigError as exc:
        fail(str(exc), 2)
    except WorkerDied as exc:  # 1: a failure the service manager restarts (2 it does not)
        fail(str(exc), 1)


class DeclaredOptions(ShowsSettingsDefaults):
    """A daemon command: ``--config``, and an option per setting it reads (``api``: the API's,
    ``worker``: the worker's), which run ``_run_daemon`` with the flags given.

    Its options are made the first time anything asks for them (parsing, help, a test
    reading ``params``), by a command Typer builds then: building ``ddpq``'s command line
    imports no settings, and Typer's own callback knows every option it is given."""

    api = worker = True
    # Read by ``ddpq.entry``, which holds the garbage collector while one starts
    # (``daemon.heap.collections_held``) without importing this module for other commands.
    starts_a_daemon = True
    _declared: TyperCommand | None = None

    @property
    def params(self) -> list[Any]:
        return self.declared().params

    @params.setter
    def params(self, value: list[Any]) -> None:
        pass  # Typer's, for the stand-in below; the declared command has its own

    def invoke(self, ctx: Any) -> Any:
        return self.declared().invoke(ctx)

    def declared(self) -> TyperCommand:
        """The command as Typer makes it from a signature of the declared options."""
        if self._declared is None:
            from ddpq.daemon.options import parameters

            api, worker = self.api, self.worker

            def run(config: Path | None, **flags: Any) -> None:
                _run_daemon(api=api, worker=worker, config=config, flags=flags)

            config = inspect.Parameter(
                "config", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ConfigOpt
            )
            declared = parameters(api=api, worker=worker)
            at = 1 + [p.name for p in declared].index("home")  # --config after --home
            signature = inspect.Signature([*declared[:at], config, *declared[at:]])
            run.__signature__ = signature  # type: ignore[attr-defined]
            one = typer.Typer(rich_markup_mode=None, add_completion=False)
            one.command(cls=TyperCommand)(run)
            command = typer.main.get_command(one)
            assert isinstance(command, TyperCommand)
            self._declared = command
        return self._declared


def _daemon_command(name: str, doc: str, *, api: bool, worker: bool) -> None:
    """Register ``name``: Typer sees a stand-in with no options (they are made when the
    command is used, from the declarations), and the class that makes them."""

    def stand_in() -> None:
        raise AssertionError("DeclaredOptions.invoke runs the declared command")

    stand_in.__doc__ = doc
    kind = type(f"{name.title()}Command", (DeclaredOptions,), {"api": api, "worker": worker})
    app.command(name, cls=kind)(stand_in)


_daemon_command(
    "serve",
    "Run the API and the worker, in a child process (a one-box lab).",
    api=True,
    worker=True,
)
_daemon_command(
    "server",
    "Run only the API (pair it with `ddpq worker` on the same state folder).",
    api=True,
    worker=False,
)
_daemon_command(
    "worker",
    "Run only the worker loop (launches and watches jobs, sends notifications); --auth as the "
    "API has it.",
    api=False,
    worker=True,
)
