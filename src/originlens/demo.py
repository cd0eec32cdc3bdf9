"""The end-to-end demo behind ``make demo`` / ``originlens demo``: both papers in one report.

Stages (each also a standalone run directory under ``OUT/``, made through the library's experiment and
training functions; the report lists the equivalent ``originlens`` commands a user would type):

1. ``statistics``: word-level corpus (the real TinyStories subset when the data root has it, the
   planted-association storyworld otherwise — the report says which; ``--corpus hf:roneneldan/TinyStories``
   reads the hub when online), the six statistics, top associations of the paper's example words.
2. ``leading``: a short SGD training of the one-hot attention-only model (arXiv 2601.19208 §5.1) on a
   smaller word corpus, and its theory-vs-learned cosine curves (``OUT/leading-terms``).
3. ``regimes``: standard / myopic / untied / myopic+untied on Conditioned Majority, one seed
   (arXiv 2603.14087 §3, ``OUT/regimes``).
4. ``othello``: a small OthelloGPT, board probes, and the direct / pre-cached / shared attribution of
   the probed features over its training (``OUT/othello``).

A rerun on the same ``OUT`` resumes: a stage finished earlier with the same settings (its blocks and
record in ``OUT/stages/<name>/``, ``done.json`` written last) is reused, not recomputed; ``--restart``
recomputes everything.  Caveat: the record keys on the settings, not on the data root's contents.

The main report (``OUT/report.html``) opens with the reproduction status of both papers, read from the
committed results files (``results/``; :mod:`originlens.experiments.render`), then gathers every stage's
figures and tables.  The stages' own runs are **illustrations of the method**, not results: their scales
are chosen to finish in minutes on 2 CPU cores, one seed each, no nulls; the report labels them so.

Size: the four stages are short scripts over the library, kept in one file so the demo reads top to bottom
as the tour it is.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConfigError
from .paths import data_root, tinystories_files
from .progress import log
from .runs import RunDir
from .storage import atomic_write_text

SPECIALS = ("<unk>", "<eot>", "<pad>", "<s>", "</s>")
# The paper's Figure 5 examples (basis, word).
EXAMPLES = [
    ("bigram", "red"),
    ("bigram", "to"),
    ("interchangeability", "they"),
    ("interchangeability", "happy"),
    ("interchangeability", "wanted"),
    ("context", "fish"),
    ("context", "flower"),
    ("context", "birds"),
]


STAGES = ("statistics", "leading", "regimes", "othello")


@dataclass
class DemoConfig:
    out: str = "runs/demo"
    stages: str = "all"  # "all" or a comma-separated subset of STAGES
    quick: bool = False  # even smaller settings (tests)
    restart: bool = False  # recompute every stage (default: reuse stages an earlier run finished)
    corpus: str = "auto"  # auto | tinystories | storyworld | PATH
    vocab_size: int = 1000
    seq_len: int = 64
    top_k: int = 10
    stories: int = 3000  # storyworld size
    oov: str = "unk"  # the subset is small: keep stories, map rare words to <unk>
    results: str = "results"  # committed results files shown as the reproduction status
    seed: int = 0
    # stage 2: leading terms
    lt_vocab_size: int = 300
    lt_seq_len: int = 32
    lt_steps: int = 60
    lt_batch_size: int = 256
    lt_lr: float = 0.05
    # stage 3: regimes on Conditioned Majority
    regime_steps: int = 400
    # stage 4: Othello
    othello_steps: int = 300
    othello_d_model: int = 64

    def stage_list(self) -> list[str]:
        if self.stages == "all":
            return list(STAGES)
        names = [s.strip() for s in self.stages.split(",") if s.strip()]
        bad = [n for n in names if n not in STAGES]
        if bad:
            raise ConfigError(f"unknown demo stage(s) {', '.join(bad)}", f"choose from {', '.join(STAGES)}")
        return names


def _choose_corpus(cfg: DemoConfig) -> tuple[list[Path] | None, str]:
    if cfg.corpus == "storyworld":
        return None, "storyworld (synthetic stories with planted associations)"
    if cfg.corpus in ("auto", "tinystories"):
        files = tinystories_files()
        if files:
            return files, f"TinyStories subset ({len(files)} files under {data_root() / 'tinystories'})"
        if cfg.corpus == "tinystories":
            raise ConfigError(
                f"no TinyStories files under {data_root() / 'tinystories'}",
                "set ORIGINLENS_DATA to the shared data directory or use --corpus storyworld",
            )
        return None, "storyworld (synthetic; TinyStories not found under the data root)"
    p = Path(cfg.corpus)
    return [p], f"user corpus {p}"


def _command(argv: list[Any]) -> str:
    """The ``originlens`` command a user would type for a step the demo runs through the library."""
    return "originlens " + " ".join(map(str, argv))


def _quietly() -> Any:
    """Library steps run without their own progress bars unless the demo is verbose."""
    from contextlib import contextmanager

    from . import progress as _progress

    @contextmanager
    def quiet():
        saved = _progress._VERBOSITY
        if _progress.verbosity() < 1:
            _progress.set_verbosity(0)  # what -q sets
        try:
            yield
        finally:
            _progress.set_verbosity(saved)

    return quiet()


def run_demo(cfg: DemoConfig) -> Path:
    """Run the demo; returns the path of the HTML report."""
    from .report import Report

    stages = cfg.stage_list()
    t0 = time.perf_counter()
    run = RunDir(cfg.out)
    run.write_config(cfg)
    rep = Report("originlens demo: where do transformer features come from?")
    rep.text(
        "One run of both papers at CPU scale: corpus statistics and their associations; the leading "
        "terms of an attention-only model's weights against the learned weights (arXiv 2601.19208); "
        "training regimes that remove pre-caching or circuit sharing, and the gradient-pathway "
        "attribution of OthelloGPT's board features (arXiv 2603.14087). Each stage is its own run "
        "directory with its own report; the commands that made them are listed at the end."
    )
    status = reproduction_status(cfg.results)
    rep.section("Reproduction status (from the committed results files)")
    if not Path(cfg.results).is_dir():
        rep.text(
            f"No results files under {cfg.results}/ (run the demo from the repository root); every claim "
            "below is therefore shown without one."
        )
    from .experiments.render import STATUS_HEADER

    rep.text(
        "Each row is a claim of one of the papers, its verdict and the results file behind it; the "
        "experiment commands that wrote them are in docs/results.md. Everything after this section is "
        "an illustration of the method at demo scale (one seed, minutes of CPU), not evidence."
    )
    rep.table(list(STATUS_HEADER), status, caption=f"generated from {cfg.results}/*/*.json")
    timings: list[list] = []
    commands: list[str] = []
    runners = {
        "statistics": _stage_statistics,
        "leading": _stage_leading,
        "regimes": _stage_regimes,
        "othello": _stage_othello,
    }
    data_hashes: dict[str, str] = {}
    for name in stages:
        ts = time.perf_counter()
        done = None if cfg.restart else _finished_stage(cfg, run, name)
        if done is not None:  # a rerun resumes: finished stages are not recomputed
            blocks, cmds, hashes, secs = done
            rep.blocks.extend(blocks)
            commands += cmds
            data_hashes.update(hashes)
            timings.append([f"{name} (finished earlier)", secs])
            log(f"[demo] stage {name}: finished in an earlier run ({secs:.1f} s), reused")
            continue
        first_block, first_cmd, before = len(rep.blocks), len(commands), dict(data_hashes)
        log(f"[demo] stage {name} ...")
        runners[name](cfg, run, rep, commands, data_hashes)
        timings.append([name, round(time.perf_counter() - ts, 1)])
        _record_stage(
            cfg,
            run,
            name,
            rep.blocks[first_block:],
            commands[first_cmd:],
            {k: v for k, v in data_hashes.items() if before.get(k) != v},
            timings[-1][1],
        )
        log(f"[demo] stage {name} done in {timings[-1][1]:.1f} s")
    run.write_environment(seeds={"demo": cfg.seed}, data_hashes=data_hashes)
    total = time.perf_counter() - t0
    rep.section("Reproduce and timings")
    rep.code("\n".join(commands))
    rep.table(
        ["stage", "seconds"], timings + [["total", round(total, 1)]], caption="Wall time of each stage on this machine."
    )
    run.log_metrics({"stage": "demo", "seconds": total, **{f"seconds_{n}": t for n, t in timings}})
    return rep.write(run.path)


STAGE_DIR = "stages"  # RUN/stages/<name>/: a finished stage's report blocks and record (done.json)


def _stage_identity(cfg: DemoConfig, name: str) -> dict[str, Any]:
    """What a stage's result depends on: the demo settings (the output directory and stage list aside)."""
    from dataclasses import asdict

    return {"stage": name, **{k: v for k, v in asdict(cfg).items() if k not in ("out", "stages", "results", "restart")}}


def _record_stage(
    cfg: DemoConfig, run: RunDir, name: str, blocks: list, commands: list[str], hashes: dict[str, str], seconds: float
) -> None:
    """Keep a finished stage's report blocks and record, written last (``done.json``), so that an
    interrupted demo resumes after its last finished stage."""
    from .report import Report
    from .storage import atomic_write_json

    d = run.file(STAGE_DIR, name)
    part = Report(name)
    part.blocks = list(blocks)
    part.write(d, run_record=False)
    atomic_write_json(
        d / "done.json",
        {"identity": _stage_identity(cfg, name), "commands": commands, "data_hashes": hashes, "seconds": seconds},
    )


def _finished_stage(cfg: DemoConfig, run: RunDir, name: str) -> tuple[list, list[str], dict[str, str], float] | None:
    """The blocks, commands, data hashes and seconds of stage ``name`` when an earlier demo in this
    directory finished it with the same settings; None otherwise."""
    from .report import load_report
    from .storage import read_json

    d = run.file(STAGE_DIR, name)
    if not (d / "done.json").is_file():
        return None
    rec = read_json(d / "done.json")
    if rec.get("identity") != json.loads(json.dumps(_stage_identity(cfg, name))):
        return None
    return (
        load_report(d).blocks,
        list(rec.get("commands", [])),
        dict(rec.get("data_hashes", {})),
        float(rec.get("seconds", 0.0)),
    )


def reproduction_status(root: str | Path) -> list[list[str]]:
    """The reproduction-status rows of the results files under ``root`` (a missing directory: every
    claim without a results file, i.e. its blocked verdict)."""
    from .experiments.render import status_rows
    from .experiments.results import load_all

    return status_rows(load_all(root), links=False)


def _append_stage_report(rep: Any, directory: Path, keep_figures: int | None = None) -> None:
    """Append the blocks of the report in ``directory`` (headings demoted, figures renamed)."""
    from .report import load_report

    sub = load_report(directory)
    n_fig = 0
    prefix = directory.name
    for kind, val in sub.blocks:
        if kind == "h2":
            rep.blocks.append(("h3", val))
        elif kind == "fig":
            n_fig += 1
            if keep_figures is not None and n_fig > keep_figures:
                continue
            png, caption, name = val
            rep.blocks.append(("fig", (png, caption, f"{prefix}-{name}")))
        elif kind == "figrow":
            items, caption = val
            rep.blocks.append(("figrow", ([(p, l, f"{prefix}-{n}") for p, l, n in items], caption)))
        else:
            rep.blocks.append((kind, val))


def _stage_statistics(cfg: DemoConfig, run: RunDir, rep: Any, commands: list[str], data_hashes: dict[str, str]) -> None:
    from .data import build_corpus
    from .report import setup_matplotlib
    from .stats import corpus_statistics, save_statistics, top_associations

    sources, corpus_desc = _choose_corpus(cfg)
    log(f"[demo] corpus: {corpus_desc}")
    store = build_corpus(
        sources,
        run.file("corpus"),
        tokenizer="words",
        vocab_size=cfg.vocab_size,
        seq_len=cfg.seq_len,
        windows="first",
        oov=cfg.oov,
        storyworld_stories=cfg.stories if sources is None else None,
        seed=cfg.seed,
    )
    tokens = np.asarray(store.tokens)
    log(f"[demo] {tokens.shape[0]} windows of T+1={tokens.shape[1]} tokens, |V|={store.vocab_size}")
    t1 = time.perf_counter()
    st = corpus_statistics(tokens, store.vocab_size, vocab=store.vocab)
    t_stats = time.perf_counter() - t1
    save_statistics(st, run.file("statistics"), manifest=store.manifest)
    data_hashes.update({s["path"]: s["sha256"] for s in store.manifest.get("sources", [])})

    assoc: dict[str, dict[str, list]] = {}
    assert st.vocab is not None  # computed with the store's vocabulary
    for basis, word in EXAMPLES:
        if word not in st.vocab:
            continue
        assoc.setdefault(basis, {})[word] = top_associations(st, basis, word, cfg.top_k, exclude=SPECIALS)
    for basis, by_word in assoc.items():
        for w, lst in by_word.items():
            print(f"{basis:>18}  {w:>8} → " + ", ".join(t for t, _ in lst))
    atomic_write_text(run.file("associations.json"), json.dumps(assoc, indent=1, ensure_ascii=False))
    run.log_metrics(
        {"stage": "statistics", "windows": int(tokens.shape[0]), "vocab_size": store.vocab_size, "seconds": t_stats}
    )

    plt = setup_matplotlib()
    rep.section("1. Corpus statistics (arXiv 2601.19208 §3) — illustration")
    rep.text(
        f"Corpus: {corpus_desc}. Word-level tokenizer (paper §5.1.1), |V| = "
        f"{store.vocab_size}, T = {cfg.seq_len}, {tokens.shape[0]} windows "
        f"(one per story, rare words mapped to <unk>)."
    )
    rep.text(
        f"All six statistics computed exactly in {t_stats:.2f} s: bigram B̄, interchangeability Σ = B̄ᵀB̄, "
        "context Φ̄, value target Φ̄ᵀB̄ᵀ, query-key Q̄ and positional Δ."
    )
    rows = [[basis, w, ", ".join(t for t, _ in lst)] for basis, words in assoc.items() for w, lst in words.items()]
    rep.table(
        ["basis", "word", f"top-{cfg.top_k} associations (row)"],
        rows,
        caption="Top associations of the paper's example words (Figure 5 of the paper).",
    )
    ctx = assoc.get("context", {})
    if ctx:
        fig, axes = plt.subplots(1, len(ctx), figsize=(3.2 * len(ctx), 2.8), squeeze=False)
        for ax, (w, lst) in zip(axes[0], ctx.items()):
            names, vals = [t for t, _ in lst][::-1], [v for _, v in lst][::-1]
            ax.barh(names, vals, color="#0072B2")
            ax.set_title(f"context map: '{w}'")
            ax.set_xlabel("context-map entry")
        rep.figure(
            fig,
            "Strongest context associations: the prefix tokens that most raise each word's "
            "probability as a target (rows of Φ̄).",
            "context-top.png",
        )
    fig, ax = plt.subplots(figsize=(6, 2.6))
    ax.plot(np.arange(st.seq_len), st.positional, color="#D55E00")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xlabel("offset d (0 = attend to self)")
    ax.set_ylabel("Δ[d]")
    rep.figure(
        fig, "Positional leading term Δ: which relative offsets the first attention gradient favours.", "positional.png"
    )
    words = [w for w in ["red", "big", "the", "to", "she", "he", "happy", "sad", "fish", "pond"] if w in st.vocab]
    if len(words) >= 3:
        idx = [st.index_of(w) for w in words]
        sub = st.bigram[np.ix_(idx, idx)]
        fig, ax = plt.subplots(figsize=(4.5, 3.8))
        lim = np.abs(sub).max() or 1.0
        im = ax.imshow(sub, cmap="PuOr", vmin=-lim, vmax=lim)
        ax.set_xticks(range(len(words)), words, rotation=60)
        ax.set_yticks(range(len(words)), words)
        ax.set_xlabel("next token")
        ax.set_ylabel("current token")
        ax.grid(False)
        fig.colorbar(im, ax=ax, shrink=0.8)
        rep.figure(
            fig, "Bigram map B̄ among a few words (rows: current token, columns: next token).", "bigram-heatmap.png"
        )
    src = " ".join(map(str, sources or []))
    commands += [
        f"originlens corpus build {src} --vocab-size {cfg.vocab_size} --seq-len {cfg.seq_len} "
        f"--oov {cfg.oov} --out corpus",
        "originlens stats corpus --out stats",
        "originlens assoc top --stats stats --basis context --word fish",
    ]


def _stage_leading(cfg: DemoConfig, run: RunDir, rep: Any, commands: list[str], data_hashes: dict[str, str]) -> None:
    sources, corpus_desc = _choose_corpus(cfg)
    corpus, out = run.file("leading-corpus"), run.file("leading-terms")
    steps = max(10, cfg.lt_steps // 3) if cfg.quick else cfg.lt_steps
    every = max(1, steps // 12)
    build = [
        "corpus",
        "build",
        *(sources or []),
        "--vocab-size",
        cfg.lt_vocab_size,
        "--seq-len",
        cfg.lt_seq_len,
        "--oov",
        "unk",
        "--out",
        corpus,
        "--overwrite",
    ]
    if sources is None:
        build += ["--stories", cfg.stories, "--seed", cfg.seed]
    if cfg.quick:
        build += ["--max-windows", 1024]
    train = [
        "assoc",
        "train",
        corpus,
        "--layers",
        3,
        "--lr",
        cfg.lt_lr,
        "--steps",
        steps,
        "--batch-size",
        cfg.lt_batch_size,
        "--checkpoint-every",
        every,
        "--out",
        out,
        "--overwrite",
    ]
    report = ["assoc", "report", out]
    from .data.build import build_corpus
    from .experiments.leading_run import LeadingRunConfig, report_leading_run, train_leading_run
    from .train import AssocTrainConfig

    with _quietly():
        build_corpus(
            sources,
            corpus,
            vocab_size=cfg.lt_vocab_size,
            seq_len=cfg.lt_seq_len,
            oov="unk",
            max_windows=1024 if cfg.quick else None,
            seed=cfg.seed,
            storyworld_stories=cfg.stories if sources is None else None,
            overwrite=True,
        )
        train_cfg = AssocTrainConfig(
            n_layers=3, lr=cfg.lt_lr, steps=steps, batch_size=cfg.lt_batch_size, checkpoint_every=every
        )
        train_leading_run(LeadingRunConfig(source=str(corpus), train=train_cfg), out, overwrite=True)
        report_leading_run(out)
    commands.extend(_command(argv) for argv in (build, train, report))
    rep.section("2. Leading terms over training (arXiv 2601.19208 §4–5) — illustration, not a result")
    rep.text(
        f"A 3-layer one-hot attention-only transformer trained from zero with SGD (η = {cfg.lt_lr}, batch "
        f"{cfg.lt_batch_size}, {steps} steps) on {corpus_desc} with |V| = {cfg.lt_vocab_size}, "
        f"T = {cfg.lt_seq_len}. Each checkpoint's W_O, V⁽ˡ⁾, W⁽ˡ⁾ and P⁽ˡ⁾ is compared with its closed-form "
        "leading term (sη·B̄, C(s,2)η²·Φ̄ᵀB̄ᵀ, …); cosines near 1 early, drifting as training leaves "
        "the validity window. Full report: leading-terms/report.html."
    )
    _append_stage_report(rep, out, keep_figures=3)


def _jobs() -> int:
    """Runs trained side by side in the regimes stage: one per CPU this process may use, at most 2 (the
    four small runs are independent; a second process beats a second thread per run)."""
    import os

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(2, cpus))


def _stage_regimes(cfg: DemoConfig, run: RunDir, rep: Any, commands: list[str], data_hashes: dict[str, str]) -> None:
    out = run.file("regimes")
    steps = max(50, cfg.regime_steps // 4) if cfg.quick else cfg.regime_steps
    grid = [
        "ntp",
        "grid",
        "--task",
        "cond-majority",
        "--regimes",
        "standard,myopic,untied,myopic+untied",
        "--seeds",
        "0",
        "--steps",
        steps,
        "--d-model",
        64,
        "--layers",
        2,
        "--batch-size",
        128,
        "--jobs",
        _jobs(),
        "--out",
        out,
        "--overwrite",
    ]
    from .train.grid import GridConfig, run_grid

    with _quietly():
        run_grid(
            GridConfig(
                task="cond-majority",
                regimes=["standard", "myopic", "untied", "myopic+untied"],
                seeds=[0],
                overrides={"steps": steps, "d_model": 64, "n_layer": 2, "batch_size": 128},
            ),
            out,
            overwrite=True,
            jobs=_jobs(),
        )
    commands.append(_command(grid))
    rep.section(
        "3. Training regimes on Conditioned Majority (arXiv 2603.14087 §3, §8) — illustration, one seed, not a result"
    )
    rep.text(
        f"A 2-layer GPT (d = 64) trained {steps} Adam steps in each regime. Myopic training removes "
        "pre-caching (gradients from later positions' losses), untied training removes circuit "
        "sharing across positions; the probe quality of the NTP-useless feature shows which pathway "
        "builds it. One seed here (the paper's figure uses several): read the direction, not the "
        "decimals. Full report: regimes/report.html."
    )
    _append_stage_report(rep, out)


def _stage_othello(cfg: DemoConfig, run: RunDir, rep: Any, commands: list[str], data_hashes: dict[str, str]) -> None:
    out = run.file("othello")
    steps = max(40, cfg.othello_steps // 5) if cfg.quick else cfg.othello_steps
    every = max(1, steps // 10)
    train = [
        "ntp",
        "train",
        "--task",
        "othello",
        "--steps",
        steps,
        "--d-model",
        cfg.othello_d_model,
        "--layers",
        2,
        "--heads",
        4,
        "--batch-size",
        64,
        "--checkpoint-every",
        every,
        "--probe-every",
        0,
        "--eval-every",
        steps,
        "--eval-size",
        1024,
        "--probe-size",
        1024,
        "--out",
        out,
        "--overwrite",
    ]
    stride = 3  # influences recorded at every 3rd update (the Othello experiment's cpu scale: every 5th)
    record = f"{stride}:{steps}:{stride}"
    attribute = ["ntp", "attribute", out, "--layers", "1-2", "--positions", "12,20", "--steps", record]
    attribute += ["--report", "--overwrite"]
    from .attribution.replay import attribute_run
    from .attribution.store_report import write_report
    from .train.ntp import NTPConfig, Trainer

    ntp = NTPConfig(
        task="othello",
        regime="standard",
        seed=0,
        steps=steps,
        d_model=cfg.othello_d_model,
        n_layer=2,
        n_head=4,
        batch_size=64,
        checkpoint_every=every,
        probe_every=0,
        eval_every=steps,
        eval_size=1024,
        probe_size=1024,
    )
    with _quietly():
        Trainer(ntp, out, overwrite=True).run()
        res = attribute_run(
            out,
            sites=[(k, i) for k in (1, 2) for i in (12, 20)],
            features="tracked",
            steps=range(stride, steps + 1, stride),
            overwrite=True,
        )
        write_report(res.store)
    commands.extend(_command(argv) for argv in (train, attribute))
    rep.section(
        "4. Gradient pathways of OthelloGPT's board features (arXiv 2603.14087 §2, §4) — illustration, not a result"
    )
    rep.text(
        f"A 2-layer GPT (d = {cfg.othello_d_model}) trained {steps} steps on synthetic Othello games; "
        "linear probes read the board from the player-to-move's perspective. Every update of the run "
        "is replayed from its checkpoints and split exactly into direct, pre-cached and shared "
        "gradient pathways at residual sites; the influence of each pathway on each probed feature "
        f"is its contribution to moving the feature toward its final value, recorded at every {stride}rd "
        "update (the forward-mode derivatives are the larger cost). Full report: "
        "othello/attribution/report.html (or the directory printed by the command)."
    )
    attr_dirs = sorted(p.parent for p in out.rglob("report.blocks.json") if p.parent != out)
    for d in attr_dirs[:1]:
        _append_stage_report(rep, d)
