"""``originlens lm qscore | steer | lookahead``: SAE features of a language model (Q(w) of arXiv
2603.14087 §9, steering, look-ahead maps).

::

    originlens lm qscore    --model M --sae DIR --corpus C [--features all|0-63|1,5] [--contexts 8]
                            [--max-offset 10] [--ablation error_preserving|faithful|both] --out RUN
    originlens lm steer     --model M --sae DIR --features 1,5 [--coefficients 1,100] [--samples 64]
                            [--max-new-tokens 20] [--prompt TEXT] [--seed 42] --out RUN
    originlens lm lookahead --model M --sae DIR --corpus C [--max-offset 5] [--epochs 10] [--lr 1e-4]
                            [--qscore RUN/results.json] --out RUN
    originlens lm qscore ... --shard I/N --out RUN_I;  originlens lm qscore-merge RUN_0 … RUN_N-1 --out RUN

``--model``: any checkpoint :func:`originlens.lm.loading.load_adapter` reads (llama2.c ``.bin``, our GPT
``.safetensors``, Hugging Face directory or ``hf:ID[@REV]``); ``--tokenizer`` as for ``lm generate``
(default: found next to the model).  ``--sae``: an SAELens directory (``cfg.json`` + ``sae_weights.safetensors``,
e.g. from ``originlens sae train``) whose hook and width must match the model.  ``--corpus``: an originlens
corpus directory (its vocabulary must be the model's), an ``.npy`` of token windows, or raw text (files,
directories, ``hf:DATASET``) tokenised with the model's tokenizer and cut into ``--window``-token windows.

The commands parse their options into the configs of :mod:`originlens.experiments.qscore_run`,
:mod:`~originlens.experiments.steer_run` and :mod:`~originlens.experiments.lookahead_run`, which write the
run directory (config.json, environment.json, metrics.jsonl, results.json, figures/, report.html; ``qscore``
also ``examples-{ablation}.safetensors``), and print a summary.  Mounted under the ``lm`` group of
:mod:`originlens.cli.lm_cmd` (listed after it in ``COMMAND_MODULES``); :mod:`originlens.cli.sae_cmd`
reuses the model/corpus options below.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from .options import (
    add_device,
    add_device_map,
    add_threads,
    apply_threads,
    float_list,
    int_list_or_all,
    shard_arg,
    utf8_text,
)

if TYPE_CHECKING:  # the experiments package imports torch: deferred to keep `originlens --help` fast
    from ..experiments.lm_inputs import CorpusSource, ModelSource

# ----------------------------------------------------------------------------------------------------
# shared options (also used by sae_cmd)


def add_model_arguments(p: argparse.ArgumentParser, *, corpus: bool = True, corpus_required: bool = True) -> None:
    """``--model``, ``--revision``, ``--tokenizer``, ``--device``, ``--device-map``, ``--dtype``, ``--backend``,
    ``--threads`` and the corpus options."""
    from ..devices import dtype_arg

    g = p.add_argument_group("model")
    g.add_argument("--model", required=True, help="checkpoint path or hf:ID[@REVISION]")
    g.add_argument("--revision", default=None, help="hub revision for hf:ID")
    g.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer (llama2.c .bin, tokenizer.json, corpus or tokenizer directory); "
        "default: found next to the model",
    )
    add_device(g, help="where the model and the SAE run (default cpu)")
    add_device_map(g)
    g.add_argument(
        "--dtype",
        type=dtype_arg,
        default=None,
        help="the model's weights: float32 | float64 | bfloat16 | float16 | auto (as stored); default "
        "float32 for Hugging Face models, as stored otherwise (the SAE keeps its own dtype)",
    )
    g.add_argument(
        "--backend",
        choices=("auto", "hf", "generic"),
        default="auto",
        help="how a Hugging Face model is wrapped: hf = hand-written adapter (GPT-2, GPT-NeoX, Llama, Gemma-2), "
        "generic = any causal LM through nnsight (pip install nnsight), auto = hf for those families and "
        "generic otherwise (default: auto).",
    )
    add_threads(g)
    if corpus:
        c = p.add_argument_group("corpus")
        c.add_argument(
            "--corpus",
            required=corpus_required,
            help="corpus directory, .npy token windows, or raw text (files, directories, hf:DATASET)",
        )
        c.add_argument("--window", type=int, default=64, help="tokens per window for raw text (default 64)")
        c.add_argument("--max-windows", type=int, default=None, help="use at most this many windows")
        c.add_argument("--no-bos", dest="bos", action="store_false", help="do not prepend BOS to windows")


def model_source(args: argparse.Namespace) -> ModelSource:
    """The model options of :func:`add_model_arguments` (and ``--threads``, applied now)."""
    from ..experiments.lm_inputs import ModelSource

    apply_threads(args)
    return ModelSource(
        model=args.model,
        revision=args.revision,
        tokenizer=args.tokenizer,
        device=args.device,
        device_map=getattr(args, "device_map", None),
        dtype=args.dtype,
        backend=getattr(args, "backend", "auto"),
    )


def corpus_source(args: argparse.Namespace) -> CorpusSource:
    """The corpus options of :func:`add_model_arguments`."""
    from ..experiments.lm_inputs import CorpusSource

    return CorpusSource(corpus=args.corpus, window=args.window, max_windows=args.max_windows, prepend_bos=args.bos)


# ----------------------------------------------------------------------------------------------------
# the three commands: parse → config → experiments layer → print


def cmd_qscore(args: argparse.Namespace) -> int:
    from ..experiments.qscore_run import QScoreRunConfig, run_qscore

    cfg = QScoreRunConfig(
        model=model_source(args),
        sae=args.sae,
        corpus=corpus_source(args),
        features=args.features,
        max_features=args.max_features,
        contexts=args.contexts,
        max_offset=args.max_offset,
        ablation=args.ablation,
        position_rule=args.position_rule,
        dedup_distance=args.dedup_distance,
        min_total_kl=args.min_total_kl,
        batch_size=args.batch_size,
        shard=args.shard,
    )
    out = run_qscore(cfg, args.out, overwrite=args.overwrite)
    if out.report is None:  # a rank > 0 under torchrun: rank 0 writes and prints
        return 0
    _print_qscore(out)
    return 0


def _print_qscore(out: Any) -> None:
    for mode, res in out.results.items():
        s = res.summary()
        print(
            f"{mode}: {s['n_kept']}/{s['n_features']} features kept, median Q {s['q']['median']:.3g} "
            f"(ratio of means {s['q_ratio_of_means']['median']:.3g}, median ratio {s['q_median']['median']:.3g})"
        )
    print(f"report: {out.report}")


def cmd_qscore_merge(args: argparse.Namespace) -> int:
    from ..experiments.qscore_run import merge_qscore_runs

    _print_qscore(merge_qscore_runs(args.shards, args.out, overwrite=args.overwrite))
    return 0


def cmd_steer(args: argparse.Namespace) -> int:
    from ..experiments.steer_run import SteerRunConfig, run_steer

    cfg = SteerRunConfig(
        model=model_source(args),
        sae=args.sae,
        features=args.features,
        coefficients=args.coefficients,
        samples=args.samples,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        prompt=args.prompt,
        seed=args.seed,
        show=args.show,
    )
    out = run_steer(cfg, args.out, overwrite=args.overwrite)
    res = out.samples
    for s in res[: 1 + min(len(res) - 1, 6)]:
        t = s.texts[0] if s.texts else s.ids[0]
        print(f"{'baseline' if s.feature < 0 else f'feature {s.feature} c={s.coefficient:g}'}: {t!r}")
    print(f"report: {out.report}")
    return 0


def cmd_lookahead(args: argparse.Namespace) -> int:
    from ..experiments.lookahead_run import LookaheadRunConfig, run_lookahead

    cfg = LookaheadRunConfig(
        model=model_source(args),
        sae=args.sae,
        corpus=corpus_source(args),
        max_offset=args.max_offset,
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        max_positions=args.max_positions,
        seed=args.seed,
        features=args.features,
        qscore=args.qscore,
        q_aggregate=args.q_aggregate,
    )
    out = run_lookahead(cfg, args.out, overwrite=args.overwrite)
    for m in out.result.maps:
        print(f"k={m.offset}: val CE {m.val_loss:.4f} (identity {m.val_loss_identity:.4f}), acc {m.val_acc:.3f}")
    print(f"report: {out.report}")
    return 0


# ----------------------------------------------------------------------------------------------------
# registration


def _lm_subparsers(subparsers: Any) -> Any:
    lm = subparsers.choices.get("lm")
    if lm is None:
        lm = subparsers.add_parser("lm", help="language models")
    for action in lm._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return lm.add_subparsers(dest="lm_command", metavar="LM_COMMAND")


def _common(p: argparse.ArgumentParser, *, corpus: bool = True) -> None:
    add_model_arguments(p, corpus=corpus)
    p.add_argument("--sae", required=True, help="SAELens SAE directory (cfg.json + sae_weights.safetensors)")
    p.add_argument("--out", required=True, help="run directory to write")
    p.add_argument("--overwrite", action="store_true", help="replace earlier results at --out")


def register(subparsers: Any) -> None:
    sub = _lm_subparsers(subparsers)
    q = sub.add_parser(
        "qscore",
        help="Q(w): future/immediate KL ratio of SAE features (pre-caching degree)",
        description="For each SAE feature: top-activating contexts in the corpus, ablation at the "
        "activating position, KL of the next-token distributions at offsets 1..K, "
        "Q = Σ_{d≥2} KL_d / KL_1 (mean of ratios, ratio of means, median).",
    )
    _common(q)
    g = q.add_argument_group("Q(w)")
    g.add_argument("--features", type=int_list_or_all, default=None, help="all (default) | 0-63 | 1,5,9")
    g.add_argument("--max-features", type=int, default=None, help="only the first N of --features")
    g.add_argument("--contexts", type=int, default=8, help="top-activating contexts per feature (default 8)")
    g.add_argument("--max-offset", type=int, default=10, help="K: offsets d = 1..K (default 10)")
    g.add_argument(
        "--ablation",
        default="error_preserving",
        choices=["error_preserving", "faithful", "both"],
        help="error_preserving: x − a_f·W_dec[f] (default); faithful: SAE reconstruction without "
        "the latent (reference)",
    )
    g.add_argument(
        "--position-rule",
        default="restrict",
        choices=["restrict", "drop"],
        help="restrict: maximum over positions with K following tokens; drop: reference rule",
    )
    g.add_argument("--dedup-distance", type=int, default=10, help="token edit distance of duplicates; -1 = off")
    g.add_argument("--min-total-kl", type=float, default=0.05, help="drop features with mean Σ_d KL_d ≤ this")
    g.add_argument("--batch-size", type=int, default=128, help="rows per ablation forward (default 128)")
    g.add_argument(
        "--shard",
        type=shard_arg,
        default=None,
        metavar="I/N",
        help="score only the I-th of N contiguous blocks of the features (0-based; combine the N runs with "
        "`lm qscore-merge`); under torchrun the ranks share the features without it",
    )
    q.set_defaults(func=cmd_qscore, writes=lambda a: [a.out])
    m = sub.add_parser(
        "qscore-merge",
        help="combine the runs of `lm qscore --shard I/N` into one Q(w) run",
        description="Read N shard run directories (every I/N once, same model, SAE, corpus and settings) and "
        "write one run ordered as an unsharded run (its report without context texts).",
    )
    m.add_argument("shards", nargs="+", help="the shard run directories")
    m.add_argument("--out", required=True, help="run directory to write")
    m.add_argument("--overwrite", action="store_true", help="replace earlier results at --out")
    m.set_defaults(func=cmd_qscore_merge, writes=lambda a: [a.out])

    s = sub.add_parser(
        "steer",
        help="sample text while adding c·W_dec[f] to the residual stream",
        description="Generate from BOS (or --prompt) with c·W_dec[f] added at the SAE's site at "
        "every position (once per forward), for every feature and coefficient, "
        "plus an unsteered baseline with the same seed.",
    )
    _common(s, corpus=False)
    g = s.add_argument_group("steering")
    g.add_argument("--features", type=int_list_or_all, required=True, help="features to steer with, e.g. 3,17")
    g.add_argument(
        "--coefficients",
        type=float_list,
        default=[1.0, 100.0],
        help="c values (default 1,100: the reference's effective values)",
    )
    g.add_argument("--samples", type=int, default=64, help="samples per condition (default 64)")
    g.add_argument("--max-new-tokens", type=int, default=20, help="default 20")
    g.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1)")
    g.add_argument("--prompt", type=utf8_text, default="", help="text after BOS (default: BOS only)")
    g.add_argument("--seed", type=int, default=42, help="sampling seed, shared by all conditions (default 42)")
    g.add_argument("--show", type=int, default=5, help="samples per condition shown in the report")
    s.set_defaults(func=cmd_steer, writes=lambda a: [a.out])

    la = sub.add_parser(
        "lookahead",
        help="look-ahead maps (token t+k from the residual at t) vs SAE encoders",
        description="Train one affine map per offset k (identity init) so that the unembedding "
        "of the mapped residual at t predicts token t+k; SVD; alignment of SAE "
        "encoder columns with the top-r right singular vectors; Spearman with Q.",
    )
    _common(la)
    g = la.add_argument_group("look-ahead")
    g.add_argument("--max-offset", type=int, default=5, help="offsets k = 1..K (default 5)")
    g.add_argument("--epochs", type=int, default=10, help="default 10")
    g.add_argument("--lr", type=float, default=1e-4, help="Adam learning rate (default 1e-4)")
    g.add_argument("--batch-size", type=int, default=32, help="default 32")
    g.add_argument("--max-positions", type=int, default=None, help="cap on training positions")
    g.add_argument("--seed", type=int, default=0, help="split and shuffling seed")
    g.add_argument(
        "--features", type=int_list_or_all, default=None, help="features (default: those of --qscore, else all)"
    )
    g.add_argument("--qscore", default=None, help="results.json (or run directory) of `lm qscore` to correlate with")
    g.add_argument(
        "--q-aggregate",
        default="q_median",
        choices=["q", "q_ratio_of_means", "q_median"],
        help="which Q to correlate with (default q_median)",
    )
    la.set_defaults(func=cmd_lookahead, writes=lambda a: [a.out])
