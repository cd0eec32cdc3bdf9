"""``originlens ntp experiment ...``: the reproduction experiments of the gradient-pathways paper as
sub-commands of ``ntp`` (mounted through :data:`originlens.cli.main.COMMAND_MODULES`; this module finds the
``ntp`` group registered by ``ntp_cmd``).  ``othello-run`` parses into
:class:`originlens.experiments.othello_run.OthelloExperimentConfig` and calls
:func:`~originlens.experiments.othello_run.run_othello_experiment`; ``othello``, ``grid``,
``tinystories`` and ``formal`` are registered from their own modules.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from .options import add_device, add_option, add_threads, apply_threads, int_list

# ----------------------------------------------------------------------------------------------------
# CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="experiment directory")
    p.add_argument(
        "--paper",
        action="store_true",
        help="the paper's configuration: 6 layers × 256, batch 1024, 5000 steps, eval 20480, "
        "positions 4..56 (use a GPU: --device cuda)",
    )
    g = p.add_argument_group("model and training (defaults: CPU scale)")
    for flag, dest, typ, help_ in (
        ("--n-layers", "n_layer", int, "blocks (3)"),
        ("--d-model", "d_model", int, "width (64)"),
        ("--heads", "n_head", int, "heads (4)"),
        ("--batch-size", "batch_size", int, "(64)"),
        ("--steps", "steps", int, "Adam steps (400)"),
        ("--lr", "lr", float, "(1e-3)"),
        ("--eval-size", "eval_size", int, "eval/probe games (3000)"),
        ("--othello-pool", "othello_pool", int, "training games generated once (20000)"),
        ("--checkpoint-every", "checkpoint_every", int, "(100)"),
        ("--seed", "seed", int, "(0)"),
    ):
        add_option(g, flag, dest=dest, type=typ, default=None, help=help_)
    a = p.add_argument_group("attribution")
    a.add_argument("--positions", type=int_list, default=None, help="attributed positions (12,24,36)")
    a.add_argument("--attr-layers", dest="layers", type=int_list, default=None, help="attributed layers (all)")
    a.add_argument("--attribute-steps", type=int, default=None, help="attribute updates 1..N (default: all)")
    a.add_argument("--optimizer", default=None, choices=["adam", "sgd"], help="adam (paper) or sgd")
    h = p.add_argument_group("recorded games")
    h.add_argument("--human-games", default=None, help="WTHOR .wtb file or one game per line (f5d6c3...)")
    h.add_argument("--compare-games", type=int, default=None, help="synthetic games next to them (2000)")
    add_device(p, default=None, help="where to train (default cpu)")
    add_threads(p)


def config_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~originlens.experiments.othello_run.OthelloExperimentConfig` of parsed arguments (imported
    here: building the parser must not import torch)."""
    from ..experiments.othello_run import OthelloExperimentConfig

    fields = {f.name for f in dataclasses.fields(OthelloExperimentConfig)}
    given = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    return OthelloExperimentConfig.paper(**given) if args.paper else OthelloExperimentConfig(**given)


def cmd_othello(args: argparse.Namespace) -> int:
    apply_threads(args)
    from ..experiments.othello_run import run_othello_experiment, summary_lines

    record = run_othello_experiment(config_from_args(args), args.out)
    print("\n".join(summary_lines(record)))
    print(f"{args.out}/experiment.json, {args.out}/report.md, {record['attribution']['report']}")
    return 0


def register(subparsers: Any) -> None:
    ntp = subparsers.choices.get("ntp")
    if ntp is None:  # pragma: no cover (module order)
        raise RuntimeError("ntp_experiment_cmd must come after ntp_cmd in COMMAND_MODULES")
    sub = next(a for a in ntp._actions if isinstance(a, argparse._SubParsersAction))
    e = sub.add_parser(
        "experiment",
        help="reproduction experiments (othello, grid)",
        description="End-to-end reproduction experiments of the gradient-pathways paper.",
    )
    esub = e.add_subparsers(dest="experiment", metavar="EXPERIMENT")
    o = esub.add_parser(
        "othello-run",
        help="one OthelloGPT run: train, probe the board, attribute the central "
        "cells, probe recorded human games (the multi-seed experiment with "
        "nulls and tests is `othello`)",
        description=__doc__.split("\n\n")[0],
    )
    add_arguments(o)
    o.set_defaults(func=cmd_othello, writes=lambda a: [a.out])
    from . import othello_experiment_cmd, toy_grid_cmd

    toy_grid_cmd.add_parser(esub)
    from . import language_experiment_cmd

    language_experiment_cmd.add_parser(esub)
    othello_experiment_cmd.add_parser(esub)
    from . import formal_experiment_cmd

    formal_experiment_cmd.add_parser(esub)
    from . import paper_scale_cmd

    paper_scale_cmd.add_parser(esub)
