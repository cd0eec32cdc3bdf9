"""Q(w) on a Hugging Face model: its key/value-cache ablation vs the prefix re-run it replaced, and the HF
model vs the native model on identical weights, CPU.

Model: ``stories260K`` (llama2.c, d = 64, 5 layers, TinyStories windows of ``--window`` tokens) and its
export to a Hugging Face ``LlamaForCausalLM`` (:func:`originlens.lm.export.export_to_hf`; the same
weights).  SAE: a random standard SAE with ``--d-sae`` latents on ``resid.3``.  Contexts: ``--features`` ×
``--contexts`` top-activating contexts found once on the HF model and shared by the three ablation runs:

* ``hf cached``  — :func:`originlens.lm.qscore.ablation_kl` with ``method="cached"`` on the HF adapter:
  one clean run per window through the model's own cache (``past_key_values``), each ablated copy only
  its K positions over the cached past (:meth:`HFAdapter.run_positions_from`);
* ``hf hooks``   — ``method="hooks"`` on the HF adapter: every ablated copy re-runs its whole prefix
  through every block (what the HF path did before);
* ``native``     — ``method="cached"`` on the llama2.c adapter (our own block code).

Prints seconds (minimum over ``--repeat`` interleaved repetitions), features/second, the ratios in wall
and process CPU time, and the largest KL disagreement between the three.  Usage:
``.venv/bin/python benchmarks/qscore_hf.py [--features 64] [--contexts 8] [--window 64] [--repeat 3]
[--threads 1]``.  Caveat: shared 2-core CPU; single runs vary by ±30 %, hence the minimum.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from _emit import emit  # benchmarks/_emit.py (the script's own folder is on sys.path)
from qscore import build, random_sae  # the stories260K windows and the SAE of benchmarks/qscore.py

from originlens.lm.export import export_to_hf
from originlens.lm.hf import load_hf
from originlens.lm.qscore_ablation import ablation_kl
from originlens.lm.qscore_config import QScoreConfig
from originlens.lm.qscore_contexts import find_top_contexts
from originlens.sae.activations import as_sequences


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--contexts", type=int, default=8)
    ap.add_argument("--d-sae", type=int, default=256)
    ap.add_argument("--windows", type=int, default=400)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3, help="timed repetitions (minimum reported)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    native, toks = build("stories260K", a.windows, a.window)
    with tempfile.TemporaryDirectory() as tmp:
        export_to_hf(native.module, f"{tmp}/hf")
        hf = load_hf(f"{tmp}/hf")
    k = 3
    sae = random_sae(native.d_model, a.d_sae, f"blocks.{k - 1}.hook_resid_post")
    cfg = QScoreConfig(n_contexts=a.contexts, max_offset=10)
    seqs = as_sequences(toks, hf, prepend_bos=True)
    feats = list(range(a.features))
    with torch.no_grad():
        ex = find_top_contexts(hf, sae, k, seqs, feats, cfg)
        torch.testing.assert_close(hf.run(seqs[:4]), native.run(seqs[:4]), rtol=1e-4, atol=1e-4)
    runs = {
        "hf cached": lambda: ablation_kl(hf, sae, k, seqs, ex, cfg, method="cached"),
        "hf hooks": lambda: ablation_kl(hf, sae, k, seqs, ex, cfg, method="hooks"),
        "native": lambda: ablation_kl(native, sae, k, seqs, ex, cfg, method="cached"),
    }
    wall: dict[str, list[float]] = {n: [] for n in runs}
    cpu: dict[str, list[float]] = {n: [] for n in runs}
    kl = {}
    for _ in range(a.repeat):
        for name, fn in runs.items():
            w0, c0 = time.perf_counter(), time.process_time()
            kl[name] = fn()[0]
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
    n_feat = len(set(ex.feature.tolist()))
    print(f"stories260K, {len(ex)} examples of {n_feat} features, K = 10, site resid.{k}, {a.threads} thread(s)")
    for name in runs:
        print(
            f"  {name:10s} {min(wall[name]):7.3f} s wall, {min(cpu[name]):7.3f} s CPU, "
            f"{n_feat / min(wall[name]):7.1f} features/s"
        )
    ratio = {
        "hooks_over_cached": (
            min(cpu["hf hooks"]) / min(cpu["hf cached"]),
            min(wall["hf hooks"]) / min(wall["hf cached"]),
        ),
        "hf_over_native": (min(cpu["hf cached"]) / min(cpu["native"]), min(wall["hf cached"]) / min(wall["native"])),
    }
    print(
        f"  HF cache vs HF prefix re-run: {ratio['hooks_over_cached'][0]:.1f}x CPU ({ratio['hooks_over_cached'][1]:.1f}x wall)"
    )
    print(
        f"  HF cached / native cached:    {ratio['hf_over_native'][0]:.2f}x CPU ({ratio['hf_over_native'][1]:.2f}x wall)"
    )
    err = max(float(abs(kl["hf cached"] - kl[o]).max()) for o in ("hf hooks", "native"))
    print(f"  largest |KL difference| between the three: {err:.2e}")
    emit("qscore_hf.hooks_over_cached", ratio["hooks_over_cached"][0], cpu=True)


if __name__ == "__main__":
    main()
