"""One checkpoint comparison from the comparisons of contiguous blocks of its checkpoints.

``lm compare --shard I/N`` compares block I of N of the checkpoint list (each block on its own process or
machine; a checkpoint's cosines do not depend on the other checkpoints); :func:`merge_comparisons` puts the
blocks back in order: cosines and per-head cosines concatenated along the checkpoint axis, the grid's
records joined and weight duplicates found again across blocks (from the recorded weight hashes), the
null-level warnings recomputed on the whole grid.  The blocks must share the statistics, the model
architecture and every comparison setting (:class:`~originlens.errors.InputError` otherwise).

Caveat: values are merged as the blocks' ``results.json`` hold them (rounded to 6 decimals, as an
unsharded run writes them), so a merged ``results.json`` equals the unsharded one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InputError
from .compare import ComparisonResult, null_level_warnings

SHARD_KEY = "shard"  # result.config[SHARD_KEY] = {"index": i, "count": n, "checkpoints_total": m}
_PER_BLOCK_WARNINGS = ("has the same weights as", "token-permuted null")


def _settings(r: ComparisonResult) -> dict[str, Any]:
    return {k: v for k, v in r.config.items() if k != SHARD_KEY}


def merge_comparisons(parts: Sequence[ComparisonResult]) -> ComparisonResult:
    """The comparison of all checkpoints from the results of ``--shard i/N`` runs, i = 0..N-1 (any order)."""
    if not parts:
        raise InputError("no comparison to merge", "pass the runs of `lm compare --shard I/N`")
    if any(not p.config.get(SHARD_KEY) for p in parts):
        raise InputError("a run to merge was made without --shard", "merge the runs of `lm compare --shard I/N`")
    shards: list[dict[str, Any]] = [dict(p.config[SHARD_KEY]) for p in parts]
    n = int(shards[0]["count"])
    index = sorted(int(s["index"]) for s in shards)
    if any(int(s["count"]) != n for s in shards) or index != list(range(n)):
        raise InputError(f"shards {index} of {n} given", f"pass every shard 0/{n} … {n - 1}/{n} exactly once")
    order = sorted(range(len(parts)), key=lambda j: int(shards[j]["index"]))
    ps = [parts[j] for j in order]
    first = ps[0]
    for p in ps[1:]:
        if (
            p.layers != first.layers
            or p.statistics != first.statistics
            or p.model != first.model
            or _settings(p) != _settings(first)
            or set(p.cosines) != set(first.cosines)
            or {v: set(h) for v, h in p.heads.items()} != {v: set(h) for v, h in first.heads.items()}
        ):
            raise InputError(
                "the shards differ in statistics, model architecture or comparison settings",
                "merge the shards of one `lm compare` command (same --corpus/--stats, --top-tokens, --layers, ...)",
            )
    cos = {v: {k: np.concatenate([p.cosines[v][k] for p in ps], axis=1) for k in m} for v, m in first.cosines.items()}
    heads = {v: {l: np.concatenate([p.heads[v][l] for p in ps], axis=1) for l in h} for v, h in first.heads.items()}
    labels = [lab for p in ps for lab in p.labels]
    total = int(shards[order[0]]["checkpoints_total"])
    grid = _merge_grids([p.grid for p in ps])
    out = ComparisonResult(
        labels=labels,
        layers=list(first.layers),
        cosines=cos,
        heads=heads,
        grid=grid,
        statistics=dict(first.statistics),
        model=dict(first.model),
        config={**_settings(first), "merged_from_shards": n, "checkpoints_total": total},
        timings={
            "statistics_s": [p.timings.get("statistics_s") for p in ps],
            "theory_prepare_s": [p.timings.get("theory_prepare_s") for p in ps],
            "load_s": [x for p in ps for x in p.timings.get("load_s", [])],
            "compare_s": [x for p in ps for x in p.timings.get("compare_s", [])],
            "total_s": [p.timings.get("total_s") for p in ps],
        },
    )
    kept: list[str] = []
    for p in ps:
        for w in p.warnings:
            if not any(s in w for s in _PER_BLOCK_WARNINGS) and w not in kept:
                kept.append(w)
    out.warnings = (
        kept
        + [f"checkpoint {x['label']} has the same weights as {x['same_as']}" for x in grid.get("duplicates", [])]
        + null_level_warnings(out)
    )
    return out


def _merge_grids(grids: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The grids' records joined in block order; duplicates found again over all blocks (first occurrence
    of a weight hash is the original, as within one grid)."""
    if not grids or not any(grids):
        return {}
    labels = [lab for g in grids for lab in g.get("labels", [])]
    hashes: dict[str, str] = {}
    for g in grids:
        hashes.update(g.get("hashes", {}))
    duplicates: list[dict[str, str]] = []
    seen: dict[str, str] = {}
    for lab in labels:
        h = hashes.get(lab)
        if h is None:
            continue
        if h in seen:
            duplicates.append({"label": lab, "same_as": seen[h], "sha256": h})
        else:
            seen[h] = lab
    commits: dict[str, Any] = {}
    for g in grids:
        commits.update(g.get("commits", {}))
    return {
        "specs": [s for g in grids for s in g.get("specs", [])],
        "labels": labels,
        "on_missing": grids[0].get("on_missing"),
        "hashes": hashes,
        "commits": commits,
        "duplicates": duplicates,
        "skipped": [s for g in grids for s in g.get("skipped", [])],
    }
