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

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .language_analysis import (  # noqa: F401 (re-exported)
    ALPHA,
    COMPONENTS,
    INFLUENCE_GROUPS,
    LOSS_TEST,
    POSITION_FEATURES,
    PROBE_GROUPS,
    SHARE_TEST,
    SYNTAX_TEST,
    TESTS,
    influence_by_group,
    influence_group,
    probe_group,
    probe_quality,
    run_influence,
    summarise,
)
from .language_continuations import continuations, generate  # noqa: F401 (re-exported)
from .language_runs import _run_all

EXPERIMENT = "language"
TASK = "tinystories"
REGIMES = ("standard", "myopic")
PAPER_TRACKED_POSITIONS = tuple(range(30, 40))
PAPER_WINDOW = 64
PAPER_SEEDS = 10
# The paper's configuration (arXiv 2603.14087's hyper-parameter table, TinyStories row).
PAPER = dict(n_layer=4, d_model=128, n_head=4, batch_size=256, steps=1000, eval_size=30000)
# Shared by every scale: only the final eval/probes are needed; every checkpoint is kept (replay checks).
COMMON = dict(eval_every=0, probe_every=0, keep_checkpoints=0, log_every=10)
SCALES: dict[str, dict[str, Any]] = {
    "paper": {
        "ntp": dict(PAPER, checkpoint_every=250),
        "task": {},
        "attribute_positions": [30, 34, 38],
        "attribute_regimes": ["standard"],
        "prompts": 3,
    },
    "cpu": {
        "ntp": dict(PAPER, batch_size=64, steps=300, eval_size=4000, checkpoint_every=100),
        "task": {},
        "attribute_positions": [34],
        "attribute_regimes": ["standard"],
        "prompts": 3,
    },
    "ci": {
        "ntp": dict(
            n_layer=2, d_model=16, n_head=2, batch_size=8, steps=4, eval_size=80, checkpoint_every=2, log_every=1
        ),
        "task": dict(window=24, bpe_vocab_size=256),
        "attribute_positions": [8, 12],
        "attribute_regimes": ["standard", "myopic"],
        "prompts": 2,
    },
}
SCALE_NOTES = {
    "paper": "the paper's configuration (a GPU job)",
    "cpu": "the paper's model and window at batch 64, 300 steps and 4,000 eval windows, every update attributed "
    "at position 34 of every layer; ≈ 30 min per standard run (training ≈ 5 min, attribution ≈ 25 min) "
    "with 2 runs in parallel on 2 CPU cores",
    "ci": "a seconds-long check that the pipeline runs; not a result",
}
# Task options the experiment sets itself (through its own fields).
OWN_TASK_OPTIONS = ("syntax_features", "annotator", "syntax_labels", "spacy_model")
OWN_NTP_FIELDS = ("task", "regime", "seed", "task_options", "probe_positions")
PAPER_LOSS = {"myopic": "3.29 ± 0.02", "standard": "2.53 ± 0.10"}


def _task_defaults() -> dict[str, Any]:
    from ..tasks.tinystories import TinyStoriesTask

    return {f.name: f.default for f in dataclasses.fields(TinyStoriesTask)}


@dataclass
class LanguageExperimentConfig:
    """Settings of :func:`run_language_experiment`; ``None`` fields take the scale's preset.

    ``annotator``: ``lingua`` (default; tags only), ``spacy`` (the paper's; needs spaCy and a pipeline) or
    ``gold`` (storyworld stories only); ``syntax_labels``: ``all`` | ``tags`` | ``deps`` (default ``tags``
    for lingua, ``all`` otherwise); ``spacy_model``: the spaCy pipeline (default ``en_core_web_sm``);
    ``task_options``: further ``tinystories`` options (``data_root``, ``cache_dir``, ``bpe_vocab_size``,
    ``window``, ``heldout_frac``) on top of the scale's; ``overrides``: :class:`~originlens.train.ntp.NTPConfig`
    fields on top of the scale (each one is recorded as a deviation when it departs from the paper);
    ``attribute_layers`` default 1..L, ``attribute_steps`` default every update, ``attribute_regimes`` the
    regimes attributed; ``prompts``: held-out stories continued per regime; ``jobs``: (regime, seed) runs
    in parallel processes, one torch thread each.

    Construction validates everything, including the task itself (annotator installed, labels it can give,
    the data root), so a bad setting is one error before anything is trained or written.
    """

    scale: str = "cpu"
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    regimes: list[str] = field(default_factory=lambda: list(REGIMES))
    annotator: str = "lingua"
    syntax_labels: str | None = None
    spacy_model: str | None = None
    attribute_positions: list[int] | None = None
    attribute_layers: list[int] | None = None
    attribute_steps: int | None = None
    attribute_regimes: list[str] | None = None
    task_options: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    prompts: int | None = None
    sample_seed: int = 0
    confidence: float = 0.95
    jobs: int = 1

    def __post_init__(self) -> None:
        from ..tasks import syntax

        if self.scale not in SCALES:
            raise ConfigError(f"unknown scale {self.scale!r}", f"use one of: {', '.join(SCALES)}")
        preset = SCALES[self.scale]
        if isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or self.jobs < 1:
            raise ConfigError(f"jobs must be an integer ≥ 1, got {self.jobs!r}", "e.g. --jobs 2")
        self.seeds = list(self.seeds)
        if not self.seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds):
            raise ConfigError(f"seeds must be non-negative integers, got {self.seeds!r}", "e.g. --seeds 0-2")
        self.regimes = list(self.regimes)
        bad = [r for r in self.regimes if r not in REGIMES]
        if bad or not self.regimes:
            raise ConfigError(
                f"unknown regime(s) {bad}" if bad else "no regimes given",
                f"use a comma-separated subset of: {', '.join(REGIMES)}",
            )
        if len(set(self.regimes)) != len(self.regimes) or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError("regimes and seeds must not repeat", "remove the duplicates")
        if self.attribute_regimes is None:
            self.attribute_regimes = [r for r in preset["attribute_regimes"] if r in self.regimes]
        self.attribute_regimes = list(self.attribute_regimes)
        bad = [r for r in self.attribute_regimes if r not in self.regimes]
        if bad:
            raise ConfigError(
                f"attributed regime(s) {bad} are not trained (regimes {self.regimes})",
                "attribute a subset of --regimes",
            )
        if not 0 < self.confidence < 1:
            raise ConfigError(f"confidence must be in (0, 1), got {self.confidence}", "use 0.95")
        if self.annotator not in syntax.ANNOTATORS:
            raise ConfigError(
                f"unknown syntax annotator {self.annotator!r}", f"use one of: {', '.join(syntax.ANNOTATORS)}"
            )
        if self.syntax_labels is None:
            self.syntax_labels = "tags" if self.annotator == "lingua" else "all"
        if self.syntax_labels not in syntax.LABEL_SETS:
            raise ConfigError(
                f"unknown syntax label set {self.syntax_labels!r}", f"use one of: {', '.join(syntax.LABEL_SETS)}"
            )
        if self.prompts is None:
            self.prompts = preset["prompts"]
        if isinstance(self.prompts, bool) or not isinstance(self.prompts, int) or self.prompts < 0:
            raise ConfigError(f"prompts must be an integer ≥ 0, got {self.prompts!r}", "e.g. --prompts 3")
        if isinstance(self.sample_seed, bool) or not isinstance(self.sample_seed, int) or self.sample_seed < 0:
            raise ConfigError(f"sample_seed must be an integer ≥ 0, got {self.sample_seed!r}", "e.g. 0")
        if not isinstance(self.task_options, dict) or not isinstance(self.overrides, dict):
            raise ConfigError("task_options and overrides must be mappings", "pass dicts of option → value")
        own = [k for k in OWN_TASK_OPTIONS if k in self.task_options]
        if own:
            raise ConfigError(
                f"task option(s) {own} are set by the experiment itself",
                "use --annotator / --syntax-labels / --spacy-model instead",
            )
        own = [k for k in OWN_NTP_FIELDS if k in self.overrides]
        if own:
            raise ConfigError(
                f"override(s) {own} are set by the experiment itself",
                "drop them (probe positions follow --attribute-positions)",
            )
        # the task itself, once: annotator installed, label set it gives, data root, window
        task = self.make_task()
        T = int(task.seq_len)
        if self.attribute_positions is None:
            self.attribute_positions = [i for i in preset["attribute_positions"] if i < T] or [T // 2]
        self.attribute_positions = sorted({int(i) for i in self.attribute_positions})
        bad_positions = [i for i in self.attribute_positions if not 1 <= i <= T - 1]
        if bad_positions or not self.attribute_positions:
            raise ConfigError(
                f"attributed positions {bad_positions or self.attribute_positions} outside 1..{T - 1} (window T = {T})",
                "e.g. --attribute-positions 30,34,38 (T = 64)",
            )
        cfg0 = self.run_config(self.regimes[0], self.seeds[0], initial=False)  # validates the overrides
        L = cfg0.n_layer
        if self.attribute_layers is None:
            self.attribute_layers = list(range(1, L + 1))
        self.attribute_layers = sorted({int(k) for k in self.attribute_layers})
        if not self.attribute_layers or any(not 0 <= k <= L for k in self.attribute_layers):
            raise ConfigError(
                f"attributed layers {self.attribute_layers} outside 0..{L}", f"e.g. --attribute-layers 1-{L}"
            )
        if self.attribute_steps is not None:
            if (
                isinstance(self.attribute_steps, bool)
                or not isinstance(self.attribute_steps, int)
                or not 1 <= self.attribute_steps <= cfg0.steps
            ):
                raise ConfigError(
                    f"attribute_steps={self.attribute_steps!r} outside 1..{cfg0.steps}",
                    "attribute a prefix of the training run (or leave it unset: every update)",
                )
        if self.attribute_regimes and cfg0.steps < 1:
            raise ConfigError("attribution needs at least one training step", "set steps ≥ 1 or attribute nothing")

    # -- derived -----------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return f"{TASK}-{self.scale}"

    def task_opts(self) -> dict[str, Any]:
        """The ``tinystories`` options of every run (scale preset, the user's, the syntax settings)."""
        opts = {
            **SCALES[self.scale]["task"],
            **self.task_options,
            "syntax_features": True,
            "annotator": self.annotator,
            "syntax_labels": self.syntax_labels,
        }
        if self.spacy_model is not None:
            opts["spacy_model"] = self.spacy_model
        return opts

    def make_task(self) -> Any:
        """The task object (construction checks the annotator, the label set and the data root)."""
        from ..tasks import get_task

        try:
            return get_task(TASK, **self.task_opts())
        except TypeError as exc:
            raise ConfigError(
                f"task {TASK!r} does not take the options {sorted(self.task_options)} ({exc})",
                "drop the unknown --task-option",
            ) from None

    @property
    def window(self) -> int:
        return int(self.task_opts().get("window", _task_defaults()["window"]))

    @property
    def probe_positions(self) -> list[int]:
        """The attributed positions plus the paper's tracked positions 30–39 that fit in the window."""
        T = self.window
        return sorted(set(self.attribute_positions or []) | {i for i in PAPER_TRACKED_POSITIONS if i < T})

    def ntp_overrides(self, initial: bool) -> dict[str, Any]:
        ov = {**COMMON, **SCALES[self.scale]["ntp"], **self.overrides}
        if initial:
            ov.update(steps=0, checkpoint_every=0)
        return ov

    def run_config(self, regime: str, seed: int, *, initial: bool) -> Any:
        from ..train.ntp import NTPConfig

        return NTPConfig.from_dict(
            {
                **self.ntp_overrides(initial),
                "task": TASK,
                "regime": regime,
                "seed": int(seed),
                "task_options": self.task_opts(),
                "probe_positions": self.probe_positions,
            },
            where="the experiment's run configuration",
        )

    def end_step(self, steps: int) -> int:
        return int(self.attribute_steps or steps)

    def deviations(self) -> list[str]:
        """Every difference from the paper's configuration, plus the tokenizer and data differences."""
        from ..train.ntp import NTPConfig

        defaults = {f.name: f.default for f in dataclasses.fields(NTPConfig)}
        used = self.run_config(self.regimes[0], self.seeds[0], initial=False)
        out = []
        for key in (
            "n_layer",
            "d_model",
            "n_head",
            "batch_size",
            "steps",
            "eval_size",
            "lr",
            "betas",
            "eps",
            "probe_alpha",
            "probe_train_frac",
            "dtype",
        ):
            paper = PAPER.get(key, defaults.get(key))
            if isinstance(paper, tuple):
                paper = list(paper)
            got = getattr(used, key)
            if (list(got) if isinstance(got, tuple) else got) != paper:
                out.append(f"{key} {got} (paper {paper})")
        if used.probe_size != used.eval_size:
            out.append(f"probe_size {used.probe_size} (paper: the whole eval set)")
        if self.window != PAPER_WINDOW:
            out.append(f"window T = {self.window} (paper {PAPER_WINDOW})")
        opts = self.task_opts()
        tdef = _task_defaults()
        bpe = int(opts.get("bpe_vocab_size", tdef["bpe_vocab_size"]))
        out.append(
            f"tokenizer: a {bpe}-id BPE trained on the data root's stories (paper: the TinyStories tokenizer, "
            f"50,257 ids), so losses and pos_int are not on the paper's scale"
        )
        task = self.make_task()
        train, held = task.split
        out.append(
            f"data: the {len(task.data.hashes):,} stories ({int(task.data.tokens.size):,} tokens) of the data "
            f"root, {len(train):,} train / {len(held):,} held-out by story hash (fraction "
            f"{opts.get('heldout_frac', tdef['heldout_frac'])}; "
            "paper: 300,000 windows of the full TinyStories set)"
        )
        if self.annotator == "lingua":
            out.append(
                "syntax annotator: Lingua::EN::Tagger (Penn tags, no dependency labels; paper: spaCy "
                "en_core_web_sm, 10 tags + 10 labels)"
            )
        elif self.annotator == "gold":
            out.append(
                "syntax annotator: gold tags/labels of generated storyworld stories (paper: spaCy on TinyStories)"
            )
        elif (self.spacy_model or "en_core_web_sm") != "en_core_web_sm":
            out.append(f"spaCy pipeline {self.spacy_model} (paper en_core_web_sm)")
        if self.syntax_labels != "all" and self.annotator != "lingua":
            out.append(f"syntax labels {self.syntax_labels} only (paper: tags and dependency labels)")
        if list(self.attribute_positions or []) != list(PAPER_TRACKED_POSITIONS):
            out.append(
                f"attributed positions {', '.join(map(str, self.attribute_positions or []))} (paper 30–34 and 35–39)"
            )
        if self.attribute_steps is not None and self.attribute_steps < used.steps:
            out.append(f"attribution over updates 1..{self.attribute_steps} of {used.steps}")
        if len(self.seeds) < PAPER_SEEDS:
            out.append(f"{len(self.seeds)} seeds (paper {PAPER_SEEDS})")
        return out


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
        done = _run_all(config, out)
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
