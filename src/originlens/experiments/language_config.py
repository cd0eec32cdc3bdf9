"""The TinyStories pathway experiment's configuration (:mod:`.language`): the paper's setting, the
scales, the regimes, the probed and attributed sites, and the deviations from the paper.

At the bottom of the experiment: :mod:`.language`, :mod:`.language_runs`, :mod:`.language_analysis`,
:mod:`.language_continuations` and :mod:`.language_report` import from here, never the reverse.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .config_checks import check_jobs, check_scale

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

        check_scale(self.scale, SCALES)
        preset = SCALES[self.scale]
        check_jobs(self.jobs)
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
