"""The (regime, seed) runs of the TinyStories experiment (:mod:`.language`): training each run and its
initial-model null, attributing it where asked, and skipping what is finished (:func:`run_all_units`, in parallel
processes of one torch thread each when ``jobs`` > 1).  A run is trained and attributed in one process with
one thread count, as bit-exact replay requires.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .language_config import LanguageExperimentConfig


def run_dirs(out: Path, regime: str, seed: int) -> tuple[Path, Path]:
    from ..train.grid import run_dir_for

    return run_dir_for(out / "trained", regime, seed), run_dir_for(out / "initial", regime, seed)


def _attribution_done(store: Path, end: int, sites: Sequence[Sequence[int]]) -> bool:
    """Whether ``store`` holds the Adam attribution of updates 1..``end`` at ``sites``; a store attributed
    with other sites, steps or optimizer is refused (its numbers would not be the requested ones)."""
    from ..attribution.store import read_segment_infos
    from ..errors import CompatibilityError

    infos = read_segment_infos(store) if store.is_dir() else []
    want = sorted([int(k), int(i)] for k, i in sites)
    for s in infos:
        got = sorted([int(k), int(i)] for k, i in s.get("sites", []))
        if got != want or s.get("optimizer") != "adam" or int(s["start"]) != 0 or int(s["end"]) != end:
            raise CompatibilityError(
                f"{store} holds an attribution of updates {int(s['start']) + 1}..{s['end']} at sites {got} "
                f"({s.get('optimizer')}), not updates 1..{end} at sites {want} (adam)",
                "use the same --attribute-positions / --attribute-layers / --attribute-steps, or delete that "
                "attribution directory to recompute it",
            )
    return bool(infos)


def _run_job(job: dict[str, Any]) -> list[str]:
    """Train (or skip) one (regime, seed), its initial-model null, and attribute it if asked — in one
    process with one thread count, as bit-exact replay requires."""
    import torch

    from ..train.ntp import NTPConfig, is_finished, train

    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    done = []
    for key in ("trained", "initial"):
        cfg = NTPConfig.from_dict(job[key])
        d = Path(job[f"{key}_dir"])
        if not is_finished(d, cfg):
            t = time.time()
            train(cfg, d, resume=True)
            done.append(f"{d}: trained in {time.time() - t:.0f} s")
    attr = job.get("attribution")
    if attr:
        from ..attribution.replay import attribute_run

        d = Path(job["trained_dir"])
        store = d / "attribution"
        if not _attribution_done(store, attr["end"], attr["sites"]):
            from ..storage import read_json

            t = time.time()
            # bit-exact replay needs the thread count the run was trained with (a run trained by an earlier call)
            trained_threads = read_json(d / "environment.json").get("torch_threads")
            old = torch.get_num_threads()
            if trained_threads and int(trained_threads) != old:
                torch.set_num_threads(int(trained_threads))
            try:
                attribute_run(
                    d,
                    sites=[tuple(s) for s in attr["sites"]],
                    features="all",
                    optimizer="adam",
                    segment=(0, attr["end"]),
                    out=store,
                )
            finally:
                torch.set_num_threads(old)
            done.append(f"{store}: attributed updates 1..{attr['end']} in {time.time() - t:.0f} s")
    return done


def _jobs(config: LanguageExperimentConfig, out: Path) -> list[dict[str, Any]]:
    from ..train.ntp import is_finished

    jobs = []
    for regime in config.regimes:
        for seed in config.seeds:
            tr, ini = config.run_config(regime, seed, initial=False), config.run_config(regime, seed, initial=True)
            d, d0 = run_dirs(out, regime, seed)
            attr: dict[str, Any] | None = None
            if regime in (config.attribute_regimes or []):
                assert config.attribute_layers is not None and config.attribute_positions is not None  # __post_init__
                attr = {
                    "sites": [[k, i] for k in config.attribute_layers for i in config.attribute_positions],
                    "end": config.end_step(tr.steps),
                }
            if (
                is_finished(d, tr)
                and is_finished(d0, ini)
                and (attr is None or _attribution_done(d / "attribution", attr["end"], attr["sites"]))
            ):
                continue
            jobs.append(
                {
                    "regime": regime,
                    "seed": seed,
                    "trained": tr.to_dict(),
                    "initial": ini.to_dict(),
                    "trained_dir": str(d),
                    "initial_dir": str(d0),
                    "attribution": attr,
                }
            )
    return jobs


def run_all_units(config: LanguageExperimentConfig, out: Path) -> list[str]:
    from ..progress import log

    jobs = _jobs(config, out)
    if not jobs:
        return []
    if config.jobs == 1:
        import torch

        threads = torch.get_num_threads()  # in-process: the caller's thread count
        return [m for j in jobs for m in _run_job({**j, "threads": threads})]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    done: list[str] = []
    with ProcessPoolExecutor(max_workers=config.jobs, mp_context=mp.get_context("spawn")) as pool:
        for msgs in pool.map(_run_job, [{**j, "threads": 1} for j in jobs]):  # parallel: one thread each
            for m in msgs:
                log(m, level=2)
            done += msgs
    return done
