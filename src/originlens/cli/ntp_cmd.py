"""``originlens ntp ...``: next-token-prediction training on the gradient-pathways tasks and the regime grid.

* ``originlens ntp train --task majority|cond-majority|othello|language --regime standard|myopic|untied|
  myopic+untied --seed S --out RUN [--resume | --overwrite] [overrides]`` trains one run
  (:mod:`originlens.train.ntp`).
* ``originlens ntp grid --task cond-majority --regimes standard,myopic,untied,myopic+untied --seeds 0,1,2
  --out DIR [overrides]`` trains regimes × seeds (finished runs are skipped) and writes ``DIR/grid.json``
  and ``DIR/report.html`` (:mod:`originlens.train.grid`).

``ntp train`` runs data-parallel under ``torchrun --nproc_per_node W -m originlens ntp train ...``
(:mod:`originlens.train.parallel`; rank 0 writes and prints).  Every
:class:`~originlens.train.ntp.NTPConfig` field has a flag; unset flags keep the paper's per-task defaults
(its hyper-parameter table).  ``--threads N`` sets torch's CPU thread count (process-wide; not part of the config,
but recorded in ``environment.json`` at the start and at every resume, and a CPU run resumed with another
count than it started with warns: its later weights differ in the last bits from an uninterrupted run).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import ConfigError
from .options import add_option, add_threads, apply_threads, int_list, positive_int


def _untie_at(s: str) -> Any:
    return "all" if s == "all" else int_list(s)


def _probe_positions(s: str) -> Any:
    return s if s in ("all", "tracked") else int_list(s)


def _task_option(s: str) -> tuple[str, Any]:
    """``KEY=VALUE``; VALUE is read as JSON when it parses (true, 3, "x"), else kept as a string."""
    import json

    key, sep, value = s.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {s!r}")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def _bool(s: str) -> bool:
    low = s.strip().lower()
    if low in ("true", "yes", "1"):
        return True
    if low in ("false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


def _betas(s: str) -> tuple[float, float]:
    try:
        a, b = (float(v) for v in s.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two comma-separated numbers, got {s!r}") from None
    return a, b


# (flag, NTPConfig field, parser, help)
def _device_arg(s: str) -> str:
    from ..devices import device_arg

    return device_arg(s)


OVERRIDES: list[tuple[str, str, Any, str]] = [
    ("--steps", "steps", int, "optimiser steps (default per task: 3000 / 5000 Othello / 1000 language)"),
    ("--batch-size", "batch_size", int, "sequences per step (256; Othello 1024)"),
    ("--lr", "lr", float, "Adam learning rate (1e-3)"),
    (
        "--lr-decay",
        "lr_decay",
        int_list,
        "A,B: constant lr to update A, then a linear cool-down to lr/(B−A) at B (default: constant, the paper)",
    ),
    ("--betas", "betas", _betas, "Adam betas as B1,B2 (0.9,0.999)"),
    ("--eps", "eps", float, "Adam epsilon (1e-8)"),
    ("--d-model", "d_model", int, "residual width (128; Othello 256)"),
    ("--n-layers", "n_layer", int, "transformer blocks (2; Othello 6; language 4)"),
    ("--heads", "n_head", int, "attention heads (4)"),
    (
        "--untie-at",
        "untie_at",
        _untie_at,
        "untied regimes: boundaries M1,M2,... | all (default 10 on the majority tasks)",
    ),
    ("--untie-scope", "untie_scope", str, "untied copies of: everything (paper: a second complete model) | blocks"),
    (
        "--train-size",
        "train_size",
        int,
        "counting tasks: fixed training set of N sequences (102400, the paper's; 0 = fresh sequences every step)",
    ),
    ("--log-every", "log_every", int, "train-loss log interval (10)"),
    ("--eval-every", "eval_every", int, "eval interval in steps (500; 0 = only at the end)"),
    ("--probe-every", "probe_every", int, "probe interval in steps (500; Othello 1000; 0 = only at the end)"),
    ("--eval-size", "eval_size", int, "eval sequences (10240; Othello 20480)"),
    ("--probe-size", "probe_size", int, "eval sequences used for probes (default: all)"),
    (
        "--probe-positions",
        "probe_positions",
        _probe_positions,
        "all | tracked | I,J,... (default: all; Othello tracked)",
    ),
    ("--probe-alpha", "probe_alpha", float, "ridge penalty (1.0)"),
    ("--checkpoint-every", "checkpoint_every", int, "checkpoint interval (500; 0 = only at the end)"),
    ("--keep-checkpoints", "keep_checkpoints", int, "keep the last N checkpoints (0 = all)"),
    ("--dtype", "dtype", str, "float32 | float64"),
    ("--device", "device", _device_arg, "cpu | cuda | cuda:N | auto"),
    (
        "--matmul-precision",
        "matmul_precision",
        str,
        "highest | tf32: CUDA float32 products in TF32 (highest; no effect on the CPU)",
    ),
    ("--attn-impl", "attn_impl", str, "standard-regime attention kernel: sdpa | eager"),
    ("--mlp-ratio", "model.mlp_ratio", int, "MLP width as a multiple of d_model (4)"),
    ("--tie-embeddings", "model.tie_embeddings", _bool, "true | false: LM head tied to the token embedding (true)"),
    (
        "--untie-init",
        "model.untie_init",
        str,
        "untied regimes: the copies start independent (paper) | shared (equal to the first)",
    ),
    ("--dropout", "model.dropout", float, "dropout probability (0; runs with dropout cannot be attributed)"),
    (
        "--othello-pool",
        "othello_pool",
        int,
        "Othello games generated once per run (500000; 0 = fresh games every step)",
    ),
    ("--eval-seed", "eval_seed", int, "seed of the eval set (default: --seed)"),
    ("--corpus", "corpus", str, "token store directory for --task language"),
]


def add_overrides(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("overrides of the paper's defaults")
    for flag, dest, typ, help_ in OVERRIDES:
        add_option(
            g,
            flag,
            dest=f"ov_{dest}",
            type=typ,
            default=None,
            help=help_,
            metavar=flag.lstrip("-").upper().replace("-", "_"),
        )
    g.add_argument(
        "--task-option",
        dest="task_options",
        action="append",
        type=_task_option,
        default=None,
        metavar="KEY=VALUE",
        help="a task option, repeatable (tinystories: syntax_features=true, "
        "annotator=spacy|lingua|gold, spacy_model=NAME, syntax_labels=all|tags|deps)",
    )
    add_threads(p)
    p.add_argument("--overwrite", action="store_true", help="replace runs with a different configuration")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _, dest, _, _ in OVERRIDES:
        v = getattr(args, f"ov_{dest}")
        if v is not None:
            if dest.startswith("model."):  # nested NTPConfig.model (ModelOptions)
                out.setdefault("model", {})[dest.split(".", 1)[1]] = v
            else:
                out[dest] = v
    if getattr(args, "task_options", None):
        out["task_options"] = dict(args.task_options)
    return out


def _cmd_train(args: argparse.Namespace) -> int:
    from ..distributed import init
    from ..train.ntp import NTPConfig, Trainer

    apply_threads(args)
    if args.ov_steps is not None and args.ov_steps < 1:  # the library's steps=0 is an untrained run
        raise ConfigError(
            f"--steps must be ≥ 1, got {args.ov_steps}", "pass a positive number of updates (step 0 is always saved)"
        )
    cfg = NTPConfig(task=args.task, regime=args.regime, seed=args.seed, **_overrides(args))
    if args.resume and args.overwrite:
        raise ConfigError("--resume and --overwrite exclude each other", "pass one of them")
    rank, _ = init()  # under torchrun: data-parallel over the ranks, rank 0 writes
    res = Trainer(cfg, args.out, resume=args.resume, overwrite=args.overwrite).run()
    if rank != 0:
        return 0
    if res.skipped:
        print(f"{args.out}: already finished at step {res.step}")
    ev = ", ".join(f"{k} {v:.4f}" for k, v in res.final_eval.items())
    pr = ", ".join(f"{k} {v:.3f}" for k, v in res.probe_summary.items() if k.startswith("tracked/"))
    print(f"{args.out}: step {res.step} in {res.seconds:.1f} s; eval: {ev or 'none'}; probes: {pr or 'none'}")
    return 0


def _cmd_grid(args: argparse.Namespace) -> int:
    from ..distributed import env_world
    from ..models.gpt import REGIMES
    from ..train.grid import GridConfig, format_grid_table, run_grid

    if env_world()[1] > 1:
        raise ConfigError(
            "ntp grid does not run under torchrun (every process would train the whole grid)",
            "run it as one process, or train the runs one by one with torchrun ... ntp train",
        )
    apply_threads(args)
    regimes = [r.strip() for r in args.regimes.split(",") if r.strip()] if args.regimes else list(REGIMES)
    cfg = GridConfig(
        task=args.task, regimes=regimes, seeds=args.seeds, overrides=_overrides(args), confidence=args.confidence
    )
    res = run_grid(cfg, args.out, overwrite=args.overwrite, report_only=args.report_only, jobs=args.jobs)
    print(format_grid_table(res.summary))
    print(
        f"trained {len(res.trained)}, skipped {len(res.skipped)} (finished) in "
        f"{res.summary['wall_seconds']:.1f} s; {args.out}/grid.json, {args.out}/report.html"
    )
    return 0


def register(subparsers: Any) -> None:
    ntp = subparsers.add_parser("ntp", help="next-token-prediction training and the regime grid (gradient pathways)")
    sub = ntp.add_subparsers(dest="ntp_command", metavar="NTP_COMMAND")
    t = sub.add_parser(
        "train",
        help="train one model in one regime",
        description="Train a GPT on a synthetic task (or a token store) in one regime, with "
        "eval metrics, probes and resumable checkpoints in RUN.",
    )
    t.add_argument("--task", required=True, help="majority | cond-majority | othello | tinystories | language")
    t.add_argument("--regime", default="standard", help="standard | myopic | untied | myopic+untied")
    t.add_argument("--seed", type=int, default=0, help="seed of the initialisation, data order and eval set")
    t.add_argument("--out", required=True, help="run directory")
    t.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in RUN")
    add_overrides(t)
    t.set_defaults(func=_cmd_train, writes=lambda a: [a.out])

    g = sub.add_parser(
        "grid",
        help="regimes × seeds; probe quality of the NTP-useless feature with CIs",
        description="Train every regime × seed under DIR (finished runs are skipped, "
        "interrupted ones resumed) and report the probe quality of the "
        "NTP-useless feature per regime with t-intervals over seeds.",
    )
    g.add_argument("--task", default="cond-majority", help="majority | cond-majority | othello")
    g.add_argument("--regimes", default=None, help="comma-separated (default: all four)")
    g.add_argument("--seeds", type=int_list, default=[0, 1, 2], help="comma-separated (default 0,1,2)")
    g.add_argument("--confidence", type=float, default=0.95, help="interval level (0.95)")
    g.add_argument("--out", required=True, help="grid directory")
    g.add_argument("--report-only", action="store_true", help="aggregate finished runs without training")
    g.add_argument(
        "--jobs",
        type=positive_int,
        default=1,
        help="runs trained at once in worker processes, one torch thread each (default 1: in this process)",
    )
    add_overrides(g)
    g.set_defaults(func=_cmd_grid, writes=lambda a: [a.out])

    from . import ntp_attribute_cmd  # `ntp attribute RUN ...`: pathway attribution by replay

    ntp_attribute_cmd.register(sub)
