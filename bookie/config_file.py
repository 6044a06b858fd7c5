"""Server settings from flags, environment variables and a TOML file (``--config FILE``), in that order.

A server command's settings are its flags: each flag's *dest* (``--journal-max-wait-ms`` → ``journal_max_wait_ms``)
is also a key of the TOML file and, upper-cased behind ``LEDGERSTORE_``, an environment variable
(``LEDGERSTORE_JOURNAL_MAX_WAIT_MS``). The file is ``--config FILE`` or ``$LEDGERSTORE_CONFIG`` (BookKeeper's
``BOOKIE_CONF``). Precedence: a flag on the command line > the environment > the file > the flag's default.

``enable(parser)`` is called once the parser has all its arguments: it adds ``--config``, notes which flags the
command line gives (argparse itself cannot tell a flag given its default value from one left out), and relaxes
``required`` (a required setting may come from the file or the environment; ``resolve`` checks it). ``resolve``
then merges the layers into the parsed namespace and returns an ``Effective`` record: every value, where it came
from, and a redacted view for ``GET /api/v1/config``.

Pure: nothing here touches the network or the process environment except through its arguments. It sits in
``bookie`` (the lowest package a server command has) so that the bookie, the broker and AutoRecovery share it.
"""

from __future__ import annotations

import argparse
import difflib
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "REDACTED",
    "ConfigError",
    "Effective",
    "Setting",
    "enable",
    "env_name",
    "is_secret",
    "load_file",
    "resolve",
]

ENV_PREFIX = "LEDGERSTORE_"
CONFIG_ENV = "LEDGERSTORE_CONFIG"
REDACTED = "***"
FLAG, ENV, FILE, DEFAULT = "flag", "env", "file", "default"

_SPEC_ATTR = "_config_settings"
_EXPLICIT_ATTR = "_config_explicit"
_NOT_SETTINGS = frozenset({"help", "version", "config"})
_SECRET_WORDS = ("password", "secret", "token")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


class ConfigError(ValueError):
    """A bad configuration file, setting or environment variable (the message names it)."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One flag as a setting: its name (the dest), flag, default and how a value is converted."""

    name: str
    flag: str
    default: Any
    kind: str  # "bool" (store_true/store_false), "list" (append), "value"
    convert: Callable[[str], Any] | None
    choices: tuple[Any, ...] | None
    required: bool

    @property
    def env(self) -> str:
        return env_name(self.name)


@dataclass(slots=True)
class Effective:
    """The settings a server runs with: ``values``, each one's ``sources`` entry (flag, env, file, default) and
    the file they were read from (None: no file)."""

    values: dict[str, Any]
    sources: dict[str, str]
    file: str | None = None
    _secret: frozenset[str] = field(default_factory=frozenset)

    def redacted(self) -> dict[str, Any]:
        """``values`` with every secret that is set replaced by ``REDACTED`` (JSON-ready: paths as strings)."""
        out: dict[str, Any] = {}
        for name, value in sorted(self.values.items()):
            if name in self._secret and value not in (None, "", [], ()):
                out[name] = REDACTED
            elif isinstance(value, Path):
                out[name] = str(value)
            elif isinstance(value, list | tuple):
                out[name] = [str(v) if isinstance(v, Path) else v for v in value]
            else:
                out[name] = value
        return out

    def report(self) -> dict[str, Any]:
        """``GET /api/v1/config``: the file, every setting (redacted) and where each came from."""
        return {
            "config_file": self.file,
            "settings": self.redacted(),
            "sources": dict(sorted(self.sources.items())),
        }


def env_name(setting: str) -> str:
    return ENV_PREFIX + setting.upper()


def is_secret(name: str) -> bool:
    """A password, secret or token given as a value (a ``*_file`` setting names a file: its path is shown)."""
    return any(w in name for w in _SECRET_WORDS) and not name.endswith("_file")


def _kind(action: argparse.Action) -> str:
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return "bool"
    if isinstance(action, argparse._AppendAction):
        return "list"
    return "value"


def _tracking(cls: type[argparse.Action]) -> type[argparse.Action]:
    """A subclass of ``cls`` that notes its dest on the namespace when the command line gives the flag."""

    def __call__(
        self: argparse.Action, parser: Any, namespace: Any, values: Any, option_string: Any = None
    ) -> None:
        explicit = namespace.__dict__.setdefault(_EXPLICIT_ATTR, set())
        explicit.add(self.dest)
        cls.__call__(self, parser, namespace, values, option_string)

    return type(f"Tracking{cls.__name__}", (cls,), {"__call__": __call__})


def enable(parser: argparse.ArgumentParser, *, what: str = "server") -> list[Setting]:
    """Make ``parser``'s flags settings (see the module docstring); call after its last ``add_argument``."""
    settings: list[Setting] = []
    for action in list(parser._actions):
        if not action.option_strings or action.dest in _NOT_SETTINGS or action.dest == argparse.SUPPRESS:
            continue
        kind = _kind(action)
        if kind == "value" and action.nargs not in (None, "?"):
            continue
        settings.append(
            Setting(
                name=action.dest,
                flag=max(action.option_strings, key=len),
                default=action.default,
                kind=kind,
                convert=action.type if callable(action.type) else None,
                choices=tuple(action.choices) if action.choices is not None else None,
                required=action.required,
            )
        )
        action.required = False
        action.__class__ = _tracking(type(action))
    example = next(
        (
            f"{s.name} = {s.default!r}"
            for s in settings
            if s.kind == "value" and isinstance(s.default, int | float) and not isinstance(s.default, bool)
        ),
        "name = value",
    )
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help=f"the {what}'s settings as TOML: each key is a flag's name with underscores "
        f"({example}); flags and {ENV_PREFIX}<NAME> environment variables override it "
        f"(default ${CONFIG_ENV})",
    )
    parser.set_defaults(**{_SPEC_ATTR: tuple(settings)})
    return settings


def _convert(s: Setting, value: Any, where: str) -> Any:
    """A file's or the environment's ``value`` for ``s``, converted and checked (ConfigError names ``where``)."""
    if s.kind == "bool":
        if isinstance(value, str):
            word = value.strip().lower()
            if word not in _TRUE | _FALSE:
                raise ConfigError(f"{where}: {value!r} is not a boolean (true/false, 1/0, yes/no, on/off)")
            return word in _TRUE
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if s.kind == "list":
        items = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
        if not isinstance(items, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return [_scalar(s, v, where) for v in items]
    return _scalar(s, value, where)


def _scalar(s: Setting, value: Any, where: str) -> Any:
    if isinstance(value, bool | dict | list):
        raise ConfigError(f"{where}: expected {_type_name(s)}, got {value!r}")
    if s.convert in (int, float):
        if isinstance(value, str):
            try:
                value = s.convert(value.strip())
            except ValueError:
                raise ConfigError(f"{where}: {value!r} is not {_type_name(s)}") from None
        elif s.convert is int and not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        value = s.convert(value)
    elif isinstance(value, int | float):
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    elif s.convert is not None:
        try:
            value = s.convert(value)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: {value!r}: {e}") from None
    if s.choices is not None and value not in s.choices:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(str, s.choices))}")
    return value


def _type_name(s: Setting) -> str:
    if s.convert is int:
        return "an integer"
    return "a number" if s.convert is float else "a string"


def load_file(path: str | os.PathLike[str], settings: list[Setting] | tuple[Setting, ...]) -> dict[str, Any]:
    """The settings in the TOML file ``path`` (keys with ``-`` or ``_``), converted; an unknown key, a value of the
    wrong type or a file that is not TOML raises ConfigError naming the file and the key."""
    by_name = {s.name: s for s in settings}
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"config file {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: not valid TOML: {e}") from None
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        s = by_name.get(name)
        if s is None:
            close = difflib.get_close_matches(name, by_name, n=1, cutoff=0.8)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"config file {path}: unknown setting {key!r}{hint}")
        out[name] = _convert(s, value, f"config file {path}: {key}")
    return out


def resolve(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Effective:
    """Merge flags, ``env`` (default: the process environment) and the config file into ``args`` (changed in
    place) and say where each value came from. A namespace ``enable`` never saw is returned as it is, all
    settings from flags or defaults."""
    environ = os.environ if env is None else env
    settings: tuple[Setting, ...] = getattr(args, _SPEC_ATTR, ())
    explicit: set[str] = set(getattr(args, _EXPLICIT_ATTR, ()))
    # A flag given outside the subcommand (a global option) is not tracked: a value other than the default is
    # taken as given on the command line.
    explicit |= {s.name for s in settings if getattr(args, s.name, s.default) != s.default}
    path = getattr(args, "config", None) or environ.get(CONFIG_ENV) or None
    from_file = load_file(path, settings) if path else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for s in settings:
        if s.name in explicit:
            value, source = getattr(args, s.name), FLAG
        elif s.env in environ:
            value, source = _convert(s, environ[s.env], f"${s.env}"), ENV
        elif s.name in from_file:
            value, source = from_file[s.name], FILE
        else:
            value, source = getattr(args, s.name, s.default), DEFAULT
        if s.required and value is None:
            raise ConfigError(f"{s.flag} is required (the flag, ${s.env} or {s.name} in a --config file)")
        setattr(args, s.name, value)
        values[s.name] = value
        sources[s.name] = source
    for attr in (_SPEC_ATTR, _EXPLICIT_ATTR):
        if hasattr(args, attr):
            delattr(args, attr)
    return Effective(
        values,
        sources,
        str(path) if path else None,
        frozenset(s.name for s in settings if is_secret(s.name)),
    )
