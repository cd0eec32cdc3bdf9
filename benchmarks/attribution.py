"""Exact pathway decomposition: fast path (spec §5) vs brute force (spec §2 / §4.5), same run, CPU.

For every site (k = 0..L, i = 0..T−1) of a Majority-sized GPT (2 layers, d = 128, 4 heads, T = 21,
batch 64 by default) on one random batch, times:

* ``fast``  — ``decompose(method="fast")``: 2 forwards, 2 full backwards, batched per-layer VJPs;
* ``brute`` — ``decompose(method="brute")``: the definition literally (one sg forward per site, one
  backward per loss position in each pass);
* ``ref45`` — the spec §4.5 reference loop written here (per site: sg forward, ∇L^{sg}, ∇λ_i and
  ∇λ_i^{sg}: 3 backwards; G_pre by difference), the cheapest straightforward implementation;

and prints the ratios plus the worst relative disagreement of the components (fast vs each).  Then, for
the tracked Majority sites (layers 1–2, positions 2–19) with 3 probes each: influences by forward-mode
JVP (``influences``) vs one explicit ∇R backward per probe and component dot products.

Usage: ``.venv/bin/python benchmarks/attribution.py [--batch 64] [--threads 1] [--brute-sites N]``
(``--brute-sites N`` times brute/ref45 on N evenly spread sites and extrapolates linearly; marked).
Caveat: shared 2-core CPU; expect ±15 % noise.  float32 agreement is ~1e-6, float64 (``--float64``) ~1e-14.
"""
from __future__ import annotations

import argparse
import time

import torch

from originlens.attribution import (COMPONENTS, Probe, decompose, influences, reference_projections,
                                    sgd_steps, stop_gradient)
from originlens.models import GPT, GPTConfig
from originlens.models.gpt import position_losses


def flat(d) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in d.values()])


def ref45(model, tokens, sites):
    """Spec §4.5 brute-force loop (3 backwards per site), written out independently."""
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
        out[(k, i)] = {"direct": dict(zip(names, dr)), "precached": dict(zip(names, pre)),
                       "shared": dict(zip(names, sh))}
    return out


def worst_rel(fast, other, scale: float) -> float:
    w = 0.0
    for s, comps in other.items():
        for c in COMPONENTS:
            y = flat(comps[c] if isinstance(comps, dict) else getattr(comps, c))
            x = flat(getattr(fast[s], c))
            w = max(w, float((x - y).norm()) / max(float(y.norm()), 1e-6 * scale))
    return w


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--brute-sites", type=int, default=0, help="0 = all sites")
    ap.add_argument("--float64", action="store_true")
    ap.add_argument("--chunk-size", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=5, seq_len=21, n_layer=2, d_model=128, n_head=4,
                    dtype="float64" if args.float64 else "float32")
    model = GPT(cfg)
    with torch.no_grad():                                # away from init: all pathways non-trivial
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    tokens = torch.randint(0, 5, (args.batch, cfg.seq_len))
    sites = [(k, i) for k in range(cfg.n_layer + 1) for i in range(cfg.seq_len)]
    print(f"model: L={cfg.n_layer} d={cfg.d_model} heads={cfg.n_head} T={cfg.seq_len} B={args.batch} "
          f"params={model.num_params():,} dtype={cfg.dtype} threads={args.threads}; sites={len(sites)}")

    decompose(model, tokens, [(1, 3)])                   # warm-up
    fast, t_fast = timed(lambda: decompose(model, tokens, "all", chunk_size=args.chunk_size))
    scale = float(flat(fast[(0, 0)].full).norm())
    sub = sites if args.brute_sites <= 0 else sites[::max(1, len(sites) // args.brute_sites)][:args.brute_sites]
    factor = len(sites) / len(sub)
    note = "" if factor == 1 else f" (measured on {len(sub)} sites, ×{factor:.2f} extrapolated)"
    brute, t_brute = timed(lambda: decompose(model, tokens, sub, method="brute"))
    ref, t_ref = timed(lambda: ref45(model, tokens, sub))
    t_brute *= factor
    t_ref *= factor
    print(f"fast  (spec §5, adjoints + batched VJPs): {t_fast:8.2f} s")
    print(f"brute (spec §2 definition, per position): {t_brute:8.2f} s{note}  ratio brute/fast = {t_brute / t_fast:6.1f}×")
    print(f"ref45 (spec §4.5 loop, 3 backwards/site): {t_ref:8.2f} s{note}  ratio ref45/fast = {t_ref / t_fast:6.1f}×")
    print(f"worst relative component difference: fast vs brute {worst_rel(fast, brute, scale):.2e}, "
          f"fast vs ref45 {worst_rel(fast, ref, scale):.2e}")

    # influences: JVP vs explicit ∇R per probe (tracked Majority sites, 3 probes each)
    tracked = [(k, i) for k in (1, 2) for i in range(2, 20)]
    gen = torch.Generator().manual_seed(1)
    probes = [Probe(f"f{j}@{k},{i}", k, i, torch.randn(cfg.d_model, generator=gen).to(model.config.torch_dtype))
              for k, i in tracked for j in range(3)]
    final = GPT(cfg)
    refs = reference_projections(final, tokens, probes)
    steps = sgd_steps({s: fast[s] for s in tracked}, lr=1e-3)
    recs, t_jvp = timed(lambda: influences(model, tokens, steps, probes, refs))

    def explicit():
        params = list(model.parameters())
        names = [n for n, _ in model.named_parameters()]
        out = {}
        _, res = model(tokens, return_residuals=True, myopic=False)     # one shared forward
        for p in probes:                                                # one ∇R backward per probe
            R = 0.5 * ((res[p.layer][:, p.position] @ p.direction - refs[p.name]) ** 2).mean()
            g = dict(zip(names, torch.autograd.grad(R, params, retain_graph=True, allow_unused=True)))
            for c in COMPONENTS:
                out[(p.name, c)] = sum(float((steps[p.site][c][n] * g[n]).sum()) for n in names if g[n] is not None)
        return out
    want, t_exp = timed(explicit)
    got = {(r.probe, r.component): r.value for r in recs if r.feature_type is None and r.component != "full"}
    err = max(abs(got[key] - v) / max(abs(v), 1e-12) for key, v in want.items())
    print(f"influences, {len(probes)} probes at {len(tracked)} sites: JVP {t_jvp:.2f} s vs explicit ∇R per probe "
          f"{t_exp:.2f} s, ratio {t_exp / t_jvp:.1f}×; worst relative difference {err:.1e}")


if __name__ == "__main__":
    main()
