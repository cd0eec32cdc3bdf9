"""The TinyStories experiment of arXiv 2603.14087 (the TinyStories task, its features and results) as an experiment
that can fail: standard vs myopic training over seeds, held-out loss, probes of the syntax and
story-position features next to an untrained-model null, Adam pathway attribution per feature group, and
the paper's two claims tested as hypotheses over seeds.

``run_language_experiment(LanguageExperimentConfig(scale="cpu", seeds=[0, 1, 2]), OUT)``:

1. trains every (regime, seed), regimes ``standard`` and ``myopic``, on the ``tinystories`` task with its
   syntax features (``task_options``: ``syntax_features=True``, the annotator, the label set) under
   ``OUT/trained/<regime>/seed-<s>`` (resumable; finished runs and finished attributions are skipped);
   final ridge probes at the attributed positions plus the paper's tracked positions 30–39 (those inside
   the window), checkpoints every ``checkpoint_every`` updates (all kept: the replay starts from the
   deterministic initialisation and is checked bit for bit against every checkpoint it passes);
2. fits the same probes on the **initial** model (0 steps) of every (regime, seed) under
   ``OUT/initial/<regime>/seed-<s>``: the null that says how much of a feature is linearly decodable
   before any learning;
3. held-out loss per run (``eval_loss`` of the run summary: mean next-token cross-entropy on
   ``eval_size`` windows of the task's held-out split, the same windows for both regimes at one seed),
   a Student-t interval over seeds per regime and the one-sided paired test (paired by seed) "myopic loss
   > standard loss";
4. probe quality per feature group (``tags`` = ``tag_*``, ``deps`` = ``dep_*`` when the annotator gives
   labels, ``position`` = ``pos_int`` + ``pos_prop``): per run the mean test Pearson r over layers 1..L,
   the probed positions and the group's features (NaN entries — features constant on the test rows —
   skipped); Fisher-z intervals over seeds, beside the initial-model null and a paired test of the gain;
5. attribution (regimes in ``attribute_regimes``; standard by default, myopic too at the ``ci`` scale,
   where pre-caching is structurally 0): :func:`originlens.attribution.replay.attribute_run` with the
   paper's Adam variant over updates 1..``attribute_steps`` at sites ``attribute_layers`` ×
   ``attribute_positions`` for every feature; integrated influence (sum over updates) per item =
   (layer k, position i, feature).  Per run and feature **group** (``syntax`` = tags + deps,
   ``position`` = pos_int + pos_prop) and component (direct / precached / shared / full) the mean over
   items — for ``precached`` over layers k < L only, since G_pre ≡ 0 at k = L (nothing but the loss at
   i reads r^L_i); every component at k = L is reported separately (``last_layer``) and every component
   over k < L as well (``below_last``).  The **pre-cached share** of a group is
   ``pre / (|dir| + |pre| + |sh|)`` of the k < L group means of one run.  Over seeds: Student-t
   intervals;
6. tests the paper's claims (:data:`TESTS`) as one-sided paired t-tests over seeds on the raw values
   (``inference.paired_test(..., correlation=False)``): the loss claim alone, and the two feature claims
   as one family with Holm's adjustment; a claim *holds* when its (adjusted) p < α = 0.05;
7. continuations: for each regime, the model of the first seed continues the first ``prompts`` held-out
   stories (prompt: their first T/2 tokens; T/2 new tokens), greedy and sampled (temperature 1,
   ``torch.Generator`` seeded with ``sample_seed``, the same stream for each regime), decoded with the
   task's BPE (the Whitespace pre-tokenizer has no decoder, so tokens are joined by spaces);
8. writes ``OUT/experiment.json``, ``OUT/report.html`` (+ ``report.md``) and the results file
   ``results/language/tinystories-<scale>.json`` (unless ``results`` says otherwise).

:mod:`.language_runs` trains and attributes the runs, :mod:`.language_analysis` measures them and aggregates
over seeds, :mod:`.language_continuations` generates the continuations, and :mod:`.language_report` holds
the text: the report, ``docs/results.md``'s section (``render_section``) and the verdict rules of the two
TinyStories claims (``judge_loss``, ``judge_features``).  The public names of the first three are
importable from here as well.

Scales (:data:`SCALES`): ``paper`` is the paper's configuration (4 layers, d = 128, 4 heads, batch 256,
1,000 steps, T = 64, eval 30,000 windows; attributed positions 30, 34, 38; a GPU job); ``cpu`` keeps the
model and the window and cuts the batch to 64, the steps to 300, the eval set to 4,000 windows and the
attributed sites to position 34 of every layer: measured (3 seeds, 2 runs in parallel on 2 cores)
≈ 5 min of training and ≈ 25 min of attribution per standard run, ≈ 5 min per myopic run (trained
only), ≈ 55 min for the whole 3-seed experiment;
``ci`` is a seconds-long check that the pipeline runs (2 layers, d = 16, T = 24), not a result.  Every
departure from the paper is listed in the results file's ``scale.deviations``, always including the
tokenizer (a 4096-id BPE trained on the data root's ~7,100 stories, not the paper's TinyStories
tokenizer) and the data (that subset, not the full TinyStories set), so our losses are not on the paper's
scale (paper: 3.29 ± 0.02 myopic vs 2.53 ± 0.10 standard).

Caveats: the annotator defaults to Lingua::EN::Tagger (Penn tags only — no dependency labels offline; see
:mod:`originlens.tasks.syntax`), so ``syntax`` means tags unless ``annotator="spacy"``; the items of one
run are not independent (one trajectory), so the unit of replication is the seed, and with 3 seeds the
tests have little power (reported); bit-exact replay needs the training run's torch thread count, so
each (regime, seed) is trained and attributed in the same process.  Influences carry the squared units of
their feature (the mismatch R is a squared probe error), so a group mean is dominated by its
largest-scale feature — ``pos_int`` (token indices, tens to hundreds) within ``position``; the share is
scale-free per group, and the per-feature means are kept in each run's ``attribution.by_feature``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .language_analysis import TESTS, summarise
from .language_config import EXPERIMENT, PAPER_LOSS, SCALE_NOTES, LanguageExperimentConfig
from .language_continuations import continuations
from .language_runs import run_all_units

# ----------------------------------------------------------------------------------------------------
# the experiment


def run_language_experiment(
    config: LanguageExperimentConfig, out: str | Path, *, results: str | Path | None = None, command: str | None = None
) -> dict[str, Any]:
    """Train (or resume) regimes × seeds and their initial-model nulls, attribute, aggregate, generate
    the continuations, and write ``OUT/experiment.json``, the report and the results file; returns the
    experiment record (with ``results_file``)."""
    from ..runs import exclusive, to_jsonable
    from ..storage import atomic_write_json
    from .results import default_results_path, write_results

    out = Path(out)
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    with exclusive(out):
        done = run_all_units(config, out)
        summary = summarise(config, out)
        summary["continuations"] = continuations(config, out)
        summary["wall_seconds_this_call"] = time.time() - t0
        summary["done_this_call"] = done  # one line per run trained / attribution computed
        cfg0 = config.run_config(config.regimes[0], config.seeds[0], initial=False)
        task = config.make_task()
        # set by LanguageExperimentConfig.__post_init__
        assert config.attribute_layers is not None and config.attribute_positions is not None
        assert config.attribute_regimes is not None
        scale = {
            "name": config.scale,
            "summary": SCALE_NOTES[config.scale],
            "model": f"{cfg0.n_layer} layers, d = {cfg0.d_model}, {cfg0.n_head} heads, T = {config.window}, "
            f"|V| = {task.vocab_size}",
            "training": f"Adam lr {cfg0.lr}, batch {cfg0.batch_size}, {cfg0.steps} steps on random windows of "
            "the train split",
            "eval": f"{cfg0.eval_size} held-out windows; ridge probes (alpha {cfg0.probe_alpha}) on the first "
            f"{int(cfg0.probe_train_frac * 100)} %, Pearson r on the rest, layers 1–{cfg0.n_layer}, "
            f"positions {', '.join(map(str, config.probe_positions))}",
            "syntax": f"annotator {config.annotator}, labels {config.syntax_labels}",
            "attribution": (
                f"Adam variant, updates 1..{config.end_step(cfg0.steps)}, layers "
                f"{', '.join(map(str, config.attribute_layers))} × positions "
                f"{', '.join(map(str, config.attribute_positions))}, regimes "
                f"{', '.join(config.attribute_regimes) or 'none'}"
            ),
            "deviations": config.deviations(),
        }
        summary["scale"] = scale
        summary["expected"] = dict(TESTS)
        atomic_write_json(out / "experiment.json", to_jsonable(summary))
        from .language_report import write_report

        write_report(summary, out)
        res_path = Path(results) if results is not None else default_results_path(EXPERIMENT, config.name)
        quality = {
            r: {
                k: summary["per_regime"][r][k]
                for k in ("eval_loss", "eval_loss_bootstrap", "initial_eval_loss", "next_token_acc")
            }
            for r in config.regimes
        }
        quality["paper_loss"] = dict(PAPER_LOSS)
        numbers = {
            "probes": {
                r: {k: summary["per_regime"][r][k] for k in ("probe", "initial_probe", "probe_gain")}
                for r in config.regimes
            },
            "influence": summary["influence"],
        }
        write_results(
            res_path,
            experiment=EXPERIMENT,
            name=config.name,
            command=command or f"python: run_language_experiment({config!r}, {str(out)!r})",
            config={"experiment": to_jsonable(config), "ntp": cfg0.to_dict()},
            seeds=config.seeds,
            scale=scale,
            numbers=numbers,
            quality=quality,
            data_hashes=summary["data_hashes"],
            tests=summary["tests"],
            runs=[{k: v for k, v in r.items() if k != "data_hashes"} for r in summary["runs"]],
            extra={
                "continuations": summary["continuations"],
                "metric": (
                    "probes: mean test Pearson r of the final ridge probes over layers 1..L, the "
                    "probed positions and the group's features, one value per run; influence: "
                    "integrated Adam influence (sum over the attributed updates) per item "
                    "(layer, position, feature), mean over the group's items per run "
                    "(pre-cached over layers k < L); positive = toward the final feature value"
                ),
            },
        )
        summary["results_file"] = str(res_path)
    return summary
