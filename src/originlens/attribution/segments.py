"""Several segments of one run's attribution, in one process or spread over the ranks of ``torchrun``.

:func:`segment_bounds` cuts updates start+1..end into n contiguous segments; :func:`attribute_segments`
attributes them (each by :func:`~.replay.attribute_run`), every rank its own share under ``torchrun``,
Adam segments in order (each needs the moments its predecessor wrote), and gathers the results.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..distributed import barrier, shard_bounds, world
from ..errors import CompatibilityError, ConfigError
from . import store as ostore
from .replay import SegmentResult, attribute_run
from .run import RunReplay, resolve_steps


def segment_bounds(start: int, end: int, n: int) -> list[tuple[int, int]]:
    """``n`` contiguous segments (a, b] covering the updates start+1..end (sizes differ by at most one)."""
    if not 1 <= int(n) <= end - start:
        raise ConfigError(
            f"cannot cut the updates {start + 1}..{end} into {n} segments", f"use 1 ≤ --segments ≤ {end - start}"
        )
    return [(start + a, start + b) for a, b in (shard_bounds(end - start, i, int(n)) for i in range(int(n)))]


def attribute_segments(
    run_dir: str | Path,
    *,
    segments: int | None = None,
    segment: tuple[int, int] | None = None,
    steps: Iterable[int] | None = None,
    out: str | Path | None = None,
    warm: bool = False,
    overwrite: bool = False,
    **kwargs: Any,
) -> list[SegmentResult]:
    """:func:`attribute_run` over ``segments`` contiguous segments of ``segment`` (default: the whole run).

    One process: the segments in order (Adam: each continues from the moments the previous one stored).
    Under torchrun (W ranks, :func:`originlens.distributed.init`): ``segments`` defaults to W and rank r
    computes segments r, r+W, …; an Adam segment after the first recomputes missing starting moments
    from the latest stored state (``warm``; the first segment follows the caller's ``warm``).  The
    segment files are the 1-process ones bit for bit; rank 0 rebuilds ``meta.json`` once every rank is
    done.  ``steps`` are distributed to the segments containing them (each needs at least one).  Other
    keyword arguments go to :func:`attribute_run`.  Returns the results of all segments in order on rank
    0 (the other ranks' read back from their files, ``moments_path`` None) and of its own elsewhere.
    """
    from ..train.ntp import checkpoint_metadata

    rank, world_size = world()
    n = world_size if segments is None else int(segments)
    p = Path(run_dir)
    raw_step = checkpoint_metadata(p / "model.safetensors").get("step") if (p / "model.safetensors").is_file() else None
    final = int(json.loads(raw_step)) if raw_step is not None else RunReplay(p).final_step  # (or its error)
    start, end = (0, final) if segment is None else (int(segment[0]), int(segment[1]))
    if not 0 <= start < end <= final:
        raise ConfigError(
            f"segment {start}:{end} is not inside the run's updates 0:{final}", f"use 0 ≤ START < END ≤ {final}"
        )
    bounds = segment_bounds(start, end, n)
    chosen = None if steps is None else sorted({int(s) for s in steps})
    per_segment = [None if chosen is None else [s for s in chosen if a < s <= b] for a, b in bounds]
    if chosen is not None:
        resolve_steps(chosen, start, end)
        empty = [f"{a}:{b}" for (a, b), st in zip(bounds, per_segment) if not st]
        if empty:
            raise ConfigError(
                f"segments {', '.join(empty)} contain none of the selected steps",
                "use fewer --segments or select steps in every segment",
            )
    store = Path(out) if out is not None else p / "attribution"
    planned = {ostore.segment_path(store, a, b).name for a, b in bounds}
    for info in ostore.read_segment_infos(store) if store.is_dir() else ():  # fail on every rank, up front
        if info["file"] in planned and not overwrite:
            raise CompatibilityError(
                f"{store / info['file']} already exists", "pass overwrite=True (--overwrite) to recompute it"
            )
        if info["file"] not in planned and int(info["start"]) < end and start < int(info["end"]):
            raise CompatibilityError(
                f"the stored segment {info['start']}:{info['end']} overlaps the updates {start + 1}..{end}",
                "delete it, choose other segments, or another --out",
            )
    if (
        kwargs.get("optimizer", "adam") == "adam"
        and start > 0
        and not warm
        and not ostore.moments_path(store, start).is_file()
    ):  # segment 0's own check, on every rank
        raise ConfigError(
            f"Adam attribution from update {start + 1} needs the per-component moments after update "
            f"{start} ({ostore.moments_path(store, start).name})",
            f"attribute the updates ..{start} first, or pass warm=True (--warm)",
        )
    results = []
    for i, ((a, b), st) in enumerate(zip(bounds, per_segment)):
        if i % world_size == rank:
            results.append(
                attribute_run(
                    p,
                    segment=(a, b),
                    steps=st,
                    out=store,
                    overwrite=overwrite,
                    warm=warm if i == 0 or world_size == 1 else True,
                    index=False,
                    **kwargs,
                )
            )
    barrier()  # every segment file is written
    if rank == 0:
        settings = {
            k: results[0].info[k] for k in ("run", "run_config", "sites", "features", "optimizer", "types", "half")
        }
        ostore.update_meta(store, settings, {})
        own = {r.path.name: r for r in results}
        results = []
        for a, b in bounds:
            f = ostore.segment_path(store, a, b)
            if f.name not in own:
                table, info = ostore.read_segment(f)
                own[f.name] = SegmentResult(path=f, table=table, info=info, store=store)
            results.append(own[f.name])
    barrier()
    return results
