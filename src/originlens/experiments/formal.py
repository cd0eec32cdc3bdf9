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
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..runs import exclusive, to_jsonable
from ..storage import atomic_write_json, read_json
from . import formal_metrics as fm
from .formal_config import EXPERIMENT, PAPER_SIGMA, REGIMES, SCALE_NOTES, FormalConfig
from .formal_corpus import (
    MixedCorpus,
    build_mixed_corpus,
    load_stories,
    open_mixed_corpus,
    select_python,
    unigram_losses,
)
from .formal_report import clean, summarise, write_report
from .formal_stages import run_seed
from .results import default_results_path, write_results


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
