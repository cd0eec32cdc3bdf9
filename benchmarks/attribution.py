"""Exact pathway decomposition: fast path (two backwards + batched VJPs) vs brute force (the stop-gradient
definition, and a per-site reference loop), same run, CPU.

For every site (k = 0..L, i = 0..T−1) of a Majority-sized GPT (2 layers, d = 128, 4 heads, T = 21,
batch 64 by default) on one random batch, times:

* ``fast``  — ``decompose(method="fast")``: 2 forwards, 2 full backwards, batched per-layer VJPs;
* ``brute`` — ``decompose(method="brute")``: the definition literally (one sg forward per site, one
  backward per loss position in each pass);
* ``ref45`` — the per-site reference loop written here (per site: sg forward, ∇L^{sg}, ∇λ_i and
  ∇λ_i^{sg}: 3 backwards; G_pre by difference), the cheapest straightforward implementation;

and prints the ratios plus the worst relative disagreement of the components (fast vs each; ref45's
G_pre is a difference of large vectors, so in float32 it carries cancellation error ~1e-7‖∇L‖).  Then,
on a few tracked Majority sites (layers 1–2, positions 2–19): influences by forward-mode JVP
(``influences``: 3 JVPs per site, written out by hand for this tied GPT) vs one explicit ∇R backward per
probe and type subset, and vs the generic ``torch.func.jvp`` path (``jvp="forward"``), for 3 probes per
site without types (Majority) and 16 probes × (all + 3 types) (Othello-like).

Usage: ``.venv/bin/python benchmarks/attribution.py [--batch 64] [--threads 1] [--brute-sites N]``
(``--brute-sites N`` times brute/ref45 on N evenly spread sites and extrapolates linearly; marked).
Caveat: shared 2-core CPU; expect ±15 % noise.  float32 agreement is ~1e-6, float64 (``--float64``) ~1e-14.
"""

from __future__ import annotations

import argparse
import time

import torch
from _emit import emit  # benchmarks/_emit.py (the script's own folder is on sys.path)

from originlens.attribution import (
    COMPONENTS,
    Probe,
    decompose,
    influences,
    reference_projections,
    sgd_steps,
    stop_gradient,
)
from originlens.models import GPT, GPTConfig
from originlens.models.gpt import position_losses


def flat(d) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in d.values()])


def ref45(model, tokens, sites):
    """Per-site brute-force reference loop (3 backwards per site), written out independently."""
    params = list(model.parameters())
    names = [n for n, _ in model.named_parameters()]
    lam = position_losses(model(tokens), tokens).sum(0)
    full = torch.autograd.grad(lam.sum(), params, retain_graph=True)
    lam_i = {i: torch.autograd.grad(lam[i], params, retain_graph=True) for i in range(lam.shape[0])}
    out = {}
    for k, i in sites:
        with stop_gradient(model, layer=k, position=i):
            lam_sg = position_losses(model(tokens), tokens).sum(0)
        sh = torch.autograd.grad(lam_sg.sum(), params, retain_graph=True)
        if i < lam.shape[0]:
            dir_sg = torch.autograd.grad(lam_sg[i], params)
            dr = [a - b for a, b in zip(lam_i[i], dir_sg)]
        else:
            dr = [torch.zeros_like(p) for p in params]
        pre = [f - s - d for f, s, d in zip(full, sh, dr)]
        out[(k, i)] = {
            "direct": dict(zip(names, dr)),
            "precached": dict(zip(names, pre)),
            "shared": dict(zip(names, sh)),
        }
    return out


def worst_rel(fast, other, scale: float) -> str:
    """Worst ‖x − y‖/‖y‖ over sites and components (‖y‖ floored at 1e-6‖∇L‖), and worst ‖x − y‖/‖∇L‖."""
    w, w_full = 0.0, 0.0
    for s, comps in other.items():
        for c in COMPONENTS:
            y = flat(comps[c] if isinstance(comps, dict) else getattr(comps, c))
            x = flat(getattr(fast[s], c))
            w = max(w, float((x - y).norm()) / max(float(y.norm()), 1e-6 * scale))
            w_full = max(w_full, float((x - y).norm()) / scale)
    return f"{w:.1e} (per component), {w_full:.1e} (of ‖∇L‖)"


def timed(fn):
    """``(fn(), CPU seconds of this process)``: CPU time, less sensitive to other processes than wall time."""
    t = time.process_time()
    out = fn()
    return out, time.process_time() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--brute-sites", type=int, default=0, help="0 = all sites")
    ap.add_argument("--float64", action="store_true")
    ap.add_argument("--chunk-size", type=int, default=None, help="default: auto")
    ap.add_argument("--influence-sites", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=5, seq_len=21, n_layer=2, d_model=128, n_head=4, dtype="float64" if args.float64 else "float32"
    )
    model = GPT(cfg)
    with torch.no_grad():  # away from init: all pathways non-trivial
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    tokens = torch.randint(0, 5, (args.batch, cfg.seq_len))
    sites = [(k, i) for k in range(cfg.n_layer + 1) for i in range(cfg.seq_len)]
    print(
        f"model: L={cfg.n_layer} d={cfg.d_model} heads={cfg.n_head} T={cfg.seq_len} B={args.batch} "
        f"params={model.num_params():,} dtype={cfg.dtype} threads={args.threads}; sites={len(sites)}"
    )

    decompose(model, tokens, [(1, 3)])  # warm-up
    fast, t_fast = timed(lambda: decompose(model, tokens, "all", chunk_size=args.chunk_size))
    scale = float(flat(fast[(0, 0)].full).norm())
    sub = sites if args.brute_sites <= 0 else sites[:: max(1, len(sites) // args.brute_sites)][: args.brute_sites]
    factor = len(sites) / len(sub)
    note = "" if factor == 1 else f" (measured on {len(sub)} sites, ×{factor:.2f} extrapolated)"
    brute, t_brute = timed(lambda: decompose(model, tokens, sub, method="brute"))
    ref, t_ref = timed(lambda: ref45(model, tokens, sub))
    t_brute *= factor
    t_ref *= factor
    print("CPU seconds of this process:")
    print(f"fast  (2 backwards + batched VJPs):        {t_fast:8.2f} s")
    print(
        f"brute (stop-gradient definition):         {t_brute:8.2f} s{note}  ratio brute/fast = {t_brute / t_fast:6.1f}×"
    )
    print(f"ref45 (per-site loop, 3 backwards/site):  {t_ref:8.2f} s{note}  ratio ref45/fast = {t_ref / t_fast:6.1f}×")
    print(
        f"worst relative difference: fast vs brute {worst_rel(fast, brute, scale)}; "
        f"fast vs ref45 {worst_rel(fast, ref, scale)}"
    )
    emit("attribution.ref45_over_fast", t_ref / t_fast, cpu=True, goal=30)

    for n_probes, n_types in ((3, 0), (16, 3)):
        bench_influences(model, tokens, fast, n_probes, n_types, args.influence_sites)


def bench_influences(model, tokens, fast, n_probes: int, n_types: int, n_sites: int) -> None:
    """JVP influences vs one explicit ∇R backward per probe and type subset, on ``n_sites`` sites."""
    cfg = model.config
    tracked = [(k, i) for k in (1, 2) for i in range(2, 20)]
    tracked = tracked[:: max(1, len(tracked) // n_sites)][:n_sites]
    gen = torch.Generator().manual_seed(1)
    probes = [
        Probe(f"f{j}@{k},{i}", k, i, torch.randn(cfg.d_model, generator=gen).to(cfg.torch_dtype))
        for k, i in tracked
        for j in range(n_probes)
    ]
    types = {p.name: torch.randint(0, n_types, (tokens.shape[0],), generator=gen) for p in probes} if n_types else None
    refs = reference_projections(GPT(cfg), tokens, probes)
    steps = sgd_steps({s: fast[s] for s in tracked}, lr=1e-3)
    influences(model, tokens, steps, probes[:1], refs, half=True)  # warm-up
    influences(model, tokens, steps, probes[:1], refs, half=True, jvp="forward")  # (forward-AD setup)
    recs, t_jvp = timed(lambda: influences(model, tokens, steps, probes, refs, types=types, half=True))
    recs_fwd, t_fwd = timed(
        lambda: influences(model, tokens, steps, probes, refs, types=types, half=True, jvp="forward")
    )

    def explicit():
        params = list(model.parameters())
        names = [n for n, _ in model.named_parameters()]
        out = {}
        _, res = model(tokens, return_residuals=True, myopic=False)  # one shared forward
        for p in probes:  # one ∇R backward per risk
            subsets = [(None, slice(None))] + [(t, types[p.name] == t) for t in range(n_types)]
            for tau, rows in subsets:
                diff = (res[p.layer][:, p.position] @ p.direction - refs[p.name])[rows]
                R = 0.5 * (diff**2).mean()
                g = dict(zip(names, torch.autograd.grad(R, params, retain_graph=True, allow_unused=True)))
                for c in COMPONENTS:
                    out[(p.name, tau, c)] = sum(
                        float((steps[p.site][c][n] * g[n]).sum()) for n in names if g[n] is not None
                    )
        return out

    want, t_exp = timed(explicit)
    got = {(r.probe, r.feature_type, r.component): r.value for r in recs if r.component != "full"}
    fwd = {(r.probe, r.feature_type, r.component): r.value for r in recs_fwd if r.component != "full"}
    err = max(abs(got[key] - v) / max(abs(v), 1e-12) for key, v in want.items())
    err_fwd = max(abs(got[key] - v) / max(abs(v), 1e-12) for key, v in fwd.items())
    print(
        f"influences, {len(tracked)} sites × {n_probes} probes × {1 + n_types} row subsets: "
        f"JVP {t_jvp:.2f} s vs explicit ∇R per risk {t_exp:.2f} s, ratio explicit/JVP = {t_exp / t_jvp:.1f}×; "
        f"worst relative difference {err:.1e}; torch.func JVP {t_fwd:.2f} s, ratio torch.func/JVP = "
        f"{t_fwd / t_jvp:.1f}× (worst relative difference {err_fwd:.1e})"
    )
    emit(f"attribution.influence_{n_probes}x{1 + n_types}.explicit_over_jvp", t_exp / t_jvp, cpu=True)
    emit(f"attribution.influence_{n_probes}x{1 + n_types}.torch_func_over_jvp", t_fwd / t_jvp, cpu=True)


if __name__ == "__main__":
    main()
