"""Building configuration dataclasses from untrusted mappings (JSON files, overrides, metadata).

:func:`from_mapping(cls, d, where="config.json")` turns a dict into ``cls(**d)`` after checking it:

* ``d`` must be a mapping with string keys;
* unknown keys are a :class:`~originlens.errors.ConfigError` with a ``difflib`` suggestion
  ("unknown key 'lerning_rate' in config.json; did you mean 'learning_rate'?");
* missing required fields (no default) are named;
* JSON-like values (``bool``, ``int``, ``float``, ``str``, ``None``, lists, dicts) are checked against the
  field's type hint (``int``, ``float``, ``str``, ``bool``, ``X | None``, unions, ``list[T]``,
  ``tuple[T, ...]``, ``tuple[A, B]``, ``dict[K, V]``, ``Sequence[T]``, ``Literal[...]``, nested dataclasses);
  a wrong type names the key, the expected and the received type.  Lists given for tuple fields become
  tuples, mappings given for dataclass fields are built recursively;
* range checks are left to the dataclass's own validation (``__post_init__``); a ``TypeError`` or
  ``ValueError`` escaping it is reported as a ``ConfigError`` too.

Caveats: ``bool`` is not accepted where an ``int`` or ``float`` is expected (JSON ``true`` is not 1), and
an integral ``float`` (``2.0``) is not accepted for an ``int``.  Values that are not JSON-like (a
``torch.dtype``, a numpy scalar, a ``Path``) are passed through unchecked: they can only come from
Python callers, and the dataclass validates them.  Hints that cannot be resolved or checked (``Any``,
callables, classes other than the ones above) accept everything.
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from .errors import ConfigError, OriginlensError

T = TypeVar("T")

_JSON_SCALARS = (bool, int, float, str, type(None))
_JSON_CONTAINERS = (list, tuple, dict)


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "list",
        tuple: "list",
        dict: "mapping",
    }.get(type(v), type(v).__name__)


def _describe(v: Any) -> str:
    """``integer 3``, ``string 'abc'`` (shortened), ``list`` / ``mapping`` for containers."""
    if isinstance(v, (list, tuple, dict)):
        return _type_name(v)
    if isinstance(v, str) and len(v) > 40:
        v = v[:40] + "…"
    return f"{_type_name(v)} {v!r}" if v is not None else "null"


def _hint_name(h: Any) -> str:
    if h is type(None):
        return "null"
    if h is Any:
        return "anything"
    origin = typing.get_origin(h)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_hint_name(a) for a in typing.get_args(h))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(h))
    if origin is not None:
        args = typing.get_args(h)
        base = {list: "list", tuple: "list", dict: "mapping", cabc.Sequence: "list", cabc.Mapping: "mapping"}.get(
            origin, getattr(origin, "__name__", str(origin))
        )
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return f"list of {_hint_name(args[0])}"
        if origin is tuple:
            return f"list of {len(args)} ({', '.join(_hint_name(a) for a in args)})"
        if origin in (list, cabc.Sequence) and args:
            return f"list of {_hint_name(args[0])}"
        return base
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "list",
        tuple: "list",
        dict: "mapping",
    }.get(h, getattr(h, "__name__", str(h)))


class _Mismatch(Exception):
    """Internal: a value does not fit a hint (``path`` locates it inside nested containers)."""

    def __init__(self, path: str, expected: str, got: Any) -> None:
        super().__init__(path)
        self.path, self.expected, self.got = path, expected, got


def _is_json_like(v: Any) -> bool:
    return isinstance(v, _JSON_SCALARS + _JSON_CONTAINERS)


def _convert(value: Any, hint: Any, path: str, where: str) -> Any:
    """Check ``value`` against ``hint``; returns the (possibly converted) value or raises _Mismatch."""
    if hint is Any or hint is typing.Any or isinstance(hint, (str, typing.ForwardRef)):
        return value
    if not _is_json_like(value):
        return value  # Python objects: the dataclass validates them
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        # try exact matches first so that e.g. ``int | str`` keeps an int as int
        errors: list[_Mismatch] = []
        for a in args:
            try:
                return _convert(value, a, path, where)
            except _Mismatch as exc:
                errors.append(exc)
        deeper = [e for e in errors if e.path != path]
        if len(deeper) == 1:  # only one branch matched the outer container: report inside
            raise deeper[0]
        raise _Mismatch(path, _hint_name(hint), value)
    if origin is typing.Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        raise _Mismatch(path, _hint_name(hint), value)
    if hint is type(None) or hint is None:
        if value is None:
            return None
        raise _Mismatch(path, "null", value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch(path, "boolean", value)
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch(path, "integer", value)
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        raise _Mismatch(path, "number", value)
    if hint is str:
        if isinstance(value, str):
            return value
        raise _Mismatch(path, "string", value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if isinstance(value, Mapping):
            return from_mapping(hint, value, where=f"{where}: {path}")
        raise _Mismatch(path, f"mapping ({hint.__name__})", value)
    if origin in (list, tuple, cabc.Sequence, cabc.MutableSequence) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch(path, _hint_name(hint), value)
        if origin is tuple or hint is tuple:
            if not args:
                return tuple(value)
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(_convert(v, args[0], f"{path}[{i}]", where) for i, v in enumerate(value))
            if len(value) != len(args):
                raise _Mismatch(path, _hint_name(hint), value)
            return tuple(_convert(v, a, f"{path}[{i}]", where) for i, (v, a) in enumerate(zip(value, args)))
        items = [_convert(v, args[0], f"{path}[{i}]", where) for i, v in enumerate(value)] if args else list(value)
        return tuple(items) if isinstance(value, tuple) and origin is not list else items
    if origin in (dict, cabc.Mapping, cabc.MutableMapping) or hint is dict:
        if not isinstance(value, Mapping):
            raise _Mismatch(path, "mapping", value)
        if not args:
            return dict(value)
        kt, vt = args
        return {
            _convert(k, kt, f"{path} key {k!r}", where): _convert(v, vt, f"{path}[{k!r}]", where)
            for k, v in value.items()
        }
    return value  # a hint we do not check (Callable, custom classes, ...)


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # unresolvable forward references: check nothing
        return {}


def suggest(name: str, candidates: typing.Iterable[str]) -> str | None:
    """The closest candidate to ``name`` (``difflib``), or None."""
    cands = list(candidates)
    m = difflib.get_close_matches(name, cands, n=1, cutoff=0.6)
    if not m:
        low = {c.lower(): c for c in cands}
        m = [low[x] for x in difflib.get_close_matches(name.lower().replace("-", "_"), list(low), n=1, cutoff=0.6)]
    return m[0] if m else None


def from_mapping(cls: type[T], d: Any, *, where: str = "config") -> T:
    """Build the dataclass ``cls`` from the mapping ``d`` with clear errors.

    Args:
        cls: a dataclass type.
        d: the mapping (e.g. parsed JSON).
        where: what to call the source in messages (``"config.json"``, ``"--config FILE"``, ...).

    Raises:
        ConfigError: ``d`` is not a mapping, has unknown keys (with a suggestion), lacks a required key,
            has a value of the wrong type, or the dataclass's own validation refuses a value.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"from_mapping needs a dataclass type, got {cls!r}")
    name = cls.__name__
    if not isinstance(d, Mapping):
        raise ConfigError(
            f"{where} must be a mapping of {name} keys, got {_type_name(d)}",
            'write a JSON object such as {"key": value}',
        )
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    bad_keys = [k for k in d if not isinstance(k, str)]
    if bad_keys:
        raise ConfigError(f"{where} has non-string key {bad_keys[0]!r}", "use field names as keys")
    unknown = [k for k in d if k not in fields]
    if unknown:
        k = unknown[0]
        guess = suggest(k, fields)
        more = (
            f" (and {len(unknown) - 1} more unknown key(s): {', '.join(map(repr, unknown[1:4]))})"
            if len(unknown) > 1
            else ""
        )
        hint = f"; did you mean {guess!r}?" if guess else ""
        raise ConfigError(
            f"unknown key {k!r} in {where}{hint}{more}", f"valid keys of {name}: {', '.join(sorted(fields))}"
        )
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for k, v in d.items():
        try:
            kwargs[k] = _convert(v, hints.get(k, Any), k, where)
        except _Mismatch as exc:
            raise ConfigError(
                f"{where}: key {exc.path!r} expects {exc.expected}, got {_describe(exc.got)}", f"fix the value of {k!r}"
            ) from None
    missing = [
        f
        for f, spec in fields.items()
        if f not in d and spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(
            f"{where} lacks required key(s) {', '.join(map(repr, missing))} of {name}", f"add {missing[0]!r}"
        )
    try:
        return cls(**kwargs)
    except OriginlensError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise ConfigError(f"invalid {name} in {where}: {exc}", "check the values against the documentation") from None


def load_config(cls: type[T], path: str | Path) -> T:
    """Read a JSON file (``originlens.storage.read_json``) and build ``cls`` with :func:`from_mapping`."""
    from .storage import read_json

    return from_mapping(cls, read_json(path), where=str(path))
