"""The Q(w) section of arXiv 2603.14087 on a model we train ourselves: are extreme-Q SAE features formal?

The paper measures, on Gemma-2-2B with Gemma Scope SAEs: (a) SAE features with extreme Q(w) are
disproportionately formal (code, math, syntax), σ(ln Q) 1.63 ± 0.03 for formal vs 1.23 ± 0.02 for other
features; (b) steering with high-Q features produces more code and punctuation; (c) Q correlates
negatively with a feature's alignment to the look-ahead predictors' subspace.  Neither model can be
downloaded here, so ``run_formal(FormalConfig(scale="cpu", seeds=[0, 1, 2]), OUT)`` tests the three claims
on a GPT trained on real stories and real Python source, the seed as the unit of replication:

1. **corpus** (``OUT/corpus``, ``OUT/corpus-data``; built once, shared by the seeds): the TinyStories
   lines of the data root (:func:`originlens.paths.tinystories_files`; without them the built-in
   storyworld, said so in the results), ``stories`` of them; Python files of this interpreter
   (:func:`originlens.data.formal.python_source_documents`, ≤ ``python_max_chars`` each) drawn at random
   until their Whitespace pre-tokenizer pieces reach ``python_ratio`` × the stories' (so the two domains
   are comparable in tokens); a held-out ``heldout_frac`` of the documents of each domain; a BPE of
   ``vocab_size`` ids trained on the training documents only; one corpus, ``windows="split"`` (no window
   spans two documents), documents ordered train-story, train-python, held-out-story, held-out-python, so
   the held-out windows are the last ones (the trainer's eval set) and ``windows.npz`` gives every window
   its ``domain`` (0 story, 1 python) and ``heldout`` flag (from ``window_documents.npy``).  A corpus
   without one of the domains, or without a training or held-out window of one, is refused (InputError);
2. **models** (``OUT/seed-<s>/{standard,myopic,initial}/run``): our GPT, standard regime, the myopic
   regime as the control (same seed: same initialisation and data order), and the untrained model of the
   same seed as the null; held-out loss per domain (mean next-token cross-entropy over the first
   ``eval_windows`` held-out windows of each domain) and a unigram null (add-one, training windows);
3. **SAE** per trained model: TopK (``sae_k``, ``sae_expansion`` × d latents) at ``resid.L//2`` on
   ``sae_windows`` training windows (SAELens format, ``<regime>/sae/sae``);
4. **labels**: SAE activations over the *analysis windows* (``analysis_windows`` held-out windows of each
   domain, the same for every seed, so both domains have the same number of tokens); each feature's python
   share of activation mass, the rule of :mod:`.formal_metrics` (formal: share ≥ ``threshold``; other: the
   remaining live features; dead: no mass, excluded) → ``labels.npz`` (masses ``(2, F)``, share ``(F,)``,
   label ``(F,)``, the mean residual norm at the site);
5. **Q(w)** of every live feature (:func:`originlens.lm.qscore.qscore`, contexts from the analysis windows,
   no BOS prepended — windows are fed as trained) → ``qscore.npz`` (q, q_median, kept …, ``(F,)``, NaN
   where not scored); claim (a): σ(ln Q) formal vs other per seed with bootstrap CIs over features and a
   label-permutation p, then over seeds a t-interval of the difference and the one-sided paired test
   formal > other; the same on the myopic control;
6. **steering** (standard model): the ``steer_k`` highest-Q, lowest-Q and random scored features, each
   at c = α × the mean residual norm for α in ``steer_alphas``, and c = 0, continuing ``steer_prompts``
   held-out story openings (:func:`originlens.lm.steering.steer`, common random numbers across
   conditions) → ``steering.json``; code fraction (lexical rule of :mod:`.formal_metrics`), punctuation
   fraction (:func:`~originlens.lm.steering.completion_stats`: punctuation-only tokens) and the python-typical
   token fraction; top-Q vs random and vs zero, paired by prompt within a seed and by seed over seeds;
7. **look-ahead** (:func:`originlens.lm.steering.lookahead`, maps for offsets 1..``la_max_offset`` on the
   analysis windows) → ``lookahead.npz`` (alignment ``(K, F)`` at rank r = ``la_rank_frac`` × d); a
   feature's alignment is the mean over offsets 2..K; claim (c): Spearman ρ(alignment, Q) per seed with a
   permutation p, Fisher-z interval over seeds and the one-sided test ρ < 0;
8. ``OUT/experiment.json``, ``OUT/report.html`` and ``results/formal/formal-<scale>.json``.

Every stage is skipped when its file exists (``OUT/settings.json`` refuses an OUT made with other
settings); ``SEED/timings.json`` keeps the seconds of each stage.  The code is split over five modules:
this one (settings, :func:`run_formal`), :mod:`.formal_stages` (the stages of one seed),
:mod:`.formal_corpus` (the corpus),
:mod:`.formal_metrics` (labels, σ(ln Q), permutation nulls, the text criteria) and :mod:`.formal_report`
(aggregation over seeds, the report, the verdicts :func:`judge_formal_share`, :func:`judge_steering`,
:func:`judge_lookahead` — ``judge`` is the first, the headline claim — and :func:`render_section` for
``docs/results.md``).

Scales (:data:`SCALES`, one commented table): ``cpu`` is 4 layers × 128, 4 heads, T = 64, |V| = 2048,
batch 32, 3,000 Adam steps per regime: the Othello and TinyStories experiments' CPU model, with half
their batch and vocabulary so that both regimes of one seed should train in 30–40 min on 2 CPU cores
(extrapolated from the TinyStories runs' ≈ 1 s per step at batch 64, |V| = 4096 on one thread; not yet
measured), ≈ 2 passes over the training windows of a ≈ 3 M-token corpus (1.4 M Whitespace pieces of
stories and as many of Python); SAE, Q(w), look-ahead maps and steering add minutes per seed.  ``ci`` is
a seconds-long plumbing check, not a result.  Caveats: our BPE drops whitespace (the Whitespace
pre-tokenizer), so the model sees code without its layout; the labels come from activation mass per
domain, not from feature explanations; one corpus and one held-out split serve every seed, so the CIs
over seeds cover training randomness, not the choice of documents.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..runs import exclusive, to_jsonable
from ..storage import atomic_write_json, read_json
from . import formal_metrics as fm
from .formal_corpus import (
    MixedCorpus,
    build_mixed_corpus,
    load_stories,
    open_mixed_corpus,
    select_python,
    unigram_losses,
)
from .formal_report import (  # noqa: F401 (re-exported: the verdicts and the docs section)
    JUDGES,
    clean,
    judge_formal_share,
    judge_lookahead,
    judge_steering,
    render_section,
    summarise,
    write_report,
)
from .formal_stages import run_seed, window_losses  # noqa: F401 (re-exported: the stages of one seed)
from .results import default_results_path, write_results

EXPERIMENT = "formal"
REGIMES = ("standard", "myopic")
ALPHA = 0.05
PAPER_SIGMA = {"formal": "1.63 ± 0.03", "other": "1.23 ± 0.02"}
# setting: (cpu, ci)  — what it sets
_TABLE: dict[str, tuple[Any, Any]] = {
    "stories": (None, 120),  # TinyStories lines sampled from the data root (None: all)
    "python_sources": (["stdlib"], ["stdlib"]),  # data.formal sources: stdlib and/or site-packages
    "python_max_chars": (50_000, 6000),  # longest Python file kept
    "python_ratio": (1.0, 1.0),  # Python pieces / story pieces (Whitespace pre-tokenizer pieces ≈ tokens)
    "heldout_frac": (0.1, 0.1),  # documents of each domain held out
    "vocab_size": (2048, 512),  # BPE ids
    "seq_len": (64, 32),  # T (windows of T + 1 tokens)
    "n_layer": (4, 2),
    "d_model": (128, 32),
    "n_head": (4, 2),
    "batch_size": (32, 16),
    "steps": (3000, 150),  # Adam steps per regime
    "lr": (1e-3, 3e-3),
    "eval_windows": (1000, 40),  # held-out windows per domain for the losses
    "learned_margin": (1.0, 1.0),  # nats below the untrained model that count as "learned"
    "sae_expansion": (4, 2),  # SAE latents = expansion × d
    "sae_k": (16, 4),  # TopK k
    "sae_steps": (3000, 120),
    "sae_batch": (512, 128),
    "sae_lr": (1e-3, 1e-3),
    "sae_windows": (3000, 200),  # training windows whose activations train the SAE
    "analysis_windows": (400, 20),  # held-out windows per domain for labels, Q(w) and the look-ahead maps
    "threshold": (0.8, 0.65),  # python share ≥ threshold: formal
    "min_group": (5, 2),  # fewest scored features per label for claim (a) to count
    "q_contexts": (8, 4),  # top-activating contexts per feature
    "q_max_offset": (10, 4),  # K of Q(w)
    "q_min_total_kl": (0.05, 0.0),  # Q(w)'s drop rule: features with mean Σ_d KL_d ≤ this are not scored
    "la_max_offset": (5, 3),  # look-ahead offsets 1..K
    "la_epochs": (5, 1),
    "la_lr": (1e-3, 1e-3),
    "la_batch": (256, 128),
    "la_max_positions": (20_000, 1200),
    "la_rank_frac": (0.125, 0.125),  # rank r of the subspace = la_rank_frac × d
    "steer_k": (4, 2),  # features per group (top-Q, bottom-Q, random)
    "steer_alphas": ([0.5, 1.0, 2.0], [1.0, 4.0]),  # c = α × mean residual norm at the site
    "steer_prompts": (8, 3),  # held-out story openings
    "steer_prompt_tokens": (16, 6),
    "steer_samples": (8, 2),  # samples per (prompt, feature, c)
    "steer_new_tokens": (32, 8),
    "n_boot": (2000, 200),  # bootstrap resamples over features
    "n_perm": (2000, 200),  # label / rank permutations
}
SCALES: dict[str, dict[str, Any]] = {sc: {k: v[i] for k, v in _TABLE.items()} for i, sc in enumerate(("cpu", "ci"))}
SCALE_NOTES = {
    "cpu": "4 × 128 GPT on ≈ 3 M tokens of stories + Python; both regimes of a seed in ≈ 20 min on 2 CPU cores "
    "(measured: ≈ 8 min training per regime, ≈ 2.5 min SAEs, Q(w), steering and look-ahead)",
    "ci": "a plumbing check in seconds; not a result",
}


@dataclass
class FormalConfig:
    """Seeds × the scale's settings; ``overrides`` replace scale fields (each recorded as a deviation).
    ``split_seed`` fixes the document sample and the held-out split (shared by all seeds)."""

    scale: str = "cpu"
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    overrides: dict[str, Any] = field(default_factory=dict)
    confidence: float = 0.95
    device: str = "cpu"
    split_seed: int = 0

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ConfigError(f"unknown scale {self.scale!r}", f"use one of: {', '.join(SCALES)}")
        bad = sorted(set(self.overrides) - set(SCALES["cpu"]))
        if bad:
            raise ConfigError(f"unknown override(s) {bad}", f"use: {', '.join(SCALES['cpu'])}")
        if (
            not self.seeds
            or len(set(self.seeds)) != len(self.seeds)
            or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in self.seeds)
        ):
            raise ConfigError(f"seeds must be distinct non-negative integers, got {self.seeds!r}", "e.g. --seeds 0-2")
        s = self.settings
        for k in (
            "vocab_size",
            "seq_len",
            "steps",
            "eval_windows",
            "sae_steps",
            "sae_windows",
            "analysis_windows",
            "steer_k",
            "steer_prompts",
            "steer_samples",
            "steer_new_tokens",
            "n_boot",
            "n_perm",
            "min_group",
        ):
            if isinstance(s[k], bool) or not isinstance(s[k], int) or s[k] < 1:
                raise ConfigError(f"{k} must be a positive integer, got {s[k]!r}", f"set {k} ≥ 1")
        if not 0.5 < s["threshold"] < 1 or not 0 < s["heldout_frac"] <= 0.5:
            raise ConfigError("need 0.5 < threshold < 1 and 0 < heldout_frac ≤ 0.5", "e.g. threshold 0.8, 0.1")
        T = s["seq_len"]
        if not (s["q_max_offset"] < T and 2 <= s["la_max_offset"] < T and 1 <= s["steer_prompt_tokens"] <= T):
            raise ConfigError(
                f"need q_max_offset < seq_len, 2 ≤ la_max_offset < seq_len, 1 ≤ steer_prompt_tokens ≤ seq_len "
                f"(seq_len {T})",
                "lower the offsets or the prompt length",
            )
        if not s["steer_alphas"] or any(not a > 0 for a in s["steer_alphas"]):
            raise ConfigError(f"steer_alphas must be positive, got {s['steer_alphas']}", "e.g. 0.5,1,2")

    @property
    def settings(self) -> dict[str, Any]:
        return {**SCALES[self.scale], **self.overrides}

    @property
    def name(self) -> str:
        return f"{EXPERIMENT}-{self.scale}"

    def ntp_config(self, seed: int, regime: str, corpus: Path, n_heldout: int, *, initial: bool = False) -> Any:
        from ..train.ntp import NTPConfig

        s = self.settings
        steps = 0 if initial else s["steps"]
        return NTPConfig(
            task="language",
            corpus=str(corpus),
            regime=regime,
            seed=int(seed),
            n_layer=s["n_layer"],
            d_model=s["d_model"],
            n_head=s["n_head"],
            batch_size=s["batch_size"],
            steps=steps,
            lr=s["lr"],
            eval_size=n_heldout,
            eval_every=0,
            probe_every=0,
            checkpoint_every=max(1, steps // 10) if steps else 0,
            keep_checkpoints=1,
            log_every=max(1, steps // 20) if steps else 1,
            device=self.device,
        )

    def deviations(self) -> list[str]:
        s = self.settings
        out = [
            f"model: our GPT, {s['n_layer']} layers × {s['d_model']}, trained here (paper: Gemma-2-2B)",
            f"SAE: TopK k = {s['sae_k']}, {s['sae_expansion']}·d latents at resid.{s['n_layer'] // 2}, trained here "
            "(paper: Gemma Scope)",
            f"tokenizer: BPE |V| = {s['vocab_size']} trained on our training documents, whitespace dropped "
            "(paper: Gemma's)",
            "corpus: TinyStories subset + Python standard-library sources (paper: Gemma's contexts)",
            f"labels: python share of activation mass ≥ {s['threshold']} (paper: its formal/other categorisation)",
            f"Q contexts: top {s['q_contexts']} of {2 * s['analysis_windows']} held-out windows, K = "
            f"{s['q_max_offset']}, error-preserving ablation",
            "steering: lexical code criterion on decoded text; c = α × mean residual norm",
            f"look-ahead maps: lr {s['la_lr']}, {s['la_epochs']} epochs, batch {s['la_batch']} (reference 1e-4, 10, 32)",
            f"{len(self.seeds)} training seeds (paper: one pretrained model)",
        ]
        out += [f"{k} {v} (scale {SCALES[self.scale][k]})" for k, v in self.overrides.items()]
        return out


# ----------------------------------------------------------------------------------------------------
# corpus


def prepare_corpus(config: FormalConfig, out: Path) -> MixedCorpus:
    """The experiment's corpus (built on the first call, reused after)."""
    if (out / "corpus-data" / "corpus-info.json").is_file():
        return open_mixed_corpus(out)
    s = config.settings
    stories, src = load_stories(s, config.split_seed)
    budget = int(s["python_ratio"] * sum(len(fm.text_pieces(t)) for t in stories))
    return build_mixed_corpus(
        out,
        stories,
        select_python(s, budget, config.split_seed),
        heldout_frac=s["heldout_frac"],
        vocab_size=s["vocab_size"],
        seq_len=s["seq_len"],
        split_seed=config.split_seed,
        story_source=src,
    )


def run_formal(
    config: FormalConfig, out: str | Path, *, results: str | Path | None = None, command: str | None = None
) -> dict[str, Any]:
    """Build (or reuse) the corpus, run every seed's stages, aggregate, write the record, the report and
    the results file; returns the summary."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with exclusive(out):
        fp = to_jsonable({"settings": config.settings, "split_seed": config.split_seed, "scale": config.scale})
        if (out / "settings.json").is_file() and read_json(out / "settings.json") != json.loads(json.dumps(fp)):
            raise ConfigError(f"{out} holds a formal experiment with other settings", "choose another --out")
        atomic_write_json(out / "settings.json", fp)
        corpus = prepare_corpus(config, out)
        for seed in config.seeds:
            run_seed(config, corpus, seed, out)
        summary = clean(summarise(config, out, unigram_losses(corpus, config.settings["eval_windows"])))
        s = config.settings
        summary["scale"] = {
            "name": config.scale,
            "summary": SCALE_NOTES[config.scale],
            "model": f"GPT {s['n_layer']} layers × {s['d_model']}, {s['n_head']} heads, T = {s['seq_len']}, |V| = {corpus.info['vocab_size']}",
            "training": f"Adam lr {s['lr']}, batch {s['batch_size']}, {s['steps']} steps, standard and myopic",
            "eval": f"first {s['eval_windows']} held-out windows of each domain",
            "sae": f"TopK k = {s['sae_k']}, {s['sae_expansion']}·d latents at resid.{s['n_layer'] // 2}, {s['sae_steps']} steps",
            "corpus": corpus.info,
            "deviations": config.deviations()
            + (
                ["stories: the built-in storyworld, NOT TinyStories"]
                if "storyworld" in corpus.info["story_source"]
                else []
            ),
        }
        summary["wall_seconds_this_call"] = time.time() - t0
        atomic_write_json(out / "experiment.json", summary)
        write_report(summary, out)
        res_path = Path(results) if results is not None else default_results_path(EXPERIMENT, config.name)
        hashes = {"corpus_tokens_sha256": corpus.info["tokens_sha256"], "corpus_vocab_hash": corpus.info["vocab_hash"]}
        runs = [
            {
                "seed": sd,
                "regime": nm,
                **read_json(out / f"seed-{sd}" / nm / "losses.json"),
                "train_seconds": read_json(out / f"seed-{sd}" / nm / "run" / "summary.json").get("seconds"),
                "stage_seconds": read_json(out / f"seed-{sd}" / "timings.json") if nm == "standard" else None,
            }
            for sd in config.seeds
            for nm in (*REGIMES, "initial")
        ]
        write_results(
            res_path,
            experiment=EXPERIMENT,
            name=config.name,
            command=command or f"python: run_formal({config!r}, {str(out)!r})",
            config={"experiment": to_jsonable(config), "settings": s},
            seeds=config.seeds,
            scale=summary["scale"],
            numbers=summary["numbers"],
            quality=summary["quality"],
            tests=summary["tests"],
            data_hashes=hashes,
            runs=runs,
            extra={"paper": {"sigma_lnq": PAPER_SIGMA}, "rule": fm.RULE},
        )
        summary["results_file"] = str(res_path)
    return summary


judge = judge_formal_share  # the headline claim; JUDGES has all three
