"""``originlens ntp experiment tinystories``: standard vs myopic training on TinyStories with held-out loss,
syntax/position probes beside an untrained null, Adam pathway attribution per feature group, and the
paper's claims tested over seeds.

Parses arguments and calls :func:`originlens.experiments.language.run_language_experiment`, which trains
(or resumes) regimes × seeds and their initial-model nulls under ``--out``, attributes the standard runs,
and writes ``OUT/report.html`` and the results file ``results/language/tinystories-<scale>.json``
(``--results`` to write elsewhere).  Task options (``--task-option data_root=DIR``, ``bpe_vocab_size=N``,
``window=T``) go to the ``tinystories`` task; the syntax settings have their own flags.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import ConfigError
from .options import apply_threads, int_list


def _regimes(s: str) -> list[str]:
    return [r.strip() for r in s.split(",") if r.strip()]


def cmd_tinystories(args: argparse.Namespace) -> int:
    from ..experiments.language import run_language_experiment
    from ..experiments.language_config import LanguageExperimentConfig
    from ..experiments.language_report import summary_lines
    from ..experiments.results import command_line
    from .ntp_cmd import _overrides

    apply_threads(args)
    if args.overwrite:
        raise ConfigError(
            "the experiment resumes its runs and never overwrites them", "remove the --out directory to start over"
        )
    overrides = _overrides(args)
    task_options = overrides.pop("task_options", {})
    given = {
        k: v
        for k, v in (
            ("regimes", args.regimes),
            ("syntax_labels", args.syntax_labels),
            ("spacy_model", args.spacy_model),
            ("attribute_positions", args.attribute_positions),
            ("attribute_layers", args.attribute_layers),
            ("attribute_steps", args.attribute_steps),
            ("attribute_regimes", args.attribute_regimes),
            ("prompts", args.prompts),
        )
        if v is not None
    }
    cfg = LanguageExperimentConfig(
        scale=args.scale,
        seeds=args.seeds,
        annotator=args.annotator,
        jobs=args.jobs,
        confidence=args.confidence,
        sample_seed=args.sample_seed,
        task_options=task_options,
        overrides=overrides,
        **given,
    )
    s = run_language_experiment(cfg, args.out, results=args.results, command=command_line())
    print("\n".join(summary_lines(s)))
    print(f"{args.out}/report.html, {s['results_file']}")
    return 0


def add_parser(esub: Any) -> None:
    from .ntp_cmd import add_overrides

    g = esub.add_parser(
        "tinystories",
        help="TinyStories: standard vs myopic loss, syntax/position probes, "
        "pathway attribution per feature group, claims tested over seeds",
        description=__doc__.split("\n\n")[0],
    )
    g.add_argument(
        "--scale",
        default="cpu",
        help="paper (GPU) | cpu (batch 64, 300 steps, position 34 attributed) | ci (seconds; a pipeline check)",
    )
    g.add_argument("--seeds", type=int_list, default=[0, 1, 2], help="e.g. 0-2 (default) or 0,1,2")
    g.add_argument(
        "--regimes", type=_regimes, default=None, help="comma-separated subset of standard,myopic (default both)"
    )
    g.add_argument(
        "--annotator",
        default="lingua",
        help="syntax annotator: lingua (default; tags only) | spacy (the paper's) | gold (storyworld stories)",
    )
    g.add_argument("--syntax-labels", default=None, help="all | tags | deps (default: tags for lingua, all otherwise)")
    g.add_argument("--spacy-model", default=None, help="spaCy pipeline (default en_core_web_sm)")
    g.add_argument(
        "--attribute-positions",
        type=int_list,
        default=None,
        help="attributed positions (default paper scale 30,34,38, cpu 34; the paper: 30-39)",
    )
    g.add_argument("--attribute-layers", type=int_list, default=None, help="attributed layers (default 1..L)")
    g.add_argument("--attribute-steps", type=int, default=None, help="attribute updates 1..N (default: all)")
    g.add_argument(
        "--attribute-regimes",
        type=_regimes,
        default=None,
        help="regimes attributed (default standard; ci: standard,myopic)",
    )
    g.add_argument("--prompts", type=int, default=None, help="held-out stories continued per regime (3)")
    g.add_argument("--sample-seed", type=int, default=0, help="seed of the sampled continuations (0)")
    g.add_argument("--jobs", type=int, default=1, help="runs trained and attributed in parallel, one thread each (1)")
    g.add_argument("--confidence", type=float, default=0.95, help="interval level (0.95)")
    g.add_argument("--out", required=True, help="experiment directory (runs, attribution, report)")
    g.add_argument("--results", default=None, help="results file (default results/language/tinystories-SCALE.json)")
    add_overrides(g)
    g.set_defaults(func=cmd_tinystories, writes=lambda a: [a.out])
