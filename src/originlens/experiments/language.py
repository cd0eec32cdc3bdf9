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

:mod:`.language_report` holds the text: the report, ``docs/results.md``'s section
(``render_section``) and the verdict rules of the two TinyStories claims (``judge_loss``, ``judge_features``).

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from . import inference

EXPERIMENT = "language"
TASK = "tinystories"
REGIMES = ("standard", "myopic")
COMPONENTS = ("direct", "precached", "shared", "full")
PROBE_GROUPS = ("tags", "deps", "position")
INFLUENCE_GROUPS = ("syntax", "position")
POSITION_FEATURES = ("pos_int", "pos_prop")
PAPER_TRACKED_POSITIONS = tuple(range(30, 40))
PAPER_WINDOW = 64
PAPER_SEEDS = 10
ALPHA = 0.05
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

LOSS_TEST = "myopic > standard (held-out loss)"
SYNTAX_TEST = "syntax: direct > precached"
SHARE_TEST = "precached share: position > syntax"
TESTS = {
    LOSS_TEST: "myopic training costs language-modelling loss (paper: 3.29 ± 0.02 myopic vs 2.53 ± 0.10 "
    "standard, their tokenizer)",
    SYNTAX_TEST: "syntax features are built directly: direct > pre-cached influence (standard training)",
    SHARE_TEST: "story-position features lean on pre-caching: their pre-cached share exceeds the syntax "
    "features' (standard training)",
}
PAPER_LOSS = {"myopic": "3.29 ± 0.02", "standard": "2.53 ± 0.10"}


def probe_group(feature: str) -> str | None:
    """``tags`` / ``deps`` / ``position`` for the task's features (None for anything else, e.g. the
    ``f~random{j}`` null directions of an attribution store)."""
    if "~" in feature:
        return None
    if feature.startswith("tag_"):
        return "tags"
    if feature.startswith("dep_"):
        return "deps"
    return "position" if feature in POSITION_FEATURES else None


def influence_group(feature: str) -> str | None:
    """``syntax`` (tags and dependency labels) / ``position`` / None."""
    g = probe_group(feature)
    return "syntax" if g in ("tags", "deps") else g


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
        bad = [i for i in self.attribute_positions if not 1 <= i <= T - 1]
        if bad or not self.attribute_positions:
            raise ConfigError(
                f"attributed positions {bad or self.attribute_positions} outside 1..{T - 1} (window T = {T})",
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
# training, nulls and attribution of one (regime, seed)


def _dirs(out: Path, regime: str, seed: int) -> tuple[Path, Path]:
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
            d, d0 = _dirs(out, regime, seed)
            attr = None
            if regime in (config.attribute_regimes or []):
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


def _run_all(config: LanguageExperimentConfig, out: Path) -> list[str]:
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


# ----------------------------------------------------------------------------------------------------
# per-run measurements


def probe_quality(run_dir: str | Path, layers: Sequence[int], positions: Sequence[int]) -> dict[str, Any]:
    """Mean test Pearson r of a finished run's final probes over ``layers`` × ``positions``: per feature
    group (:data:`PROBE_GROUPS`, groups the run lacks are left out) and per feature."""
    from ..train.ntp import load_probe_metrics, tracked_quality

    pm = load_probe_metrics(Path(run_dir) / "probe_metrics.npz")
    groups: dict[str, list[str]] = {}
    for f in pm.feature_names:
        g = probe_group(f)
        if g is not None:
            groups.setdefault(g, []).append(f)
    return {
        "groups": {
            g: tracked_quality(pm, layers, positions, groups[g])["pearson"] for g in PROBE_GROUPS if g in groups
        },
        "features": {f: tracked_quality(pm, layers, positions, [f])["pearson"] for f in pm.feature_names},
    }


def influence_by_group(integrated_rows: Sequence[dict[str, Any]], n_layer: int) -> dict[str, Any]:
    """Per-run aggregation of integrated influences (rows of
    :func:`originlens.attribution.store.integrate`, all-rows type only) by feature group and component.

    Returns ``influence[group][component]`` (mean over items; ``precached`` over layers k < L only),
    ``below_last`` (every component over k < L), ``last_layer`` (every component at k = L),
    ``precached_share[group]`` = ``pre / (|dir| + |pre| + |sh|)`` of the ``below_last`` means, and the item
    counts; None where a group has no items (or, for the share, a zero denominator).  ``by_feature``:
    the same means per feature (``precached`` over k < L).
    """
    cells: dict[tuple[str, str, str], list[float]] = {}
    per_feature: dict[tuple[str, str], list[float]] = {}
    for r in integrated_rows:
        f = str(r["feature"])
        g = influence_group(f)
        if g is None or r.get("type") is not None or r.get("integrated") is None or r["component"] not in COMPONENTS:
            continue
        k = int(r["site_layer"])
        for part in ("all", "below" if k < n_layer else "last"):
            cells.setdefault((g, r["component"], part), []).append(float(r["integrated"]))
        if r["component"] != "precached" or k < n_layer:
            per_feature.setdefault((f, r["component"]), []).append(float(r["integrated"]))

    def mean(g: str, c: str, part: str) -> float | None:
        v = cells.get((g, c, part))
        return float(sum(v) / len(v)) if v else None

    out: dict[str, Any] = {
        "influence": {},
        "below_last": {},
        "last_layer": {},
        "precached_share": {},
        "n_items": {},
        "by_feature": {},
    }
    for (f, comp), v in sorted(per_feature.items()):
        out["by_feature"].setdefault(f, {})[comp] = float(sum(v) / len(v))
    for g in INFLUENCE_GROUPS:
        if not any(key[0] == g for key in cells):
            continue
        out["influence"][g] = {c: mean(g, c, "below" if c == "precached" else "all") for c in COMPONENTS}
        out["below_last"][g] = {c: mean(g, c, "below") for c in COMPONENTS}
        out["last_layer"][g] = {c: mean(g, c, "last") for c in COMPONENTS}
        b = out["below_last"][g]
        share = None
        if all(b[c] is not None for c in ("direct", "precached", "shared")):
            den = abs(b["direct"]) + abs(b["precached"]) + abs(b["shared"])
            share = b["precached"] / den if den > 0 else None
        out["precached_share"][g] = share
        out["n_items"][g] = {part: len(cells.get((g, "direct", part), [])) for part in ("all", "below", "last")}
    return out


def run_influence(run_dir: str | Path, n_layer: int) -> dict[str, Any]:
    """:func:`influence_by_group` of the attribution store ``RUN/attribution`` plus its replay checks."""
    from ..attribution.store import integrate, load_observables, read_segment_infos

    store = Path(run_dir) / "attribution"
    agg = influence_by_group(integrate(load_observables(store)).to_pylist(), n_layer)
    infos = read_segment_infos(store)
    agg["updates"] = [1, max(int(i["end"]) for i in infos)]
    agg["checks"] = [i.get("checks") for i in infos]
    agg["seconds"] = sum(float(i.get("seconds") or 0.0) for i in infos)
    return agg


def _per_run(config: LanguageExperimentConfig, out: Path, regime: str, seed: int) -> dict[str, Any]:
    from ..storage import read_json

    d, d0 = _dirs(out, regime, seed)
    cfg = config.run_config(regime, seed, initial=False)
    layers = list(range(1, cfg.n_layer + 1))
    s, s0 = read_json(d / "summary.json"), read_json(d0 / "summary.json")
    env = read_json(d / "environment.json")
    q, q0 = probe_quality(d, layers, config.probe_positions), probe_quality(d0, layers, config.probe_positions)
    ev, ev0 = s.get("final_eval", {}), s0.get("final_eval", {})
    rec = {
        "regime": regime,
        "seed": seed,
        "eval_loss": ev.get("eval_loss"),
        "next_token_acc": ev.get("legal_acc"),
        "initial_eval_loss": ev0.get("eval_loss"),
        "probe": q["groups"],
        "initial_probe": q0["groups"],
        "probe_by_feature": q["features"],
        "seconds": s.get("seconds"),
        "num_params": s.get("num_params"),
        "data_hashes": env.get("data_hashes", {}),
        "attribution": None,
    }
    if regime in (config.attribute_regimes or []):
        rec["attribution"] = run_influence(d, cfg.n_layer)
    return rec


# ----------------------------------------------------------------------------------------------------
# continuations


def generate(
    model: Any, prompt_ids: Sequence[int], max_new_tokens: int, *, temperature: float = 0.0, generator: Any = None
) -> list[int]:
    """Continue ``prompt_ids`` with a :class:`~originlens.models.GPT`: greedy (``temperature=0``, first
    argmax) or sampled from ``softmax(logits / temperature)`` (float64) with the torch ``generator``.
    The context is cropped to the model's last ``seq_len`` tokens; no key/value cache."""
    import torch

    if not prompt_ids:
        raise ConfigError("an empty prompt: nothing to condition on", "pass at least one prompt token")
    if temperature < 0:
        raise ConfigError(f"temperature={temperature} must be ≥ 0", "use 0 (greedy) or 1")
    dev = next(model.parameters()).device
    ctx = int(model.config.seq_len)
    toks = list(int(t) for t in prompt_ids)
    model.eval()
    with torch.no_grad():
        for _ in range(int(max_new_tokens)):
            x = torch.tensor([toks[-ctx:]], dtype=torch.long, device=dev)
            logits = model(x)[0, -1].double().cpu()
            if temperature == 0:
                nxt = int(logits.argmax())
            else:
                nxt = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)[0])
            toks.append(nxt)
    return toks[len(prompt_ids) :]


def continuations(config: LanguageExperimentConfig, out: Path) -> list[dict[str, Any]]:
    """Greedy and sampled continuations of the first ``config.prompts`` held-out stories by the model of
    the first seed of every regime (see the module docstring)."""
    import torch

    from ..models import GPT

    if not config.prompts:
        return []
    task = config.make_task()
    T = int(task.seq_len)
    n_prompt, n_new = T // 2, T - T // 2
    held = task.split[1][: config.prompts]
    tok = task.tokenizer
    models = {
        r: GPT.load(_dirs(out, r, config.seeds[0])[0] / "model.safetensors").to("cpu").eval() for r in config.regimes
    }
    items = []
    for j, s in enumerate(held):
        ids = [int(t) for t in task.data.story(int(s))[:n_prompt]]
        item = {
            "heldout_index": j,
            "prompt": tok.decode(ids),
            "prompt_tokens": len(ids),
            "new_tokens": n_new,
            "seed": config.seeds[0],
            "continuations": {},
        }
        for regime, model in models.items():
            gen = torch.Generator(device="cpu").manual_seed(int(config.sample_seed) + j)
            item["continuations"][regime] = {
                "greedy": tok.decode(generate(model, ids, n_new, temperature=0.0)),
                "sampled": tok.decode(generate(model, ids, n_new, temperature=1.0, generator=gen)),
            }
        items.append(item)
    return items


# ----------------------------------------------------------------------------------------------------
# aggregation over seeds


def _mean_ci_of(runs: list[dict[str, Any]], get: Any, confidence: float) -> dict[str, Any]:
    vals = []
    for r in runs:
        try:
            vals.append(get(r))
        except (KeyError, TypeError):
            vals.append(None)
    return inference.mean_ci(vals, confidence)


def _get(d: Any, *keys: Any) -> Any:
    for k in keys:
        if d is None:
            return None
        d = d.get(k)
    return d


def summarise(config: LanguageExperimentConfig, out: str | Path) -> dict[str, Any]:
    """Per-run values, per-regime CIs over seeds and the hypothesis tests of the finished runs under ``out``."""
    out = Path(out)
    c = config.confidence
    runs = [_per_run(config, out, r, s) for r in config.regimes for s in config.seeds]
    by = {(r["regime"], r["seed"]): r for r in runs}
    per_regime: dict[str, Any] = {}
    influence: dict[str, Any] = {}
    for regime in config.regimes:
        rr = [by[(regime, s)] for s in config.seeds]
        groups = [g for g in PROBE_GROUPS if any(g in r["probe"] for r in rr)]
        per_regime[regime] = {
            "eval_loss": inference.mean_ci([r["eval_loss"] for r in rr], c),
            "eval_loss_bootstrap": inference.bootstrap_ci([r["eval_loss"] for r in rr], c),
            "initial_eval_loss": inference.mean_ci([r["initial_eval_loss"] for r in rr], c),
            "next_token_acc": inference.mean_ci([r["next_token_acc"] for r in rr], c),
            "seconds": inference.mean_ci([r["seconds"] for r in rr], c),
            "probe": {g: inference.correlation_ci([r["probe"].get(g) for r in rr], c) for g in groups},
            "initial_probe": {g: inference.correlation_ci([r["initial_probe"].get(g) for r in rr], c) for g in groups},
            "probe_gain": {
                g: inference.paired_test(
                    [r["probe"].get(g) for r in rr],
                    [r["initial_probe"].get(g) for r in rr],
                    alternative="greater",
                    alpha=ALPHA,
                    confidence=c,
                )
                for g in groups
            },
        }
        if regime in (config.attribute_regimes or []):
            att = [r["attribution"] for r in rr]
            gs = [g for g in INFLUENCE_GROUPS if any(g in a["influence"] for a in att)]
            influence[regime] = {
                part: {
                    g: {
                        comp: _mean_ci_of(att, lambda a, p=part, g=g, comp=comp: a[p][g][comp], c)
                        for comp in COMPONENTS
                    }
                    for g in gs
                }
                for part in ("influence", "below_last", "last_layer")
            }
            influence[regime]["precached_share"] = {
                g: _mean_ci_of(att, lambda a, g=g: a["precached_share"][g], c) for g in gs
            }
            influence[regime]["updates"] = att[0]["updates"]
            influence[regime]["n_items"] = att[0]["n_items"]
    tests: dict[str, Any] = {
        "loss": {},
        "features": {},
        "alpha": ALPHA,
        "expected": dict(TESTS),
        "method": "one-sided paired t-test over seeds on the raw values (paired by seed); "
        "Holm over the feature family; exact Wilcoxon beside it",
    }
    if "standard" in config.regimes and "myopic" in config.regimes:
        t = inference.paired_test(
            [by[("myopic", s)]["eval_loss"] for s in config.seeds],
            [by[("standard", s)]["eval_loss"] for s in config.seeds],
            alternative="greater",
            correlation=False,
            alpha=ALPHA,
            confidence=c,
        )
        t["p_holm"] = t["p_t"]
        t["holds"] = t["p_t"] is not None and t["p_t"] < ALPHA
        tests["loss"][LOSS_TEST] = t
    if "standard" in influence:
        att = [by[("standard", s)]["attribution"] for s in config.seeds]
        fam = {
            SYNTAX_TEST: (
                [_get(a, "influence", "syntax", "direct") for a in att],
                [_get(a, "influence", "syntax", "precached") for a in att],
            ),
            SHARE_TEST: (
                [_get(a, "precached_share", "position") for a in att],
                [_get(a, "precached_share", "syntax") for a in att],
            ),
        }
        for k, (a, b) in fam.items():
            tests["features"][k] = inference.paired_test(
                a, b, alternative="greater", correlation=False, alpha=ALPHA, confidence=c
            )
        adj = inference.holm({k: v["p_t"] for k, v in tests["features"].items()})
        for k, v in tests["features"].items():
            v["p_holm"] = adj[k]
            v["holds"] = v["p_holm"] is not None and v["p_holm"] < ALPHA
    hashes: dict[str, Any] = {f"{r['regime']}/seed-{r['seed']}": r["data_hashes"] for r in runs}
    hashes["tinystories"] = _task_hashes(config)
    return {
        "scale": config.scale,
        "per_regime": per_regime,
        "influence": influence,
        "tests": tests,
        "runs": runs,
        "data_hashes": hashes,
    }


def _task_hashes(config: LanguageExperimentConfig) -> dict[str, Any]:
    """The tokenisation and syntax cache keys (they hash the data files, the BPE and the annotator) and
    the SHA-256 of every story file."""
    task = config.make_task()
    m = task.data.manifest
    return {
        "tokenisation_key": m["key"],
        "files": m["key_material"]["data"],
        "syntax_key": task.syntax.manifest["key"],
        "annotator": f"{task.syntax.manifest['key_material']['annotator']} "
        f"{task.syntax.manifest['key_material']['annotator_version']}",
    }


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
