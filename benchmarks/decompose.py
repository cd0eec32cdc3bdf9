"""All-sites pathway decomposition: ``decompose`` vs the brute-force per-site reference algorithm.

Same model, same batch, same run:

* ``ours``  — ``originlens.attribution.decompose(model, tokens, sites)`` (structured backward:
  one cached forward, adjoint recursions, rank-B weight gradients at each site's own block,
  dense batched backward over the causal prefix below it);
* ``ref45`` — the straightforward reference algorithm written out plainly below: per site one forward
  with sg(k, i), then three backward passes — ∇L^{sg} (= G_sh), ∇λ_i^{sg} and ∇λ_i (plain graph, kept
  from one ordinary forward) — G_dir = ∇λ_i − ∇λ_i^{sg}, G_pre = ∇L − G_sh − G_dir;
* ``train`` — one ordinary training step of the same model on the same batch: ``model.loss`` (the
  model's own kernel, SDPA) + ``backward`` + ``torch.optim.Adam.step``.

Model: Majority size (the hyper-parameter table of arXiv 2603.14087: 2 layers, d = 128, 4 heads,
vocabulary 5, T = 21), weights perturbed away from the initialisation; batch of random token ids
(default B = 256, the paper's Majority batch).
Sites: ``all`` = every residual layer k = 0..2 × position i = 0..20 (63 sites), and ``tracked`` = the
Majority task's tracked sites, layers 1–2 × positions 2–19 (36 sites).

Timing: CPU time (``time.process_time``) and wall time, min over ``--repeat`` runs, measured
interleaved (train, ours, ref45 in turn) so that a shared machine loads them alike.  Memory: peak
resident-set growth of one call, each method in a fresh worker process (peak RSS ``VmHWM``, reset just
before the call, minus the resident set then; Linux).  ``tracemalloc`` would not see torch's tensor memory.
Agreement: max |ours − ref45| over every site, component and parameter entry, asserted
≤ ``tol · max|∇L|`` (float32: 1e-4; ``--float64``: 1e-10).

Usage: ``.venv/bin/python benchmarks/decompose.py [--batch 256] [--threads 1] [--repeat 3] [--float64]
[--sites all|tracked|both]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch
from _emit import emit  # benchmarks/_emit.py (the script's own folder is on sys.path)

from originlens.attribution import COMPONENTS, decompose, stop_gradient
from originlens.models import GPT, GPTConfig
from originlens.models.gpt import position_losses

# ----------------------------------------------------------------------------------------------------
# the reference algorithm (per site: 1 forward + 3 backwards), plainly


def ref45(model: GPT, tokens: torch.Tensor, sites: list[tuple[int, int]]) -> dict:
    """Per site: 1 forward with sg(k, i) + 3 backwards (∇L^{sg}, ∇λ_i^{sg}, ∇λ_i)."""
    params = list(model.parameters())
    names = [n for n, _ in model.named_parameters()]
    lam = position_losses(model(tokens), tokens).sum(0)  # λ_t, t = 0..T−2 (plain graph)
    full = torch.autograd.grad(lam.sum(), params, retain_graph=True)
    out = {}
    for k, i in sites:
        with stop_gradient(model, layer=k, position=i):
            lam_sg = position_losses(model(tokens), tokens).sum(0)
        shared = torch.autograd.grad(lam_sg.sum(), params, retain_graph=True)
        if i < lam.shape[0]:
            lam_i_sg = torch.autograd.grad(lam_sg[i], params)
            lam_i = torch.autograd.grad(lam[i], params, retain_graph=True)
            direct = [a - b for a, b in zip(lam_i, lam_i_sg)]
        else:  # no loss at T−1
            direct = [torch.zeros_like(p) for p in params]
        pre = [f - s - d for f, s, d in zip(full, shared, direct)]
        out[(k, i)] = {
            "direct": dict(zip(names, direct)),
            "precached": dict(zip(names, pre)),
            "shared": dict(zip(names, shared)),
        }
    return out


# ----------------------------------------------------------------------------------------------------
# measurement helpers


def measure(fn, results: dict, name: str) -> object:
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    r = results.setdefault(name, {"cpu": float("inf"), "wall": float("inf")})
    r["cpu"], r["wall"] = min(r["cpu"], cpu), min(r["wall"], wall)
    return out


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """VmHWM: the peak resident set of this process image (ru_maxrss would include the parent's
    resident set at fork time: Linux keeps it across exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> None:
    try:  # Linux ≥ 4.0: reset VmHWM to the current RSS
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_memory(args: argparse.Namespace, method: str, which: str) -> float:
    """Peak RSS growth (MB) of one call of ``method`` in a fresh worker process."""
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        method,
        "--sites",
        which,
        "--batch",
        str(args.batch),
        "--threads",
        str(args.threads),
    ] + (["--float64"] if args.float64 else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mb"]


def max_abs_diff(ours: dict, ref: dict) -> float:
    worst = 0.0
    for site, comps in ref.items():
        for c in COMPONENTS:
            for n, t in comps[c].items():
                worst = max(worst, float((getattr(ours[site], c)[n] - t).abs().max()))
    return worst


# ----------------------------------------------------------------------------------------------------


def setup(args: argparse.Namespace):
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=5, seq_len=21, n_layer=2, d_model=128, n_head=4, dtype="float64" if args.float64 else "float32"
    )
    model = GPT(cfg)
    with torch.no_grad():  # away from init: all pathways non-trivial
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    tokens = torch.randint(0, cfg.vocab_size, (args.batch, cfg.seq_len))
    site_sets = {
        "all": [(k, i) for k in range(cfg.n_layer + 1) for i in range(cfg.seq_len)],
        "tracked": [(k, i) for k in (1, 2) for i in range(2, 20)],
    }
    opt = torch.optim.Adam(model.parameters(), lr=1e-12)  # tiny lr: the weights stay put

    def train_step() -> None:
        loss = model.loss(tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return cfg, model, tokens, site_sets, train_step


def worker(args: argparse.Namespace) -> None:
    cfg, model, tokens, site_sets, train_step = setup(args)
    sites = site_sets[args.sites]
    fn = {
        "train": train_step,
        "ours": lambda: decompose(model, tokens, sites),
        "ref45": lambda: ref45(model, tokens, sites),
    }[args.worker]
    decompose(model, tokens, [(1, 3)]) if args.worker == "ours" else None  # imports, allocator warm-up
    reset_peak_rss()
    before = rss_bytes()
    fn()
    print(json.dumps({"peak_mb": max(0, peak_rss_bytes() - before) / 2**20}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3, help="timings: min over this many runs")
    ap.add_argument("--ref-repeat", type=int, default=1, help="runs of the slow reference loop")
    ap.add_argument("--float64", action="store_true")
    ap.add_argument("--sites", default="both", choices=["all", "tracked", "both"])
    ap.add_argument("--no-memory", dest="memory", action="store_false", help="skip the worker processes")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    cfg, model, tokens, site_sets, train_step = setup(args)
    wanted = ["all", "tracked"] if args.sites == "both" else [args.sites]
    print(
        f"model: L={cfg.n_layer} d={cfg.d_model} heads={cfg.n_head} T={cfg.seq_len} B={args.batch} "
        f"params={model.num_params():,} dtype={cfg.dtype} threads={args.threads} (torch {torch.__version__})"
    )
    train_step()
    decompose(model, tokens, [(1, 3)])  # warm-up
    tol = 1e-10 if args.float64 else 1e-4
    for which in wanted:
        sites = site_sets[which]
        res: dict = {}
        ours = ref = None
        for rep in range(max(args.repeat, args.ref_repeat)):
            if rep < args.repeat:
                measure(train_step, res, "train")
                ours = measure(lambda: decompose(model, tokens, sites), res, "ours")
            if rep < args.ref_repeat:
                ref = measure(lambda: ref45(model, tokens, sites), res, "ref45")
        g_max = max(float(t.abs().max()) for t in ours[sites[0]].full.values())
        diff = max_abs_diff(ours, ref)
        t, o, r = res["train"], res["ours"], res["ref45"]
        mem = {name: peak_memory(args, name, which) if args.memory else float("nan") for name in res}
        print(f"\nsites={which} ({len(sites)} sites)")
        print(f"  {'':34s} {'CPU s':>8s} {'wall s':>8s} {'peak RSS +MB':>13s}")
        for name, label in (
            ("train", "one training step (fwd+bwd+Adam)"),
            ("ours", "decompose (ours)"),
            ("ref45", "reference loop (1 fwd + 3 bwd/site)"),
        ):
            v = res[name]
            print(f"  {label:34s} {v['cpu']:8.3f} {v['wall']:8.3f} {mem[name]:13.1f}")
        print(
            f"  ref45 / ours = {r['cpu'] / o['cpu']:.1f}× (CPU), {r['wall'] / o['wall']:.1f}× (wall)   [target ≥ 10×]"
        )
        print(f"  ours / train = {o['cpu'] / t['cpu']:.2f}× (CPU), {o['wall'] / t['wall']:.2f}× (wall)   [target ≤ 6×]")
        print(f"  max |ours − ref45| = {diff:.2e}  (max |∇L| = {g_max:.2e}; asserted ≤ {tol:g}·max|∇L|)")
        assert diff <= tol * g_max, f"decomposition disagrees with the reference loop: {diff} > {tol * g_max}"
        emit(f"decompose.{which}.ref45_over_ours", r["cpu"] / o["cpu"], cpu=True, goal=30)
        # a training step over the decomposition (higher is better; the goal is decomposition ≤ 3 steps)
        emit(f"decompose.{which}.train_over_ours", t["cpu"] / o["cpu"], cpu=True, goal=1 / 3)


if __name__ == "__main__":
    main()
