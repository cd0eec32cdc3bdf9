"""``originlens ntp attribute RUN ...``: optimizer-aware attribution of a finished ``ntp train`` run.

* ``originlens ntp attribute RUN --sites 1:4,2:8 | --layers 1-2 --positions 8,12 --features tracked|all|NAME,...
  --optimizer adam|sgd [--segment START:END] [--steps FIRST:LAST[:STRIDE]] [--out DIR]`` replays the
  updates START+1..END from the run's checkpoints and writes one Parquet segment of per-update
  influences to DIR (default ``RUN/attribution``), see :mod:`originlens.attribution.replay`.
* ``--segments N`` cuts the updates into N contiguous segments (one Parquet file each); under
  ``torchrun --nproc_per_node W -m originlens ntp attribute RUN ...`` the segments (default N = W) are
  spread over the ranks (:func:`originlens.attribution.segments.attribute_segments`), with results
  bit-identical to one process; rank 0 indexes the store, prints and builds the report.
* ``originlens ntp attribute RUN --report`` (alone or after a computation) builds ``DIR/report.html``:
  integrated influence per component × feature type with CIs, the paper-style bar plot, the paper's Othello
  sign pattern and the replay checks (:func:`originlens.attribution.store_report.write_report`).

Registered as a top-level command; :func:`add_arguments` and :func:`cmd_attribute` let the ``ntp``
group mount the same command as ``ntp attribute``.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import ConfigError
from .options import add_device, add_threads, apply_threads, int_list


def _pair(s: str) -> tuple[int, int]:
    try:
        a, b = (int(v) for v in s.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START:END, got {s!r}") from None
    return a, b


def _steps(s: str) -> range:
    try:
        parts = [int(v) for v in s.split(":")]
    except ValueError:
        parts = []
    if len(parts) not in (2, 3):
        raise argparse.ArgumentTypeError(f"expected FIRST:LAST[:STRIDE] (1-based updates), got {s!r}")
    return range(parts[0], parts[1] + 1, parts[2] if len(parts) == 3 else 1)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``attribute`` (shared by the top-level alias and ``ntp attribute``)."""
    p.add_argument("run", metavar="RUN", help="run directory of `originlens ntp train`")
    g = p.add_argument_group("sites and features")
    g.add_argument("--sites", default=None, help="LAYER:POSITION pairs, e.g. 1:4,2:8")
    g.add_argument("--layers", type=int_list, default=None, help="layers k (with --positions), e.g. 1-2")
    g.add_argument("--positions", type=int_list, default=None, help="positions i, e.g. 8,12 or 8-20:4")
    g.add_argument("--features", default="tracked", help="tracked (default) | all | NAME,NAME,...")
    a = p.add_argument_group("attribution")
    a.add_argument(
        "--optimizer",
        default="adam",
        choices=["adam", "sgd"],
        help="adam: per-component Adam moments (paper); sgd: Δ_c = lr·G_c",
    )
    a.add_argument("--segment", type=_pair, default=None, help="updates START+1..END (default: the whole run)")
    a.add_argument(
        "--segments",
        type=int,
        default=None,
        help="cut them into N contiguous segments (default: 1; under torchrun: one per process, "
        "segment i on rank i mod W)",
    )
    a.add_argument(
        "--steps",
        type=_steps,
        default=None,
        help="record influences only at FIRST:LAST[:STRIDE] (SGD also skips the decomposition elsewhere)",
    )
    a.add_argument("--no-types", dest="types", action="store_false", help="skip per-feature-type influences")
    a.add_argument(
        "--half",
        dest="half",
        action="store_true",
        help="mismatch with a ½ (values ½ of the paper's convention, which has none)",
    )
    a.add_argument(
        "--random-directions",
        type=int,
        default=0,
        metavar="N",
        help="null: also attribute N random directions of each probe's norm per site and feature "
        "(features F~random0..)",
    )
    a.add_argument(
        "--check-identity",
        action="store_true",
        help="also store R after the attributed step (Σ_c I_c ≈ R before − R after)",
    )
    a.add_argument(
        "--warm",
        action="store_true",
        help="Adam: recompute missing component moments from an earlier segment or update 1",
    )
    a.add_argument(
        "--verify",
        default="next",
        choices=["next", "segment", "none"],
        help="checkpoints compared bit-exactly: inside the segment and the next one (default)",
    )
    a.add_argument("--replay-rtol", type=float, default=0.0, help="tolerance of the replay checks (0 = exact)")
    add_device(a, default=None, help="where to replay (default: the run's)")
    o = p.add_argument_group("output")
    o.add_argument("--out", default=None, help="store directory (default RUN/attribution)")
    o.add_argument("--overwrite", action="store_true", help="recompute an existing segment")
    o.add_argument("--report", action="store_true", help="build report.html from the stored segments")
    o.add_argument("--ci", default="t", choices=["t", "bootstrap"], help="interval over items (default t)")
    add_threads(p, help="torch CPU threads (use training's for a bit-exact replay)")


def _sites(args: argparse.Namespace) -> Any:
    if args.sites and (args.layers or args.positions):
        raise ConfigError("--sites excludes --layers/--positions", "pass one of the two spellings")
    if args.sites:
        return args.sites
    if args.layers or args.positions:
        if not (args.layers and args.positions):
            raise ConfigError("--layers and --positions go together", "e.g. --layers 1-2 --positions 8,12")
        return [(k, i) for k in args.layers for i in args.positions]
    return None


def cmd_attribute(args: argparse.Namespace) -> int:
    from ..attribution.replay import attribute_run
    from ..attribution.store_report import write_report

    apply_threads(args)
    sites = _sites(args)
    if sites is None and not args.report:
        raise ConfigError("nothing to do", "pass --sites (or --layers/--positions) to attribute, and/or --report")
    store = args.out
    from ..distributed import init

    rank, world_size = init()  # under torchrun: the segments are spread over the ranks
    if sites is not None and (args.segments is not None or world_size > 1):
        from ..attribution.segments import attribute_segments

        res_list = attribute_segments(
            args.run,
            segments=args.segments,
            segment=args.segment,
            sites=sites,
            features=args.features,
            optimizer=args.optimizer,
            steps=args.steps,
            types=args.types,
            half=args.half,
            check_identity=args.check_identity,
            out=args.out,
            warm=args.warm,
            verify=args.verify,
            device=args.device,
            overwrite=args.overwrite,
            replay_rtol=args.replay_rtol,
            random_directions=args.random_directions,
        )
        if rank != 0:
            return 0
        store = res_list[0].store
        for res in res_list:
            _print_segment(res.path, res.info)
    elif sites is not None:
        res = attribute_run(
            args.run,
            sites=sites,
            features=args.features,
            optimizer=args.optimizer,
            steps=args.steps,
            segment=args.segment,
            types=args.types,
            half=args.half,
            check_identity=args.check_identity,
            out=args.out,
            warm=args.warm,
            verify=args.verify,
            device=args.device,
            overwrite=args.overwrite,
            replay_rtol=args.replay_rtol,
            random_directions=args.random_directions,
        )
        _print_segment(res.path, res.info)
        store = res.store
    if args.report and rank == 0:
        from pathlib import Path

        html = write_report(store if store is not None else Path(args.run), ci=args.ci)
        print(f"report: {html}")
    return 0


def _print_segment(path: Any, info: dict) -> None:
    c = info["checks"]
    print(
        f"{path}: {info['rows']} rows, {info['n_recorded_steps']} updates, "
        f"{info['seconds_per_attributed_step']:.3f} s per attributed update; replay: "
        f"{c['losses_checked']} losses equal to the log, checkpoints "
        f"{c['checkpoints_verified'] or 'none'} bit-identical"
    )


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "attribute",
        help="attribute a training run's updates to gradient pathways (influence on probed features)",
        description="Replay a finished `ntp train` run from its checkpoints and data order, decompose every "
        "update into direct / pre-cached / shared pathways at residual sites, and store the "
        "influence of each on the probed features (positive = toward the final value).",
    )
    add_arguments(p)
    p.set_defaults(func=cmd_attribute, writes=lambda a: [a.run, a.out])
