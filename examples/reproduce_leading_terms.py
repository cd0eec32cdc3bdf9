"""Reproduce the TinyStories experiments of arXiv 2601.19208 §5 through the library's Python API.

    .venv/bin/python examples/reproduce_leading_terms.py --out runs/repro                 # CPU scale (default)
    .venv/bin/python examples/reproduce_leading_terms.py --out runs/paper --paper-scale --data FULL_TINYSTORIES

Steps (each a library call, recorded in ``OUT/summary.md`` beside the equivalent ``originlens`` command):

1. :func:`originlens.data.build.build_corpus` (``corpus build``): word tokenizer (paper §5.1.1), first T+1
   tokens of every story;
2. for every run, :func:`originlens.experiments.leading_run.train_leading_run` (``assoc train``: 3 layers,
   zero init, plain SGD, statistics from the first shuffled batch) and
   :func:`~originlens.experiments.leading_run.report_leading_run` (``assoc report``: tracking, null
   baselines, causal intervention, leading-term model);
3. ``OUT/summary.md`` / ``summary.json``: our numbers next to the paper's, with wall times.

Scales:

* **CPU (default)**: the shared TinyStories subset (7,087 stories with ≥ 65 tokens) with |V| = 1,000,
  T = 64, ``oov="unk"`` (with the paper's ``drop`` almost nothing survives on the subset), L = 3, SGD batch
  2,048 (the paper's), 6,144 training windows (3 steps per epoch; the other 943 held out), η = 0.005 and
  η = 0.05 for ``--epochs`` epochs (default 100, as the paper: 300 steps).  Checkpoints every step during
  the first two epochs (to see the first steps, which the paper does not log) and every two epochs after
  (the paper's logging); the summary reports the minimum cosine over the paper's logging points and over
  all checkpoints, against first-batch targets (paper) and against all training windows.
* **paper (``--paper-scale``, one flag)**: |V| = 3,000, T = 200, ``oov="drop"``, 65,536 training windows
  (+ 2,048 held out for the held-out losses), 100 epochs of batch 2,048 (3,200 steps), checkpoints every 2
  epochs, η = 0.005 and 0.05, intervention on the full training set, ``--device auto`` for training and
  report (a GPU: ≈ 50 PFLOP per η with the path implementation, ≈ 10× that dense).  Needs the full
  TinyStories train split (``--data``); with the shared subset far fewer windows qualify and a warning is
  printed.

The acceptance targets of the issue: η = 0.005 → minimum cosine over training ≥ 0.99 for W, V and W_O;
η = 0.05 → loss well below ln|V| and the intervention hurts most for W_O, then V, then W.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any

PAPER = {
    "min_cos": {0.005: {"W": 0.999496, "V": 0.999169, "W_O": 0.998486}},
    "table3": {
        "original": 5.349,
        "W.1": 5.350,
        "W.2": 5.352,
        "W.3": 5.361,
        "V.1": 6.192,
        "V.2": 6.526,
        "V.3": 6.520,
        "W_O": 8.287,
    },
    "loss_eta_0.05": (8.00, 5.35),
}
KINDS = ("W", "V", "W_O", "P")


def step(what: str, log: list[str], fn, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """Call ``fn(*args, **kwargs)``, recording ``what`` (the equivalent ``originlens`` command) in ``log``;
    returns (result, seconds)."""
    print(f"$ {what}", flush=True)
    log.append(what)
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def min_cosines(records: list[dict], *, every: int | None = None, other: str | None = None) -> dict:
    """Minimum over checkpoints (those at multiples of ``every`` steps if given) and layers per kind."""
    out = {}
    for k in KINDS:
        vals = []
        for r in records:
            if every and r["step"] % every:
                continue
            src = r["min_cos"] if other is None else (r.get("min_cos_vs") or {}).get(other, {})
            v = src.get(k)
            if v is not None and math.isfinite(v):
                vals.append(v)
        out[k] = min(vals) if vals else None
    return out


class _Track:
    """Callback: min cosine over layers per kind at every step against several target statistics."""

    def __init__(self, targets: dict) -> None:
        self.targets, self.rec = targets, {lab: {} for lab in targets}
        self.weights = None

    def on_step_end(self, tr) -> None:
        from originlens.theory import min_cosines
        from originlens.theory.leading_terms import compare_to_theory

        for lab, st in self.targets.items():
            cmp = compare_to_theory(tr.model, st, tr.step, tr.cfg.lr)
            self.rec[lab][tr.step] = {
                "min_cos": min_cosines(cmp),
                "norm_ratio": [
                    min(v["norm_ratio"] for v in cmp.values() if math.isfinite(v["norm_ratio"])),
                    max(v["norm_ratio"] for v in cmp.values() if math.isfinite(v["norm_ratio"])),
                ]
                if any(math.isfinite(v["norm_ratio"]) for v in cmp.values())
                else None,
            }
        self.weights = {k: v.double() for k, v in tr.model.weights().items()}


def diagnose(corpus: Path, n_train: int, eta: float, steps: int, batches: tuple[int, ...]) -> dict:
    """Why a minimum cosine can fall short of the paper's (η = 0.005), in three cheap experiments:

    * ``sampling``: cosine between the leading terms of the first shuffled batch (the targets) and those
      of all training windows (what SGD over every batch follows), per batch size;
    * ``precision``: the first ``steps`` SGD steps at the smallest batch in float32 and float64 (same data
      order), min cosine over layers per step against first-batch and all-window targets;
    * ``exact``: full-batch GD in float64 on the first-batch windows themselves, i.e. statistics of
      exactly the data used (the theorem's setting) — cosines ≈ 1 and norm ratios ≈ 1 inside the window.
    """
    import numpy as np
    import torch

    from originlens.data import load_token_array
    from originlens.stats import corpus_statistics
    from originlens.theory import cosine, validity_window
    from originlens.train import AssocTrainConfig, train_assoc

    toks, vocab, _ = load_token_array(corpus)
    toks = np.asarray(toks[:n_train], dtype=np.int64)
    V, T = len(vocab), toks.shape[1] - 1
    full = corpus_statistics(toks, V)
    out: dict = {
        "eta": eta,
        "steps": steps,
        "validity_window_steps": validity_window(T, 3, eta, V).s_max,
        "sampling": {},
        "precision": {},
        "exact": {},
    }
    first = {}
    for B in batches:
        idx = torch.randperm(toks.shape[0], generator=torch.Generator().manual_seed(42))[:B].numpy()
        first[B] = (idx, corpus_statistics(toks[idx], V))
        out["sampling"][B] = {
            k: cosine(getattr(first[B][1], k), getattr(full, k))
            for k in ("bigram", "value_target", "query_key", "positional")
        }
    B = min(batches)
    idx, st = first[B]
    weights = {}
    for dtype in ("float32", "float64"):
        tr = _Track({"first_batch": st, "all_windows": full})
        t0 = time.perf_counter()
        train_assoc(
            toks, V, AssocTrainConfig(lr=eta, steps=steps, batch_size=B, dtype=dtype, stats_source="none"), [tr]
        )
        out["precision"][dtype] = {"batch": B, "seconds": time.perf_counter() - t0, "per_step": tr.rec}
        weights[dtype] = tr.weights
    out["precision"]["max_rel_weight_diff_f32_vs_f64"] = max(
        float((weights["float32"][k] - weights["float64"][k]).norm() / weights["float64"][k].norm())
        for k in weights["float64"]
        if weights["float64"][k].norm() > 0
    )
    tr = _Track({"first_batch": st})
    train_assoc(
        toks[idx], V, AssocTrainConfig(lr=eta, steps=steps, batch_size=None, dtype="float64", stats_source="none"), [tr]
    )
    out["exact"] = {"windows": len(idx), "per_step": tr.rec["first_batch"]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/reproduce_leading_terms")
    ap.add_argument("--paper-scale", action="store_true", help="the exact paper settings (see above)")
    ap.add_argument("--data", help="text source (default: the TinyStories files under the data root)")
    ap.add_argument("--vocab-size", type=int)
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--epochs", type=int, help="epochs per run (default 100, as the paper)")
    ap.add_argument("--runs", help="runs as ETA:EPOCHS,... (default 0.005:E,0.05:E with E = --epochs)")
    ap.add_argument(
        "--train-windows",
        type=int,
        help="training windows (CPU default: the largest multiple of the batch leaving ≥ 512 held out; paper: all)",
    )
    ap.add_argument(
        "--checkpoint-every",
        type=int,
        help="checkpoint every N steps instead of every two epochs (long runs at small batch)",
    )
    ap.add_argument(
        "--early-steps", type=int, help="also checkpoint every step up to this one (CPU default: two epochs; paper 0)"
    )
    ap.add_argument("--eval-windows", type=int, help="intervention windows (CPU default 2048, paper 0 = all)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--device", help="cpu, cuda, cuda:N or auto (default: cpu; auto with --paper-scale)")
    ap.add_argument("--null-corpus", default="storyworld")
    ap.add_argument("--threads", type=int)
    ap.add_argument(
        "--diagnose",
        type=int,
        default=0,
        metavar="STEPS",
        help="also run the cheap diagnosis of the η = 0.005 cosines for STEPS steps (see diagnose())",
    )
    ap.add_argument("--render-only", action="store_true", help="re-render OUT/summary.md from OUT/summary.json")
    ap.add_argument(
        "--skip-train", action="store_true", help="reuse finished runs in OUT (only re-run the reports and the summary)"
    )
    args = ap.parse_args(argv)

    if args.render_only:
        summary = json.loads((Path(args.out) / "summary.json").read_text())
        (Path(args.out) / "summary.md").write_text(render(summary))
        print(render(summary))
        return 0
    from originlens.paths import tinystories_files

    paper = args.paper_scale
    V = args.vocab_size or (3000 if paper else 1000)
    T = args.seq_len or (200 if paper else 64)
    B = args.batch_size or 2048
    E = args.epochs or 100
    eval_windows = args.eval_windows if args.eval_windows is not None else (0 if paper else 2048)
    device = args.device or ("auto" if paper else "cpu")
    from originlens.devices import resolve_device

    resolve_device(device)  # a missing GPU is one line now, not after the corpus is built
    try:
        specs = (
            [(float(a), int(b)) for a, b in (r.split(":") for r in args.runs.split(",") if r.strip())]
            if args.runs
            else [(0.005, E), (0.05, E)]
        )
    except ValueError:
        print(f"--runs must look like 0.005:2,0.05:2 (got {args.runs!r})", file=sys.stderr)
        return 2
    sources = [args.data] if args.data else [str(p) for p in tinystories_files()]
    if not sources:
        print("no TinyStories files under the data root; pass --data", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log: list[str] = []
    if args.threads:
        import torch

        torch.set_num_threads(int(args.threads))
    from originlens.data.build import build_corpus
    from originlens.errors import OriginlensError
    from originlens.experiments.leading_analysis import AnalysisConfig
    from originlens.experiments.leading_run import (
        LeadingReportConfig,
        LeadingRunConfig,
        report_leading_run,
        train_leading_run,
    )
    from originlens.train import AssocTrainConfig

    corpus = out / "corpus"
    oov = "drop" if paper else "unk"
    max_windows = 65536 + 2048 if paper else None  # paper: 65,536 training windows + 2,048 held out
    build_cmd = (
        f"originlens corpus build {' '.join(shlex.quote(s) for s in sources)} --vocab-size {V} --seq-len {T} "
        f"--windows first --oov {oov}" + (f" --max-windows {max_windows}" if max_windows else "") + f" --out {corpus}"
    )
    old = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    if args.skip_train and (corpus / "manifest.json").is_file():
        t_build = old.get("corpus_seconds")
    else:
        try:
            _, t_build = step(
                build_cmd,
                log,
                build_corpus,
                sources,
                corpus,
                vocab_size=V,
                seq_len=T,
                windows="first",
                oov=oov,
                max_windows=max_windows,
                overwrite=True,
            )
        except OriginlensError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    manifest = json.loads((corpus / "manifest.json").read_text())
    total = int(manifest["shape"][0])
    if args.train_windows:
        N = min(int(args.train_windows), total - 1)
    elif paper:
        N = min(65536, total - 1) if total > 2048 else total - 1
    else:
        N = max(B, ((total - 512) // B) * B) if total - 512 >= B else total - 1
    holdout = total - N
    if paper and N < 65536:
        print(
            f"warning: only {N} windows (the paper uses 65,536); pass the full TinyStories train split with --data",
            file=sys.stderr,
        )
    spe = -(-N // B)
    early = args.early_steps if args.early_steps is not None else (0 if paper else 2 * spe)
    runs = [(f"eta={e:g}-ep{ep}", e, ep) for e, ep in specs]
    summary = {
        "scale": "paper" if paper else "cpu",
        "vocab_size": manifest["vocab_size"],
        "seq_len": T,
        "train_windows": N,
        "holdout": holdout,
        "batch_size": B,
        "steps_per_epoch": spe,
        "dtype": args.dtype,
        "device": device,
        "early_steps": early,
        "corpus_seconds": t_build,
        "logging": f"every {args.checkpoint_every} steps" if args.checkpoint_every else "every 2 epochs",
        "runs": {},
    }
    for label, eta, ep in runs:
        rdir = out / label
        ckpt = (
            dict(checkpoint_every=int(args.checkpoint_every))
            if args.checkpoint_every
            else dict(checkpoint_every_epochs=2.0)
        )
        tcfg = AssocTrainConfig(
            n_layers=3,
            lr=eta,
            epochs=ep,
            batch_size=B,
            dtype=args.dtype,
            device=device,
            checkpoint_at=tuple(range(1, early + 1)),
            out=str(rdir),
            **ckpt,  # type: ignore[arg-type]
        )
        train_cmd = (
            f"originlens assoc train {corpus} --n-layers 3 --lr {eta:.6g} --epochs {ep} --batch-size {B} "
            f"--stats first-batch --holdout {holdout} --dtype {args.dtype} --device {device} --out {rdir} "
            + (
                f"--checkpoint-every {args.checkpoint_every}"
                if args.checkpoint_every
                else "--checkpoint-every-epochs 2"
            )
            + (f" --checkpoint-at 1-{early}" if early else "")
        )
        if args.skip_train and (rdir / "model.safetensors").is_file():
            t_train = old.get("runs", {}).get(label, {}).get("train_seconds")
            log.append("(reused) " + train_cmd)
        else:
            cfg = LeadingRunConfig(source=str(corpus), holdout=holdout, stats="first-batch", train=tcfg)
            try:
                _, t_train = step(train_cmd, log, train_leading_run, cfg, rdir, overwrite=True)
            except OriginlensError as e:
                summary["runs"][label] = {"eta": eta, "error": f"train failed: {e}"}
                continue
        rep = LeadingReportConfig(
            analysis=AnalysisConfig(eval_windows=eval_windows, device=device), null_corpus=args.null_corpus
        )
        rep_cmd = (
            f"originlens assoc report {rdir} --null-corpus {args.null_corpus} --eval-windows {eval_windows} "
            f"--device {device}"
        )
        try:
            (res, _), t_rep = step(rep_cmd, log, report_leading_run, rdir, rep)
        except OriginlensError as e:
            print(f"error: {e}", file=sys.stderr)
            res, t_rep = {}, None
        recs = res.get("checkpoints", [])
        lc = [r for r in res.get("loss_curve", []) if r[2] is not None]
        summary["runs"][label] = {
            "eta": eta,
            "epochs": ep,
            "steps": ep * spe,
            "t": eta * ep * spe,
            "train_seconds": t_train,
            "seconds_per_step": (t_train / (ep * spe)) if t_train else None,
            "report_seconds": t_rep,
            "loss_first": lc[0][2] if lc else None,
            "loss_last": lc[-1][2] if lc else None,
            "min_cos_paper_logging": min_cosines(recs, every=args.checkpoint_every or 2 * spe),
            "min_cos_paper_logging_full_train": min_cosines(
                recs, every=args.checkpoint_every or 2 * spe, other="full_train"
            ),
            "min_cos_all": min_cosines(recs),
            "min_cos_all_full_train": min_cosines(recs, other="full_train"),
            "first_steps": [
                {
                    "step": r["step"],
                    "min_cos": r["min_cos"],
                    "min_cos_full_train": (r.get("min_cos_vs") or {}).get("full_train"),
                }
                for r in recs
                if r["step"] <= max(early, 6)
            ],
            "final_theory": res.get("final", {}).get("theory"),
            "intervention": res.get("intervention"),
            "heldout": res.get("heldout"),
            "baselines": res.get("baselines", {}).get("per_weight"),
            "validity_window": res.get("validity_window"),
        }
    if args.diagnose:
        t0 = time.perf_counter()
        summary["diagnosis"] = diagnose(corpus, N, 0.005, args.diagnose, (512, B) if B > 512 else (B,))
        summary["diagnosis"]["seconds"] = time.perf_counter() - t0
    elif "diagnosis" in old:
        summary["diagnosis"] = old["diagnosis"]
    summary["commands"] = log
    (out / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    md = render(summary)
    (out / "summary.md").write_text(md)
    print(md)
    return 0


def _f(v, nd=4) -> str:
    return "—" if v is None else f"{v:.{nd}f}"


def render(s: dict) -> str:
    lines = [
        f"# Leading terms on TinyStories ({s['scale']} scale)",
        "",
        f"|V| = {s['vocab_size']}, T = {s['seq_len']}, L = 3, {s['train_windows']} training windows "
        f"({s['holdout']} held out), SGD batch {s['batch_size']} ({s['steps_per_epoch']} steps per epoch), "
        f"zero init, {s['dtype']}, device {s['device']}, statistics from the first shuffled batch.",
        "",
        "## Minimum cosine over training (Table 1)",
        "",
        "Paper logging = checkpoints every two epochs (the paper's); all = also every step of the first "
        f"{s['early_steps']} steps. In brackets: against the leading terms of all training windows.",
        "",
        "| run | logged | W | V | W_O | P | loss first → last | s/step | train s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    p = PAPER["min_cos"][0.005]
    lines.append(
        f"| paper η=0.005, 3,200 steps (t=16) | every 2 epochs | {p['W']} | {p['V']} | {p['W_O']} | — | "
        "8.00 → (n/a) | — | — |"
    )
    lines.append("| paper η=0.05 (t=160) | every 2 epochs | ≥ 0.7 (Fig. 4) | ≥ 0.7 | ≥ 0.7 | — | 8.00 → 5.35 | — | — |")
    for label, r in s["runs"].items():
        if "error" in r:
            lines.append(f"| {label} | {r['error']} | | | | | | | {_f(r.get('train_seconds'), 0)} |")
            continue
        head = f"{label} (η={r['eta']:g}, {r['steps']} steps, t={r['t']:.3g})"
        for tag, m, mf in (
            (s.get("logging", "every 2 epochs"), r["min_cos_paper_logging"], r["min_cos_paper_logging_full_train"]),
            ("all", r["min_cos_all"], r["min_cos_all_full_train"]),
        ):
            cells = " | ".join(
                _f(m.get(k)) + (f" ({_f(mf.get(k))})" if mf and mf.get(k) is not None else "") for k in KINDS
            )
            loss = f"{_f(r['loss_first'])} → {_f(r['loss_last'])}" if tag == "all" else ""
            tail = f"{_f(r['seconds_per_step'], 2)} | {_f(r['train_seconds'], 0)}" if tag == "all" else " | "
            lines.append(f"| {head if tag != 'all' else ''} | {tag} | {cells} | {loss} | {tail} |")
    lines += [
        "",
        "## First steps (min cosine over layers; in brackets vs all training windows)",
        "",
        "| run | step | W | V | W_O | P |",
        "|---|---|---|---|---|---|",
    ]
    for label, r in s["runs"].items():
        for fs in r.get("first_steps", []):
            full = fs.get("min_cos_full_train") or {}
            lines.append(
                f"| {label} | {fs['step']} | "
                + " | ".join(
                    _f(fs["min_cos"].get(k)) + (f" ({_f(full.get(k))})" if full.get(k) is not None else "")
                    for k in KINDS
                )
                + " |"
            )
    names = ["original", "W.1", "W.2", "W.3", "V.1", "V.2", "V.3", "W_O", "P.1", "P.2", "P.3"]
    lines += [
        "",
        "## Causal intervention (Table 3): loss after removing the leading-term projection",
        "",
        "| run | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        "| paper η=0.05 | " + " | ".join(str(PAPER["table3"].get(n, "—")) for n in names) + " |",
    ]
    for label, r in s["runs"].items():
        it = r.get("intervention")
        if not it:
            continue
        d = [it["losses"].get(n, {}).get("delta") for n in names[1:]]
        lines.append(
            f"| {label} | {_f(it['original'], 4)} | " + " | ".join("—" if v is None else f"{v:+.1e}" for v in d) + " |"
        )
    lines.append("")
    lines.append("(Our rows: original loss, then the loss increase Δ after each removal.)")
    lines += [
        "",
        "## Held-out cross-entropy: trained model vs leading-term model (Eq. 12) and baselines",
        "",
        "| run | trained | LT Eq. 12 | LT full L-layer | bigram path | add-1 bigram | uniform |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, r in s["runs"].items():
        h = r.get("heldout")
        if h:
            lines.append(
                f"| {label} | "
                + " | ".join(
                    _f(h.get(k), 4)
                    for k in (
                        "trained",
                        "leading_term_eq12",
                        "leading_term_full",
                        "bigram_path",
                        "conditional_bigram",
                        "uniform",
                    )
                )
                + " |"
            )
    lines += [
        "",
        "## Null baselines (final weights, layer 1 and W_O)",
        "",
        "| run | weight | leading term | unrelated corpus (shared tokens; true on same tokens) | "
        "same corpus, disjoint windows | PMI | random |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, r in s["runs"].items():
        for n, b in (r.get("baselines") or {}).items():
            if n in ("W_O", "V.1", "W.1", "P.1"):
                lines.append(
                    f"| {label} | {n} | {_f(b.get('leading_term'))} | {_f(b.get('null_corpus'))} "
                    f"({_f(b.get('leading_term_shared'))}) | {_f(b.get('same_corpus'))} | "
                    f"{_f(b.get('pmi'))} | {_f(b.get('random'))} |"
                )
    d = s.get("diagnosis")
    if d:
        lines += [
            "",
            f"## Diagnosis at η = {d['eta']} (validity window: s ≤ {d['validity_window_steps']:.2f} steps)",
            "",
            "Cosine between first-batch leading terms (the targets) and those of all training windows:",
            "",
            "| batch | B̄ | Φ̄ᵀB̄ᵀ | Q̄ | Δ |",
            "|---|---|---|---|---|",
        ]
        for b, c in d["sampling"].items():
            lines.append(
                f"| {b} | {_f(c['bigram'])} | {_f(c['value_target'])} | {_f(c['query_key'])} | {_f(c['positional'])} |"
            )
        lines += [
            "",
            "Min cosine over layers per step (W / V / W_O): SGD against first-batch targets | against all "
            "windows; exact = full-batch GD in float64 on the first-batch windows (theorem's setting).",
            "",
            "| step | SGD float32 | SGD float64 | exact GD float64 | exact norm ratios |",
            "|---|---|---|---|---|",
        ]

        def trio(r):
            m = r["min_cos"]
            return " / ".join(_f(m.get(k), 5) for k in ("W", "V", "W_O"))

        p32, p64 = d["precision"]["float32"]["per_step"], d["precision"]["float64"]["per_step"]
        ex = d["exact"]["per_step"]
        for st in sorted(map(int, p32["first_batch"])):
            k = str(st) if str(st) in p32["first_batch"] else st
            nr = ex[k]["norm_ratio"] if k in ex else None
            lines.append(
                f"| {st} | {trio(p32['first_batch'][k])} \\| {trio(p32['all_windows'][k])} | "
                f"{trio(p64['first_batch'][k])} \\| {trio(p64['all_windows'][k])} | "
                f"{trio(ex[k]) if k in ex else '—'} | "
                f"{'—' if not nr else f'{nr[0]:.4f}–{nr[1]:.4f}'} |"
            )
        lines.append(
            f"\nfloat32 vs float64 weights after {d['steps']} steps: max relative difference "
            f"{d['precision']['max_rel_weight_diff_f32_vs_f64']:.1e}."
        )
    lines += ["", "## Commands", "", "```", *s["commands"], "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    from originlens.cli.main import run_script

    sys.exit(run_script(main, "reproduce_leading_terms.py"))
