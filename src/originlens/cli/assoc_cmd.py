"""``originlens assoc ...``: the one-hot attention model of arXiv 2601.19208 and its leading terms.

* ``assoc top``: top associations of a word under a basis map of saved statistics.
* ``assoc train``: train the Def. 3.1 model on a corpus directory or an (N, T+1) .npy file, on
  ``--device cpu|cuda|auto``, through :func:`originlens.experiments.leading_run.train_leading_run`, which
  writes the complete run directory (checkpoints, ``RUN/statistics/``, and ``RUN/data/``: ``train.npy``,
  ``heldout.npy`` — the last ``--holdout`` windows, never trained on — ``vocab.json``, ``source.json``),
  so that ``assoc report`` needs nothing else.  Under ``torchrun --nproc_per_node W -m originlens assoc train ...`` the training is
  data-parallel (:mod:`originlens.train.parallel`); rank 0 writes and prints.
* ``assoc report RUN``: tracking over checkpoints, null baselines, causal intervention, leading-term model
  (:func:`originlens.experiments.leading_run.report_leading_run`); writes ``RUN/report.html`` / ``report.md`` / ``report.json``;
  ``--json`` prints the numbers.

Heavy modules are imported inside the command functions so that ``originlens --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Literal

from ..errors import ConfigError, InputError
from .options import add_device, add_option, add_threads, apply_threads, utf8_text

# the names of originlens.stats.assoc.BASES, kept here so that building the parser does not import the
# compiled statistics kernels (tests/reliability/test_cli_startup.py checks that both agree)
BASES = ("bigram", "interchangeability", "context", "value_target", "query_key")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "assoc",
        help="token associations and the one-hot attention model (leading terms)",
        description="Leading-term tools of arXiv 2601.19208.",
    )
    asub = p.add_subparsers(dest="assoc_command", metavar="ASSOC_COMMAND")
    _register_top(asub)
    _register_train(asub)
    _register_report(asub)
    from . import persistence_cmd

    persistence_cmd.register(asub)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])


# ------------------------------------------------------------------------------------------------ top


def _register_top(asub) -> None:
    t = asub.add_parser(
        "top",
        help="top associations of a word under a basis map",
        description="Print the k strongest entries of a token's row (what it maps to) and "
        "column (what maps to it) in a basis matrix of saved statistics.",
    )
    t.add_argument("--stats", required=True, help="directory written by `originlens stats`")
    t.add_argument("--basis", choices=BASES, default="bigram", help="which matrix (default bigram)")
    t.add_argument(
        "--word",
        required=True,
        action="append",
        type=utf8_text,
        help="token string (or integer id); repeat for several",
    )
    t.add_argument("-k", type=int, default=10, help="how many associations (default 10)")
    t.add_argument(
        "--direction",
        choices=["row", "column", "both"],
        default="both",
        help="what the word maps to (row), what maps to it (column), or both",
    )
    t.add_argument("--include-self", action="store_true", help="keep the token itself in its list")
    t.add_argument("--json", action="store_true", help="print JSON instead of text")
    t.set_defaults(func=run_top, writes=lambda a: [])


def _token(w: str) -> str | int:
    return int(w) if w.lstrip("-").isdigit() else w


def run_top(args: argparse.Namespace) -> int:
    from ..stats import load_statistics, top_associations

    st = load_statistics(args.stats)
    dirs: list[Literal["row", "column"]] = ["row", "column"] if args.direction == "both" else [args.direction]
    result = {}
    for w in args.word:
        result[w] = {
            d: top_associations(st, args.basis, _token(w), args.k, direction=d, exclude_self=not args.include_self)
            for d in dirs
        }
    if args.json:
        print(
            json.dumps(
                {w: {d: [[t, v] for t, v in lst] for d, lst in r.items()} for w, r in result.items()},
                ensure_ascii=False,
                indent=1,
            )
        )
        return 0
    arrow = {"row": "→", "column": "←"}
    for w, r in result.items():
        for d, lst in r.items():
            print(f"{args.basis} {w} {arrow[d]} " + ", ".join(f"{t} ({v:.3g})" for t, v in lst))
    return 0


# ------------------------------------------------------------------------------------------------ train

TRAIN_EPILOG = """\
examples:
  originlens corpus build ../shared/data/tinystories --vocab-size 1000 --seq-len 64 --oov unk --out corpora/ts
  originlens assoc train corpora/ts --n-layers 3 --lr 0.005 --epochs 2 --batch-size 512 --out runs/lt
  originlens assoc report runs/lt --null-corpus storyworld
  paper (§5.1): corpus build --vocab-size 3000 --seq-len 200 --oov drop --max-windows 65536, then
    assoc train CORPUS --epochs 100 --batch-size 2048 --checkpoint-every-epochs 2 --lr 0.005 (or 0.05)
  (examples/reproduce_leading_terms.py runs the whole pipeline; --paper-scale for these settings)
"""


def _register_train(asub) -> None:
    t = asub.add_parser(
        "train",
        help="train the attention-only model (Def. 3.1) with GD or SGD from zero init",
        description="Train the one-hot attention-only transformer of arXiv 2601.19208 and compare every "
        "checkpoint with the leading terms. Writes RUN/ (config, metrics, checkpoints, "
        "model.safetensors, statistics/, data/).",
        epilog=TRAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument("corpus", nargs="?", help="corpus directory written by `originlens corpus build`")
    t.add_argument("--tokens", help="an (N, T+1) integer .npy file instead of a corpus directory")
    t.add_argument("--vocab-size", type=int, help="|V| (required with --tokens; default: the corpus's)")
    t.add_argument("--out", required=True, help="run directory RUN")
    add_option(t, "--n-layers", dest="layers", type=int, default=3, help="number of layers L (default 3, the paper)")
    t.add_argument("--lr", type=float, default=0.005, help="learning rate η of plain GD/SGD (default 0.005)")
    g = t.add_mutually_exclusive_group(required=True)
    g.add_argument("--steps", type=int, help="optimiser steps")
    g.add_argument("--epochs", type=int, help="epochs (an epoch is ⌈N/batch⌉ steps; 1 step for --full-batch)")
    b = t.add_mutually_exclusive_group()
    b.add_argument("--batch-size", type=int, default=2048, help="SGD minibatch (default 2048, the paper)")
    b.add_argument("--full-batch", action="store_true", help="full-batch gradient descent (the theory)")
    t.add_argument("--init", choices=("zero", "gaussian"), default="zero", help="initialisation (default zero)")
    t.add_argument("--init-std", type=float, default=0.0, help="std of the Gaussian init")
    t.add_argument(
        "--dtype",
        choices=("float32", "float64"),
        default="float32",
        help="precision of the weights and of the training arithmetic",
    )
    t.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="checkpoint every N steps (0: only the final step unless --checkpoint-every-epochs)",
    )
    t.add_argument("--checkpoint-every-epochs", type=float, help="checkpoint every E epochs (paper: 2)")
    t.add_argument(
        "--checkpoint-at",
        metavar="S1,S2,...",
        help="also checkpoint at these steps (e.g. 1,2,3,4,5,6 for the first steps)",
    )
    t.add_argument("--keep-checkpoints", type=int, help="keep only the newest K checkpoint files")
    t.add_argument(
        "--stats",
        default="first-batch",
        metavar="first-batch|full|none|DIR",
        help="target statistics: from the first shuffled batch (paper, default), the full training "
        "set, none, or a statistics directory of the same corpus",
    )
    t.add_argument("--max-windows", type=int, help="use only the first N windows of the corpus")
    t.add_argument(
        "--holdout",
        type=int,
        default=0,
        help="hold out the last N windows (never trained on) for the report's held-out losses",
    )
    t.add_argument("--seed", type=int, default=0, help="seed of the Gaussian init")
    t.add_argument("--data-seed", type=int, default=42, help="seed of the batch order (paper: 42)")
    t.add_argument("--log-every", type=int, default=1, help="log the loss every N steps")
    t.add_argument("--grad-chunk", type=int, help="sequences per forward pass (default: automatic)")
    t.add_argument(
        "--impl",
        choices=("auto", "paths", "gather", "dense"),
        default="auto",
        help="forward implementation (default auto)",
    )
    add_device(t, help="where to train (default cpu; auto = CUDA when available); exact resume on CPU only")
    add_threads(t)
    t.add_argument("--resume", action="store_true", help="continue RUN from its last checkpoint")
    t.add_argument("--overwrite", action="store_true", help="replace the run in RUN")
    t.set_defaults(func=run_train, writes=lambda a: [a.out])


def _steps_list(spec: str | None) -> tuple[int, ...]:
    if not spec:
        return ()
    try:
        return tuple(int(v) for v in spec.split(",") if v.strip())
    except ValueError:
        raise ConfigError(
            f"--checkpoint-at must be comma-separated step numbers (got {spec!r})", "e.g. --checkpoint-at 1,2,3,4"
        ) from None


def run_train(args: argparse.Namespace) -> int:
    from ..distributed import init
    from ..experiments.leading_run import LeadingRunConfig, train_leading_run
    from ..train import AssocTrainConfig

    apply_threads(args)
    if args.resume and args.overwrite:
        raise ConfigError("--resume and --overwrite exclude each other", "pass one of them")
    if bool(args.corpus) == bool(args.tokens):
        raise InputError(
            "give either a corpus directory or --tokens FILE.npy (exactly one)",
            "e.g. `originlens assoc train corpora/ts --epochs 2 --out runs/lt`",
        )
    if args.tokens and args.vocab_size is None:
        raise InputError("--tokens needs --vocab-size", "pass --vocab-size V (ids must be < V)")
    rank, _ = init()  # under torchrun: data-parallel over the ranks, rank 0 writes
    train = AssocTrainConfig(
        n_layers=args.layers,
        lr=args.lr,
        steps=args.steps,
        epochs=args.epochs,
        batch_size=None if args.full_batch else int(args.batch_size),
        init=args.init,
        init_std=args.init_std,
        dtype=args.dtype,
        seed=args.seed,
        data_seed=args.data_seed,
        checkpoint_every=args.checkpoint_every,
        checkpoint_every_epochs=args.checkpoint_every_epochs,
        checkpoint_at=_steps_list(args.checkpoint_at),
        keep_checkpoints=args.keep_checkpoints,
        log_every=args.log_every,
        grad_chunk=args.grad_chunk,
        impl=args.impl,
        out=str(args.out),
        device=args.device,
    )
    cfg = LeadingRunConfig(
        source=args.corpus or args.tokens,
        vocab_size=args.vocab_size,
        max_windows=args.max_windows,
        holdout=args.holdout,
        stats=args.stats,
        train=train,
    )
    t0 = time.perf_counter()
    run = train_leading_run(cfg, args.out, resume=args.resume, overwrite=args.overwrite, rank=rank)
    secs = time.perf_counter() - t0
    if rank != 0:
        return 0
    print(_summary_line(run, Path(args.out), run.model.cfg.vocab_size, secs))
    return 0


def _summary_line(run: Any, out: Path, V: int, secs: float) -> str:
    """One line: steps, first → final loss and final cosines of the whole run, earlier sessions included.

    A resumed run only holds this session's losses in memory; the earlier ones come from ``metrics.jsonl``
    (so a run resumed when already finished reports its real losses, not NaN)."""
    from ..runs import RunDir

    losses: dict[int, float] = {}
    last_min_cos = None
    for r in RunDir(out, create=False).read_metrics():
        if r.get("event") == "step" and isinstance(r.get("loss"), (int, float)):
            losses[int(r["step"])] = float(r["loss"])
        elif r.get("event") == "checkpoint" and r.get("min_cos"):
            last_min_cos = r["min_cos"]
    losses.update(run.losses)  # this session's losses of every step (not only the logged ones)
    if run.resumed_from is not None and run.resumed_from >= run.total_steps:  # nothing left to train
        msg = f"{out}: already finished at step {run.step}/{run.total_steps} ({run.optimizer})"
    else:
        msg = f"trained {out}: step {run.step}/{run.total_steps} ({run.optimizer})"
    if losses:
        a, b = min(losses), max(losses)
        msg += f", loss {losses[a]:.4f} → {losses[b]:.4f}" + ("" if a == 1 else f" (logged steps {a} → {b})")
    msg += f" (ln|V| = {math.log(V):.4f}), {secs:.1f} s"
    mc = None
    if run.comparisons:
        from ..theory import min_cosines

        mc = min_cosines(run.comparisons[max(run.comparisons)])
    elif last_min_cos:
        mc = last_min_cos
    if mc:
        msg += "; final cosines (min over layers) " + ", ".join(cosine_text(k, v) for k, v in mc.items())
    return msg


def cosine_text(name: str, v: Any) -> str:
    """``name 0.9987``; a cosine that is undefined because a matrix is still zero (W before its third-order
    leading term has grown, or any weight at step 0) says so instead of printing ``nan``."""
    if v is None:
        return f"{name} —"
    if isinstance(v, (int, float)) and math.isnan(v):
        return f"{name} undefined (a zero matrix)"
    return f"{name} {v:.4f}" if isinstance(v, (int, float)) else f"{name} {v}"


# ------------------------------------------------------------------------------------------------ report


def _register_report(asub) -> None:
    r = asub.add_parser(
        "report",
        help="leading-term analysis of a training run: tracking, null baselines, intervention",
        description="Compare every checkpoint of RUN with the leading terms (cosine, norm ratio, Frobenius "
        "error), compute null baselines (unrelated corpus, disjoint windows, PMI, random), the "
        "causal intervention of Table 3 and the leading-term model's loss; write RUN/report.html, "
        "report.md and report.json.",
    )
    r.add_argument("run", help="run directory written by `originlens assoc train`")
    r.add_argument("--json", action="store_true", help="print all numbers as JSON on stdout")
    r.add_argument(
        "--null-corpus",
        metavar="storyworld|DIR|STATS",
        help="statistics of an unrelated corpus (aligned with the run by token string): "
        "'storyworld', a corpus directory or a statistics directory",
    )
    r.add_argument(
        "--examples",
        default=None,
        help="comma-separated example words (default: the paper's red,to,they,happy,wanted,fish,flower,birds)",
    )
    r.add_argument("-k", type=int, default=10, help="associations per example word (default 10)")
    r.add_argument("--stats", help="target statistics (default RUN/statistics)")
    r.add_argument("--data", help="corpus directory or .npy with the training windows (default RUN/data)")
    r.add_argument(
        "--eval-windows",
        type=int,
        default=None,
        help="training windows for the intervention (first N, unshuffled; 0 = all as in the paper; "
        "default: as many as hold 131,072 predicted tokens, e.g. 2,048 windows of T = 64)",
    )
    r.add_argument("--null-windows", type=int, default=2048, help="windows for null statistics (default 2048)")
    r.add_argument("--no-intervention", action="store_true", help="skip the causal intervention")
    r.add_argument("--no-heldout", action="store_true", help="skip the held-out losses")
    r.add_argument("--batch-size", type=int, default=256, help="windows per evaluation batch")
    r.add_argument("--seed", type=int, default=0, help="seed of the random baseline / storyworld")
    add_threads(r)
    add_device(r, help="where the model runs for the intervention and held-out losses (default cpu)")
    r.add_argument("--out", help="where to write the report (default RUN)")
    r.set_defaults(func=run_report, writes=lambda a: [a.run, a.out])


def run_report(args: argparse.Namespace) -> int:
    from ..experiments.leading_analysis import AnalysisConfig
    from ..experiments.leading_run import LeadingReportConfig, report_leading_run
    from ..theory.tracking import EXAMPLE_WORDS

    apply_threads(args)
    if (
        (args.eval_windows is not None and args.eval_windows < 0)
        or args.null_windows < 1
        or args.batch_size < 1
        or args.k < 1
    ):
        raise ConfigError("--eval-windows must be ≥ 0, --null-windows, --batch-size and -k ≥ 1", "fix the flag")
    words = tuple(w.strip() for w in args.examples.split(",") if w.strip()) if args.examples else EXAMPLE_WORDS
    cfg = AnalysisConfig(
        eval_windows=args.eval_windows,
        null_windows=args.null_windows,
        examples=words,
        top_k=args.k,
        seed=args.seed,
        intervention=not args.no_intervention,
        heldout=not args.no_heldout,
        batch_size=args.batch_size,
        device=args.device,
    )
    results, path = report_leading_run(
        args.run,
        LeadingReportConfig(analysis=cfg, stats=args.stats, data=args.data, null_corpus=args.null_corpus),
        out=args.out,
    )
    if args.json:
        json.dump(results, sys.stdout, ensure_ascii=False, indent=1)
        print()
        return 0
    m = results["min_cosine_over_training"]
    line = f"wrote {path}; min cosine over training: " + ", ".join(cosine_text(k, v) for k, v in m.items())
    it = results.get("intervention")
    if it:
        fin = [(n, v["loss"]) for n, v in it["losses"].items() if v["loss"] is not None]
        if fin and it["original"] is not None:
            worst = max(fin, key=lambda kv: kv[1])
            line += f"; intervention: original {it['original']:.4f}, worst {worst[0]} {worst[1]:.4f}"
    print(line)
    return 0
