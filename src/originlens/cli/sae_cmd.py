"""``originlens sae ...``: sparse autoencoders on a language model's residual stream.

::

    originlens sae train --model M --corpus C --site resid.K|blocks.L.hook_resid_post
                         [--architecture standard|topk] [--d-sae N | --expansion F] [--l1 λ] [--k K]
                         [--steps N] [--batch-size B] [--lr LR] [--max-tokens N] [--seed S] --out RUN
    originlens sae info DIR

``train`` writes RUN/sae/ (SAELens format: cfg.json + sae_weights.safetensors), RUN/results.json,
metrics.jsonl and report.html (see :mod:`originlens.sae.train`); ``info`` prints an SAE directory's
configuration.  Model and corpus options as for ``originlens lm qscore``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .lm_features_cmd import add_model_arguments, corpus_source, model_source


def cmd_train(args: argparse.Namespace) -> int:
    from ..experiments.sae_run import SAERunConfig, run_sae_train
    from ..sae.train import SAETrainConfig

    train = SAETrainConfig(
        architecture=args.architecture,
        d_sae=args.d_sae,
        expansion=args.expansion,
        l1_coefficient=args.l1,
        k=args.k,
        lr=args.lr,
        steps=args.steps,
        batch_size=args.batch_size,
        seed=args.seed,
        log_every=args.log_every,
    )
    cfg = SAERunConfig(
        model=model_source(args),
        corpus=corpus_source(args),
        site=args.site,
        train=train,
        max_tokens=args.max_tokens,
        model_name=args.model_name,
    )
    out = run_sae_train(cfg, args.out, overwrite=args.overwrite)
    result, sae_dir = out.result, out.sae_dir
    m = result.metrics
    print(
        f"{sae_dir}: {result.sae.cfg.architecture} SAE, d_sae={result.sae.d_sae} on {result.sae.cfg.hook_name}; "
        f"held-out fvu {m['fvu']:.4f}, L0 {m['l0']:.2f}, dead {m['dead_frac']:.1%}"
    )
    print(f"report: {out.path / 'report.html'}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from ..sae.format import config_to_dict, read_config

    print(json.dumps(config_to_dict(read_config(args.dir)), indent=2))
    return 0


def register(subparsers: Any) -> None:
    sae = subparsers.add_parser("sae", help="sparse autoencoders (SAELens format) on residual streams")
    sub = sae.add_subparsers(dest="sae_command", metavar="SAE_COMMAND")
    t = sub.add_parser(
        "train",
        help="train an SAE on a residual site of a language model",
        description="Collect the residual stream at --site over the corpus (BOS position "
        "excluded) and train a ReLU+L1 or TopK SAE with Adam and unit-norm decoder "
        "rows; writes RUN/sae in SAELens format.",
    )
    add_model_arguments(t)
    t.add_argument("--site", required=True, help="resid.K (K = 0..L) or blocks.L.hook_resid_pre/post")
    g = t.add_argument_group("SAE")
    g.add_argument("--architecture", default="standard", choices=["standard", "topk"], help="default standard")
    g.add_argument("--d-sae", type=int, default=None, help="number of latents (default expansion × d_model)")
    g.add_argument("--expansion", type=int, default=4, help="latents per residual dimension (default 4)")
    g.add_argument(
        "--l1", type=float, default=5.0, help="L1 coefficient, standard only (default 5, on inputs scaled to E‖x‖² = d)"
    )
    g.add_argument("--k", type=int, default=8, help="active latents, topk only (default 8)")
    g.add_argument("--steps", type=int, default=2000, help="default 2000")
    g.add_argument("--batch-size", type=int, default=256, help="activations per step (default 256)")
    g.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    g.add_argument("--max-tokens", type=int, default=200_000, help="activations collected (default 200000)")
    g.add_argument("--seed", type=int, default=0, help="default 0")
    g.add_argument("--log-every", type=int, default=50, help="default 50")
    g.add_argument("--model-name", default=None, help="model_name written to cfg.json (default: --model)")
    t.add_argument("--out", required=True, help="run directory to write")
    t.add_argument("--overwrite", action="store_true", help="replace earlier results at --out")
    t.set_defaults(func=cmd_train, writes=lambda a: [a.out])
    i = sub.add_parser("info", help="print the configuration of an SAELens SAE directory")
    i.add_argument("dir", help="SAE directory")
    i.set_defaults(func=cmd_info, writes=lambda a: [])
