"""Observable store of an attributed training run.

Per-step influences are kept as a labelled long table, one Parquet file per replayed segment, so that
integrated influences, per-type summaries and figures can be recomputed without retraining::

    RUN/attribution/segment-{start:06d}-{end:06d}.parquet   rows of steps start+1 .. end
    RUN/attribution/moments-{end:06d}.safetensors           Adam component moments after step ``end``
    RUN/attribution/meta.json                               settings + one entry per segment (an index)

Columns (:data:`SCHEMA`): ``step`` (update s, 1-based; observables at θ_{s−1} on batch s−1),
``site_layer`` k, ``site_position`` i, ``feature``, ``type`` (null = all batch rows, else the rows of
that feature type: 0 empty, 1 NTP-useless, 2 NTP-useful), ``component`` ∈ {direct, precached, shared,
full} (full = Σ_c), ``influence`` I_c = ⟨Δ_c, ∇R⟩ (null when the type subset is empty on that batch,
never NaN), ``mismatch`` R(θ_{s−1}), ``mismatch_after`` R(θ_{s−1} − Σ_c Δ_c) on the same batch
(only with ``check_identity``; first-order identity Σ_c I_c ≈ mismatch − mismatch_after),
``n_rows`` (batch rows in the subset), ``optimizer`` (adam | sgd), ``half`` (False, the default: the
paper's R without a ½; True: R carries a ½, values half as large).  **Sign: positive influence moves the
feature toward its final value** (the update is θ ← θ − Σ_c Δ_c).

Every segment file carries its settings and replay checks in the Parquet key-value metadata
(key ``originlens``); the segment files, not ``meta.json``, are the source of truth, so segments
computed by parallel processes cannot lose rows through a racing index update.

Statistics: :func:`integrate` sums each item's influence over the recorded steps (nulls skipped, the
count of contributing steps kept).  :func:`summarize` pools **items** — one item is the integrated
influence of one (layer k, position i, feature) — within each (type, component) group and gives the
mean with a 95 % Student-t interval over items (``ci="t"``) or a percentile bootstrap over items
(``ci="bootstrap"``).  Items of one run are not independent (same trajectory, correlated cells), so
the intervals describe the spread over cells/sites, not over training seeds.  The store's report
(:func:`~.store_report.write_report`) is :mod:`.store_report`.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import CompatibilityError, ConfigError, InputError
from ..storage import atomic_write_bytes, atomic_write_json, read_json

STORE_FORMAT = "originlens-attribution"
STORE_VERSION = 1
META_KEY = b"originlens"
COMPONENT_ORDER = ("direct", "precached", "shared", "full")
ITEM_KEYS = ("site_layer", "site_position", "feature")
POOLING_UNIT = "item = integrated influence of one (layer k, position i, feature); items pooled per (type, component)"
SIGN_CONVENTION = (
    "positive influence = the component moves the probed feature toward its final value "
    "(update θ ← θ − Σ_c Δ_c, I_c = ⟨Δ_c, ∇R⟩)"
)
# Settings that must agree across the segments of one store.
SETTING_KEYS = ("run_config", "sites", "features", "optimizer", "types", "half", "random_directions", "carry")
RANDOM_TAG = "~random"  # feature "c3~random0": null direction 0 of feature c3 (same site, same norm)

SCHEMA = pa.schema(
    [
        ("step", pa.int32()),
        ("site_layer", pa.int16()),
        ("site_position", pa.int16()),
        ("feature", pa.string()),
        ("type", pa.int8()),
        ("component", pa.string()),
        ("influence", pa.float64()),
        ("mismatch", pa.float64()),
        ("mismatch_after", pa.float64()),
        ("n_rows", pa.int32()),
        ("optimizer", pa.string()),
        ("half", pa.bool_()),
    ]
)


def mismatch_factor_text(half: bool) -> str:
    return (
        "R = ½·mean_b(⟨w,r(θ)⟩ − ⟨w,r(θ*)⟩)² (factor ½: values ½ of the paper's)"
        if half
        else "R = mean_b(⟨w,r(θ)⟩ − ⟨w,r(θ*)⟩)² (the paper's convention, no ½)"
    )


# ----------------------------------------------------------------------------------------------------
# files


def store_dir(path: str | Path) -> Path:
    """``RUN/attribution`` for a run directory, or ``path`` itself when it already is a store."""
    p = Path(path)
    if (p / "attribution").is_dir() and not list(p.glob("segment-*.parquet")):
        return p / "attribution"
    return p


def segment_path(directory: str | Path, start: int, end: int) -> Path:
    return Path(directory) / f"segment-{int(start):06d}-{int(end):06d}.parquet"


def moments_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"moments-{int(step):06d}.safetensors"


def list_moments(directory: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of persisted Adam component-moment states, ascending."""
    out = []
    for p in Path(directory).glob("moments-*.safetensors"):
        try:
            out.append((int(p.stem.split("-")[1]), p))
        except (IndexError, ValueError):
            continue
    return sorted(out)


def observables_table(rows: Mapping[str, Sequence[Any]]) -> pa.Table:
    """Build a table with :data:`SCHEMA` from column lists (missing optional columns become null)."""
    n = len(rows["step"])
    cols = {}
    for f in SCHEMA:
        vals = rows.get(f.name)
        if f.name == "mismatch_after" and not vals:
            vals = None
        if vals is None:
            if f.name != "mismatch_after":
                raise InputError(f"observable column {f.name!r} is missing", "pass every SCHEMA column")
            vals = [None] * n
        if len(vals) != n:
            raise InputError(f"column {f.name!r} has {len(vals)} values, expected {n}", "pass equal-length columns")
        cols[f.name] = pa.array(vals, type=f.type)
    return pa.table(cols, schema=SCHEMA)


def write_segment(
    directory: str | Path, table: pa.Table, *, start: int, end: int, info: Mapping[str, Any], overwrite: bool = False
) -> Path:
    """Write one segment atomically (Parquet, settings and checks in the key-value metadata)."""
    path = segment_path(directory, start, end)
    if path.exists() and not overwrite:
        raise CompatibilityError(f"{path} already exists", "pass overwrite=True (--overwrite) to recompute it")
    for other in read_segment_infos(directory):
        if other["file"] != path.name:
            check_settings(other, info, str(directory))
        if other["file"] != path.name and int(other["start"]) < end and start < int(other["end"]):
            raise CompatibilityError(
                f"segment {start}:{end} overlaps the stored segment {other['start']}:{other['end']}",
                "choose non-overlapping segments, or another --out",
            )
    if table.schema != SCHEMA:
        table = table.cast(SCHEMA)
    meta = {
        "format": STORE_FORMAT,
        "version": STORE_VERSION,
        "start": int(start),
        "end": int(end),
        "file": path.name,
        **info,
    }
    table = table.replace_schema_metadata({META_KEY: json.dumps(meta, default=_json).encode("utf-8")})
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return atomic_write_bytes(path, buf.getvalue())


def _json(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def read_segment(path: str | Path) -> tuple[pa.Table, dict[str, Any]]:
    """(table, info) of one segment file."""
    path = Path(path)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"{path} is not a readable Parquet segment ({exc})", "recompute that segment") from None
    raw = (table.schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise CompatibilityError(f"{path} has no originlens metadata", "recompute it with originlens ntp attribute")
    info = json.loads(raw.decode("utf-8"))
    if info.get("format") != STORE_FORMAT or int(info.get("version", -1)) != STORE_VERSION:
        raise CompatibilityError(
            f"{path} is format {info.get('format')} v{info.get('version')}, expected {STORE_FORMAT} v{STORE_VERSION}",
            "recompute it with this originlens",
        )
    return table.replace_schema_metadata(None), info


def read_segment_infos(directory: str | Path) -> list[dict[str, Any]]:
    """Metadata of every segment under ``directory`` (ascending start), without reading the rows."""
    out = []
    for p in sorted(Path(directory).glob("segment-*.parquet")):
        try:
            raw = (pq.read_schema(p).metadata or {}).get(META_KEY)
        except (OSError, pa.ArrowInvalid) as exc:
            raise InputError(f"{p} is not a readable Parquet segment ({exc})", "delete and recompute it") from None
        if raw is None:
            raise CompatibilityError(f"{p} has no originlens metadata", "delete it or recompute it")
        out.append(json.loads(raw.decode("utf-8")))
    return sorted(out, key=lambda d: (int(d["start"]), int(d["end"])))


def check_settings(stored: Mapping[str, Any], new: Mapping[str, Any], where: str) -> None:
    """Raise ``CompatibilityError`` if ``new`` differs from ``stored`` in a :data:`SETTING_KEYS` field."""
    defaults = {"random_directions": 0, "carry": False}  # segments written before the setting existed
    diff = [
        k
        for k in SETTING_KEYS
        if json.dumps(stored.get(k, defaults.get(k)), default=_json)
        != json.dumps(new.get(k, defaults.get(k)), default=_json)
    ]
    if diff:
        parts = "; ".join(f"{k}: {stored.get(k)!r} there vs {new.get(k)!r}" for k in diff if k != "run_config")
        if "run_config" in diff:
            parts = ("the run's configuration differs; " + parts).strip("; ")
        raise CompatibilityError(
            f"{where} holds attribution with other settings ({parts})",
            "use the same --sites/--features/--optimizer/--no-types/--half/--random-directions, or another --out",
        )


def load_observables(path: str | Path) -> pa.Table:
    """All segments of a store (``RUN``, ``RUN/attribution`` or one ``.parquet``) as one table.

    Checks that the segments share their settings and do not overlap; rows are ordered by segment.
    """
    p = Path(path)
    if p.is_file():
        return read_segment(p)[0]
    d = store_dir(p)
    files = sorted(d.glob("segment-*.parquet"))
    if not files:
        raise InputError(
            f"no attribution segments under {d}", "run `originlens ntp attribute RUN --sites ... --features ...` first"
        )
    tables: list[pa.Table]
    infos: list[dict[str, Any]]
    tables, infos = [], []
    for f in files:
        t, info = read_segment(f)
        if infos:
            check_settings(infos[0], info, f"{f}")
        tables.append(t)
        infos.append(info)
    order = sorted(range(len(infos)), key=lambda j: int(infos[j]["start"]))
    for a, b in zip(order, order[1:]):
        if int(infos[b]["start"]) < int(infos[a]["end"]):
            raise CompatibilityError(
                f"segments {infos[a]['file']} and {infos[b]['file']} overlap", "delete one of them"
            )
    return pa.concat_tables([tables[j] for j in order])


def read_meta(directory: str | Path) -> dict[str, Any] | None:
    p = Path(directory) / "meta.json"
    return read_json(p) if p.is_file() else None


def update_meta(directory: str | Path, settings: Mapping[str, Any], segment_info: Mapping[str, Any]) -> Path:
    """Rewrite ``meta.json``: settings, conventions and the index of segments (rebuilt from the files)."""
    d = Path(directory)
    infos = read_segment_infos(d)
    meta = {
        "format": STORE_FORMAT,
        "version": STORE_VERSION,
        **{k: settings[k] for k in settings},
        "sign": SIGN_CONVENTION,
        "mismatch": mismatch_factor_text(bool(settings.get("half", True))),
        "pooling_unit": POOLING_UNIT,
        "segments": [
            {
                k: i.get(k)
                for k in (
                    "file",
                    "start",
                    "end",
                    "n_recorded_steps",
                    "rows",
                    "seconds",
                    "seconds_per_attributed_step",
                    "checks",
                )
            }
            for i in infos
        ],
    }
    if segment_info and not any(i["file"] == segment_info.get("file") for i in infos):
        meta["segments"].append(dict(segment_info))
    return atomic_write_json(d / "meta.json", meta)


# ----------------------------------------------------------------------------------------------------
# statistics


def integrate(table: pa.Table) -> pa.Table:
    """Integrated influence per item, type and component: Σ over steps (null steps skipped).

    Returns columns ``site_layer, site_position, feature, type, component, optimizer, half,
    integrated, n_steps, first_step, last_step`` (``integrated`` null when no step had the subset).
    """
    keys = ["site_layer", "site_position", "feature", "type", "component", "optimizer", "half"]
    g = group_by(table, keys, [("influence", "sum"), ("influence", "count"), ("step", "min"), ("step", "max")])
    return g.rename_columns(
        [
            c.replace("influence_sum", "integrated")
            .replace("influence_count", "n_steps")
            .replace("step_min", "first_step")
            .replace("step_max", "last_step")
            for c in g.column_names
        ]
    )


NULL_TYPE = -128  # stands in for a null ``type`` (all types pooled) while grouping


def group_by(table: pa.Table, keys: list[str], aggregations: list[tuple[str, str]]) -> pa.Table:
    """``table.group_by(keys).aggregate(aggregations)`` with null ``type`` keys grouped together: older
    pyarrow releases (14 among them) put every row with a null key in a group of its own, so the null is
    replaced by :data:`NULL_TYPE` for the grouping and restored after."""
    import pyarrow.compute as pc

    t = table
    if "type" in keys and t.column("type").null_count:
        i = t.schema.get_field_index("type")
        t = t.set_column(i, "type", pc.fill_null(t.column("type"), pa.scalar(NULL_TYPE, t.schema.field("type").type)))
    g = t.group_by(keys).aggregate(aggregations)
    if "type" in keys and t is not table:
        i = g.schema.get_field_index("type")
        col = g.column("type")
        g = g.set_column(i, "type", pc.if_else(pc.equal(col, NULL_TYPE), pa.scalar(None, col.type), col))
    return g


@dataclass
class Summary:
    """Pooled integrated influence of one group (e.g. type 2 × direct) with its interval."""

    group: dict[str, Any]
    mean: float
    lo: float
    hi: float
    n_items: int
    std: float
    method: str
    level: float


def _t_interval(x: np.ndarray, level: float) -> tuple[float, float]:
    from scipy import stats

    n = len(x)
    if n < 2:
        return math.nan, math.nan
    half = stats.t.ppf(0.5 + level / 2, n - 1) * x.std(ddof=1) / math.sqrt(n)
    return float(x.mean() - half), float(x.mean() + half)


def _bootstrap(x: np.ndarray, level: float, n_boot: int, seed: int) -> tuple[float, float]:
    if len(x) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(1)
    a = (1 - level) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def summarize(
    integrated: pa.Table,
    *,
    by: Sequence[str] = ("type", "component"),
    ci: str = "t",
    level: float = 0.95,
    n_boot: int = 10_000,
    seed: int = 0,
) -> list[Summary]:
    """Mean integrated influence over items in each ``by`` group with a ``level`` interval.

    ``ci="t"``: Student-t interval over items; ``"bootstrap"``: percentile bootstrap over items
    (``n_boot`` resamples, numpy ``default_rng(seed)``).  Items with a null integral are dropped.
    Groups come out sorted (types ascending with null = all rows first; components in
    :data:`COMPONENT_ORDER`).
    """
    if ci not in ("t", "bootstrap"):
        raise ConfigError(f"unknown interval method {ci!r}", "use ci='t' or ci='bootstrap'")
    if not 0 < level < 1:
        raise ConfigError(f"level={level} must be in (0, 1)", "e.g. level=0.95")
    cols = {c: integrated.column(c).to_pylist() for c in (*by, "integrated")}
    groups: dict[tuple, list[float]] = {}
    for j in range(integrated.num_rows):
        v = cols["integrated"][j]
        if v is None or not math.isfinite(v):
            continue
        groups.setdefault(tuple(cols[c][j] for c in by), []).append(float(v))

    def order(key: tuple) -> tuple:
        out = []
        for c, v in zip(by, key):
            if c == "component":
                out.append(COMPONENT_ORDER.index(v) if v in COMPONENT_ORDER else len(COMPONENT_ORDER))
            elif v is None:
                out.append(-1)
            else:
                out.append(v)
        return tuple(out)

    out = []
    for key in sorted(groups, key=order):
        x = np.asarray(groups[key], dtype=np.float64)
        lo, hi = _t_interval(x, level) if ci == "t" else _bootstrap(x, level, n_boot, seed)
        out.append(
            Summary(
                group=dict(zip(by, key)),
                mean=float(x.mean()),
                lo=lo,
                hi=hi,
                n_items=len(x),
                std=float(x.std(ddof=1)) if len(x) > 1 else math.nan,
                method=ci,
                level=level,
            )
        )
    return out


def summary_records(summaries: Iterable[Summary]) -> list[dict[str, Any]]:
    """Plain dicts (JSON-ready) of :func:`summarize` output."""
    return [
        {
            **s.group,
            "mean": s.mean,
            "lo": s.lo,
            "hi": s.hi,
            "n_items": s.n_items,
            "std": s.std,
            "method": s.method,
            "level": s.level,
        }
        for s in summaries
    ]


# ----------------------------------------------------------------------------------------------------
# the paper's Othello sign pattern (the report of a store: .store_report)

# the Othello pattern of arXiv 2603.14087: (component, type, expected sign of the integrated influence)
SIGN_EXPECTATIONS = (
    ("direct", 2, "> 0"),
    ("direct", 1, "≤ 0"),
    ("precached", 1, "> 0"),
    ("shared", 2, "> 0"),
    ("shared", 1, "> 0"),
)


def sign_pattern(summaries: Sequence[Summary]) -> list[dict[str, Any]]:
    """Compare per-type means with the Othello pattern of arXiv 2603.14087 (direct > 0 only for useful cells,
    pre-cached > 0 for useless cells, shared > 0 for both).  ``holds``: the mean has the expected sign;
    ``significant``: the interval excludes 0 on that side."""
    by = {(s.group.get("component"), s.group.get("type")): s for s in summaries}
    out = []
    for comp, ty, want in SIGN_EXPECTATIONS:
        s = by.get((comp, ty))
        if s is None:
            continue
        if want == "> 0":
            holds, sig = s.mean > 0, s.lo > 0
        else:
            holds, sig = s.mean <= 0, s.hi <= 0
        out.append(
            {
                "component": comp,
                "type": ty,
                "expected": want,
                "mean": s.mean,
                "lo": s.lo,
                "hi": s.hi,
                "holds": bool(holds),
                "significant": bool(sig),
            }
        )
    return out
