"""Unit records: the measured values of one unit of an experiment (a training seed, an (η, seed) run), with
their provenance, written beside the experiment's results file so that the analysis over units can be redone
from the records alone.

An experiment whose units each cost an hour of CPU need not run them in one process or on one machine:
every finished unit writes ``results/<experiment>/<name>/<unit>.json``; a later call with
``from_records=True`` reads the units' records (checked against the configuration it is asked for) and
writes the combined results file without the run directories.  A record holds::

    {"format": "originlens-unit-record/1", "experiment": ..., "name": ..., "unit": "seed-0",
     "command": ..., "created": ..., "git_commit": ..., "versions": ..., "machine": ...,
     "train_commit": <commit that trained the unit, from its run's environment.json>,
     "config_key": {...},     # what must agree between units for them to be combined
     "values": {...}}         # the unit's numbers, exactly as the experiment aggregates them

Caveat: units made by different commits are combined when their configurations agree; each unit's commits
stay in the combined results file (``runs[].commits``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InputError
from ..locks import holding_path
from ..runs import to_jsonable
from ..storage import atomic_write_json, read_json

FORMAT = "originlens-unit-record/1"


def record_path(results_path: str | Path, unit: str) -> Path:
    """``results/othello/othello-cpu.json`` and ``seed-0`` → ``results/othello/othello-cpu/seed-0.json``."""
    p = Path(results_path)
    return p.parent / p.stem / f"{unit}.json"


def check_record_slot(path: str | Path, *, unit: str, config_key: dict[str, Any]) -> None:
    """Refuse (one :class:`~originlens.errors.InputError`) when ``path`` holds a unit record made with
    another configuration: writing this unit's record there would silently replace a committed one (a
    short trial run of a named scale with a few flags changed, say).  Call it before the work, too."""
    path = Path(path)
    if not path.is_file():
        return
    try:
        rec = read_json(path)
    except Exception:  # unreadable: the writer replaces it like any broken file
        return
    if isinstance(rec, dict) and rec.get("format") == FORMAT and rec.get("config_key") != to_jsonable(config_key):
        raise InputError(
            f"{path} holds the record of {unit} made with another configuration; this run's record would replace it",
            "pass --results PATH to record this configuration elsewhere, or move that record away",
        )


def write_unit_record(
    path: str | Path,
    *,
    experiment: str,
    name: str,
    unit: str,
    config_key: dict[str, Any],
    values: dict[str, Any],
    command: str,
    run_dir: str | Path | None = None,
) -> Path:
    """Write one unit's record (see the module docstring); ``run_dir``: the unit's run directory, whose
    ``environment.json`` names the commit that trained it."""
    from .results import provenance

    check_record_slot(path, unit=unit, config_key=config_key)
    train_commit = None
    env = Path(run_dir) / "environment.json" if run_dir is not None else None
    if env is not None and env.is_file():
        train_commit = read_json(env).get("git_commit")
    record = {
        "format": FORMAT,
        "experiment": experiment,
        "name": name,
        "unit": unit,
        "command": command,
        **provenance(),
        "train_commit": train_commit,
        "config_key": to_jsonable(config_key),
        "values": to_jsonable(values),
    }
    with holding_path(path):  # a second writer of the same file is refused, never interleaved
        return atomic_write_json(path, record)


def read_unit_record(path: str | Path, *, experiment: str, unit: str, config_key: dict[str, Any]) -> dict[str, Any]:
    """A unit's record checked against the experiment, the unit and ``config_key`` (one
    :class:`~originlens.errors.InputError` naming what differs)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(
            f"no record of {unit} at {path}",
            "run that unit first (the experiment command without --from-records writes its record)",
        )
    rec = read_json(path)
    if not isinstance(rec, dict) or rec.get("format") != FORMAT or rec.get("experiment") != experiment:
        raise InputError(
            f"{path} is not a unit record of the {experiment} experiment ({FORMAT})",
            "regenerate it with the experiment command",
        )
    if rec.get("unit") != unit:
        raise InputError(f"{path} holds {rec.get('unit')}, not {unit}", "check the records directory")
    want, have = to_jsonable(config_key), rec.get("config_key", {})
    if have != want:
        diff = sorted(
            [
                f"{part}.{k}"
                for part in want
                if isinstance(want[part], dict) and isinstance(have.get(part), dict)
                for k in set(want[part]) | set(have[part])
                if want[part].get(k) != have[part].get(k)
            ]
            + [
                part
                for part in set(want) | set(have)
                if not (isinstance(want.get(part), dict) and isinstance(have.get(part), dict))
                and want.get(part) != have.get(part)
            ]
        )
        raise InputError(
            f"{path} was made with another configuration (differs in {', '.join(diff) or 'layout'})",
            "combine only units of one configuration, or rerun that unit",
        )
    return rec


def commits_of(rec: dict[str, Any]) -> dict[str, Any]:
    """The commits and command behind a unit record (for the combined results file's ``runs``)."""
    return {"record": rec.get("git_commit"), "train": rec.get("train_commit"), "command": rec.get("command")}
