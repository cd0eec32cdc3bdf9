"""Reproduce the TinyStories experiments of arXiv 2601.19208 §5 (spec leading-terms.md §5.1) with the CLI.

    .venv/bin/python examples/reproduce_leading_terms.py --out runs/repro            # CPU scale (default)
    .venv/bin/python examples/reproduce_leading_terms.py --out runs/paper --paper-scale --data /path/to/TinyStories

Steps (each is an ``originlens`` command, printed and recorded in ``OUT/summary.md``):

1. ``corpus build``: word tokenizer (paper §5.1.1), first T+1 tokens of every story;
2. for every run, ``assoc train`` (3 layers, zero init, plain SGD, statistics from the first shuffled batch)
   and ``assoc report`` (tracking, null baselines, causal intervention, leading-term model);
3. ``OUT/summary.md`` / ``summary.json``: our numbers next to the paper's, with wall times.

Scales:

* **CPU (default)**: the shared TinyStories subset (7,089 stories) with |V| = 1,000, T = 64,
  ``oov="unk"`` (with the paper's ``drop`` almost nothing survives on the subset), L = 3, batch 512, the last
  ``--holdout`` windows held out, η = 0.005 and η = 0.05 for 2 epochs each (``--runs``).  One SGD step of
  this model costs ≈ 8–18 s on the shared two-core machine, so a run covers 26 steps, i.e. gradient-flow
  time t = s·η ≤ 1.3, far short of the paper's 3,200 steps (t = 16 and t = 160).
* **longer horizon, smaller model** (measured, not the default): ``--vocab-size 300 --seq-len 32 --runs
  0.5:12,0.15:40 --checkpoint-every 4`` reaches t = 78 in 156 / 520 steps (≈ 0.5 s/step on an idle machine).
  The two runs agree as functions of t (cosines within ≈ 0.02–0.06), so η ≤ 0.5 is still gradient-flow-like
  here; larger η does not emulate the paper: η = 12.3, 6.2, 3.1 diverged (non-finite at t ≈ 86, 55, 43) and
  η = 1.54 oscillated (edge of stability).  Extra runs: ``--runs ETA:EPOCHS,...``.
* **paper (``--paper-scale``)**: |V| = 3,000, T = 200, ``oov="drop"``, 65,536 windows, 100 epochs of batch
  2,048 (3,200 steps), checkpoints every 2 epochs, η = 0.005 and 0.05, intervention on the full training
  set.  Needs the full TinyStories train split (``--data``) and a large machine (GPU-class; the trainer
  runs on CPU torch here, expect hours).

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

PAPER = {"min_cos": {0.005: {"W": 0.999496, "V": 0.999169, "W_O": 0.998486}},
         "table3": {"original": 5.349, "W.1": 5.350, "W.2": 5.352, "W.3": 5.361, "V.1": 6.192, "V.2": 6.526,
                    "V.3": 6.520, "W_O": 8.287},
         "loss_eta_0.05": (8.00, 5.35)}


def cli(argv: list[str], log: list[str]) -> tuple[int, float]:
    """Run one ``originlens`` command in-process; returns (exit status, seconds)."""
    from originlens.cli.main import main
    cmd = "originlens " + " ".join(shlex.quote(a) for a in argv)
    print(f"$ {cmd}", flush=True)
    log.append(cmd)
    t0 = time.perf_counter()
    rc = main(argv)
    return rc, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/reproduce_leading_terms")
    ap.add_argument("--paper-scale", action="store_true", help="the exact paper settings (see above)")
    ap.add_argument("--data", help="text source (default: the TinyStories files under the data root)")
    ap.add_argument("--vocab-size", type=int)
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--epochs", type=int, help="epochs per run (CPU default 2, paper 100)")
    ap.add_argument("--runs", help="runs as ETA:EPOCHS,... (default 0.005:E,0.05:E with E = --epochs)")
    ap.add_argument("--holdout", type=int, help="held-out windows (CPU default 512, paper 0)")
    ap.add_argument("--checkpoint-every", type=int, default=2, help="checkpoint every N steps (CPU scale)")
    ap.add_argument("--eval-windows", type=int, help="intervention windows (CPU default 2048, paper 0 = all)")
    ap.add_argument("--null-corpus", default="storyworld")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--skip-train", action="store_true",
                    help="reuse finished runs in OUT (only re-run the reports and the summary)")
    args = ap.parse_args(argv)

    from originlens.paths import tinystories_files
    paper = args.paper_scale
    V = args.vocab_size or (3000 if paper else 1000)
    T = args.seq_len or (200 if paper else 64)
    B = args.batch_size or (2048 if paper else 512)
    E = args.epochs or (100 if paper else 2)
    holdout = args.holdout if args.holdout is not None else (0 if paper else 512)
    eval_windows = args.eval_windows if args.eval_windows is not None else (0 if paper else 2048)
    try:
        specs = [(float(a), int(b)) for a, b in (r.split(":") for r in args.runs.split(",") if r.strip())] \
            if args.runs else [(0.005, E), (0.05, E)]
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
    thr = ["--threads", str(args.threads)] if args.threads else []

    corpus = out / "corpus"
    build = ["corpus", "build", *sources, "--vocab-size", str(V), "--seq-len", str(T), "--windows", "first",
             "--oov", "drop" if paper else "unk", "--out", str(corpus), "--overwrite"]
    if paper:
        build += ["--max-windows", "65536"]
    old = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    if args.skip_train and (corpus / "manifest.json").is_file():
        t_build = old.get("corpus_seconds")
    else:
        rc, t_build = cli(build, log)
        if rc:
            return rc
    manifest = json.loads((corpus / "manifest.json").read_text())
    N = int(manifest["shape"][0]) - holdout
    if paper and N < 65536:
        print(f"warning: only {N} windows (the paper uses 65,536); pass the full TinyStories train split "
              "with --data", file=sys.stderr)
    spe = -(-N // B)
    runs = [(f"eta={e:g}-ep{ep}", e, ep, f"η = {e:g}, {ep} epochs = {ep * spe} steps, t = sη = {e * ep * spe:g}")
            for e, ep in specs]
    summary = {"scale": "paper" if paper else "cpu", "vocab_size": manifest["vocab_size"], "seq_len": T,
               "train_windows": N, "holdout": holdout, "batch_size": B, "steps_per_epoch": spe,
               "corpus_seconds": t_build, "runs": {}}
    for label, eta, ep, desc in runs:
        rdir = out / label
        train = ["assoc", "train", str(corpus), "--layers", "3", "--lr", f"{eta:.6g}", "--epochs", str(ep),
                 "--batch-size", str(B), "--stats", "first-batch", "--holdout", str(holdout), "--out", str(rdir),
                 "--overwrite", *thr]
        train += (["--checkpoint-every-epochs", "2"] if paper else ["--checkpoint-every", str(args.checkpoint_every)])
        if args.skip_train and (rdir / "model.safetensors").is_file():
            rc, t_train = 0, old.get("runs", {}).get(label, {}).get("train_seconds")
            log.append("(reused) originlens " + " ".join(shlex.quote(a) for a in train))
        else:
            rc, t_train = cli(train, log)
        if rc:
            summary["runs"][label] = {"eta": eta, "description": desc, "error": f"train exited {rc}",
                                      "train_seconds": t_train}
            continue
        rep = ["assoc", "report", str(rdir), "--null-corpus", args.null_corpus, "--eval-windows", str(eval_windows),
               *thr]
        rc, t_rep = cli(rep, log)
        res = json.loads((rdir / "report.json").read_text()) if rc == 0 else {}
        lc = [r for r in res.get("loss_curve", []) if r[2] is not None]
        summary["runs"][label] = {
            "eta": eta, "description": desc, "epochs": ep, "steps": ep * spe, "t": eta * ep * spe, "train_seconds": t_train, "report_seconds": t_rep,
            "loss_first": lc[0][2] if lc else None, "loss_last": lc[-1][2] if lc else None,
            "min_cos": res.get("min_cosine_over_training"),
            "min_cos_full_train": res.get("min_cosine_over_training_full_train"), "final_theory": res.get("final", {}).get("theory"),
            "intervention": res.get("intervention"), "heldout": res.get("heldout"),
            "baselines": res.get("baselines", {}).get("per_weight")}
    summary["commands"] = log
    (out / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    md = render(summary)
    (out / "summary.md").write_text(md)
    print(md)
    return 0


def _f(v, nd=4) -> str:
    return "—" if v is None else f"{v:.{nd}f}"


def render(s: dict) -> str:
    lines = [f"# Leading terms on TinyStories ({s['scale']} scale)", "",
             f"|V| = {s['vocab_size']}, T = {s['seq_len']}, L = 3, {s['train_windows']} training windows "
             f"({s['holdout']} held out), SGD batch {s['batch_size']} ({s['steps_per_epoch']} steps per epoch), "
             "zero init, statistics from the first shuffled batch.", "",
             "## Minimum cosine over training (Table 1)", "",
             "Targets from the first shuffled batch (paper protocol); in brackets: targets from all training "
             "windows.", "",
             "| run | W | V | W_O | P | loss first → last (ln|V| = "
             f"{math.log(s['vocab_size']):.3f}) | train s | report s |", "|---|---|---|---|---|---|---|---|"]
    p = PAPER["min_cos"][0.005]
    lines.append(f"| paper η=0.005 (t=16) | {p['W']} | {p['V']} | {p['W_O']} | — | 8.00 → (n/a) | — | — |")
    lines.append("| paper η=0.05 (t=160) | ≥ 0.7 (Fig. 4) | ≥ 0.7 | ≥ 0.7 | — | 8.00 → 5.35 | — | — |")
    for label, r in s["runs"].items():
        if "error" in r:
            lines.append(f"| {label} | {r['error']} | | | | | {r['train_seconds']:.0f} | |")
            continue
        m, mf = r["min_cos"] or {}, r.get("min_cos_full_train") or {}
        cell = lambda k: _f(m.get(k)) + (f" ({_f(mf.get(k))})" if mf else "")
        lines.append(f"| {label} (η={r['eta']:.4g}, {r['steps']} steps, t={r['t']:.3g}) | {cell('W')} | "
                     f"{cell('V')} | {cell('W_O')} | {cell('P')} | {_f(r['loss_first'])} → {_f(r['loss_last'])} | "
                     f"{_f(r['train_seconds'], 0)} | {_f(r['report_seconds'], 0)} |")
    names = ["original", "W.1", "W.2", "W.3", "V.1", "V.2", "V.3", "W_O", "P.1", "P.2", "P.3"]
    lines += ["", "## Causal intervention (Table 3): loss after removing the leading-term projection", "",
              "| run | " + " | ".join(names) + " |", "|---|" + "---|" * len(names),
              "| paper η=0.05 | " + " | ".join(str(PAPER["table3"].get(n, "—")) for n in names) + " |"]
    for label, r in s["runs"].items():
        it = r.get("intervention")
        if not it:
            continue
        vals = [it["original"]] + [it["losses"].get(n, {}).get("loss") for n in names[1:]]
        lines.append(f"| {label} | " + " | ".join(_f(v, 6) for v in vals) + " |")
    lines += ["", "## Held-out cross-entropy: trained model vs leading-term model (Eq. 12) and baselines", "",
              "| run | trained | LT Eq. 12 | LT full L-layer | bigram path | add-1 bigram | uniform |",
              "|---|---|---|---|---|---|---|"]
    for label, r in s["runs"].items():
        h = r.get("heldout")
        if h:
            lines.append(f"| {label} | " + " | ".join(_f(h.get(k), 6) for k in (
                "trained", "leading_term_eq12", "leading_term_full", "bigram_path", "conditional_bigram",
                "uniform")) + " |")
    lines += ["", "## Null baselines (final weights, layer 1 and W_O)", "",
              "| run | weight | leading term | unrelated corpus (shared tokens; true on same tokens) | "
              "same corpus, disjoint windows | PMI | random |", "|---|---|---|---|---|---|---|"]
    for label, r in s["runs"].items():
        for n, b in (r.get("baselines") or {}).items():
            if n in ("W_O", "V.1", "W.1", "P.1"):
                lines.append(f"| {label} | {n} | {_f(b.get('leading_term'))} | {_f(b.get('null_corpus'))} "
                             f"({_f(b.get('leading_term_shared'))}) | {_f(b.get('same_corpus'))} | "
                             f"{_f(b.get('pmi'))} | {_f(b.get('random'))} |")
    lines += ["", "## Commands", "", "```", *s["commands"], "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
