"""The daemon's settings as its commands build them: flags > ``DDPQ_*`` variables > the config
file > the defaults that ``ddpq.config.Settings`` holds.

Each setting people set has one name in all three sources: the flag ``--log-cap``, the
variable ``DDPQ_LOG_CAP``, the file's key ``log_cap``. Only this module reads the
environment and the file; ``Settings(...)`` built directly reads neither.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource

from ddpq.config import ConfigError, Public, Settings, public_fields
from ddpq.config_values import Written

# Read when it exists; `--config PATH` names another, which must exist.
DEFAULT_CONFIG_FILE = Path("/etc/ddpq/ddpq.toml")
ENV_PREFIX = "DDPQ_"
# The settings people set, by their public name, and the attribute each one sets: the
# fields declared ``Public`` (ddpq.config_decl). Attributes not named here (python, poll_s,
# ...) are internals. Other DDPQ_* variables (DDPQ_URL, DDPQ_TRACKING, a job's
# DDPQ_JOB_DIR, ...) are not settings: never read here.
PUBLIC_NAMES: dict[str, str] = {
    public.name: field for field, (public, _) in public_fields().items()
}
_NAME_OF = {field: name for name, field in PUBLIC_NAMES.items()}


def load_settings(flags: Mapping[str, Any], config_file: Path | None = None) -> Settings:
    """The settings of ``ddpq serve``, ``server``, ``worker`` (and ``admin``'s state folder).

    ``flags`` maps public names to the command line's values; None is a flag not given,
    which overrides nothing. ``config_file`` is ``--config``, which must exist; without it,
    ``DEFAULT_CONFIG_FILE`` is read if it exists. A bad value in any source, even one that a
    higher source overrides, raises ``ConfigError``: one line that names where it was.
    """
    if config_file is not None and not config_file.is_file():
        why = "is not a file" if config_file.exists() else "does not exist"
        raise ConfigError(f"--config {config_file}: {why}")
    path = config_file or (DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.exists() else None)
    given = {PUBLIC_NAMES[name]: value for name, value in flags.items() if value is not None}
    try:
        return _Loaded(config_file=path, **given)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc, lambda name: f"--{name.replace('_', '-')}")) from None


def written_defaults() -> dict[str, object]:
    """Each public setting's default as one would write it (``grace``: "10s"; a switch's:
    the bool), for help; a default that is a rule (``home``) or none is left out."""
    shown = {}
    for public, info in public_fields().values():
        if (value := written_default(public, info)) is not None:
            shown[public.name] = value
    return shown


def written_default(public: Public, info: FieldInfo) -> object:
    """A setting's default as people would write it (a switch's: the bool), or None."""
    if public.default_is is not None:
        return public.default_is
    if info.default_factory is not None:
        return None  # a rule, which the help tells (home)
    written = next((m for m in info.metadata if isinstance(m, Written)), None)
    value = info.default
    if value is None or isinstance(value, bool):
        return written.none if value is None and written else value
    return written.show(value) if written else str(value)


class _Loaded(Settings):
    """Settings as the daemon's commands build them (see ``load_settings``)."""

    # Which file was read (None: none), so that the sources below can find it.
    config_file: Path | None = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        assert isinstance(init_settings, InitSettingsSource)
        path = init_settings.init_kwargs.get("config_file")
        # Highest precedence first: the flags (this call's arguments), the environment,
        # the file. pydantic-settings fills what none of them sets from the defaults.
        return (init_settings, _Environment(settings_cls), _ConfigFile(settings_cls, path))


class _PublicSource(PydanticBaseSettingsSource):
    """A source of values under public names. Each is checked here, where a bad one can
    still be told by where it came from."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # abstract in pydantic-settings; __call__ does the work

    def checked(self, values: dict[str, Any], where: Callable[[str], str]) -> dict[str, Any]:
        fields = {PUBLIC_NAMES[name]: value for name, value in values.items()}
        try:
            Settings(**fields)
        except ValidationError as exc:
            raise ConfigError(_one_line(exc, where)) from None
        return fields


class _Environment(_PublicSource):
    """DDPQ_<NAME> for each public name; an empty one counts as unset."""

    def __call__(self) -> dict[str, Any]:
        values = {
            name: value
            for name in PUBLIC_NAMES
            if (value := os.environ.get(ENV_PREFIX + name.upper()))
        }
        return self.checked(values, lambda name: f"{ENV_PREFIX}{name.upper()}={values[name]!r}")


class _ConfigFile(_PublicSource):
    """The TOML file's keys: public names only, so that a typo is refused, not ignored."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self.path = path

    def __call__(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            with open(self.path, "rb") as f:
                values = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot read it ({exc.strerror})") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # TOML is UTF-8
            raise ConfigError(f"{self.path}: not valid TOML: {exc}") from None
        for key in values:
            if key not in PUBLIC_NAMES:
                raise ConfigError(f"{self.path}: unknown setting {key!r}{_did_you_mean(key)}")
        return self.checked(values, lambda name: f"{self.path}: {name} = {values[name]!r}")


def _did_you_mean(key: str) -> str:
    close = difflib.get_close_matches(key.replace("-", "_"), PUBLIC_NAMES, n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(PUBLIC_NAMES)})"


def _one_line(exc: ValidationError, where: Callable[[str], str]) -> str:
    """pydantic's errors as one line, each led by ``where(public name)``."""
    problems = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        message = error["msg"].removeprefix("Value error, ")
        problems.append(f"{where(_NAME_OF.get(field, field))}: {message}")
    return "; ".join(problems)
