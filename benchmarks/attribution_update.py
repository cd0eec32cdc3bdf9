"""One attributed Adam update at the Othello ``cpu`` size: what it costs and what it asks of the machine.

Model 4 layers × 128, 4 heads, T = 59, batch 64; 16 sites (4 layers × positions 12, 24, 36, 48), 16
probes per site, each with 2 random directions (48 directions per site), 3 feature types — the sizes of
``originlens ntp experiment othello --scale cpu``'s stratum units.  In one process, one thread, process
CPU time (median of ``--repeats``):

* ``train``       — the training step (forward, backward, ``torch.optim.Adam``);
* ``decomposed``  — the training step + ``decompose`` + ``AdamAttributor.attribute`` (flat moments);
* ``recorded``    — ``decomposed`` + the reference forward of the final model + ``influence_table``;
* the same two with the straightforward paths written out below (``reference_attribute``: moments per
  parameter tensor, the check read per tensor; ``reference_influences``: one probe and one subset at a
  time, read per probe), checked equal to the batched paths to round-off.

Counts (``originlens.counting``, the same on every machine): operators and host reads per decomposed and
per recorded update, and the operators of a recorded update with the probes per site doubled.  Floors
(issue of the flat attributor): host reads per recorded update ≤ 1 + number of sites, operator growth
with doubled probes < 5 %, recorded ≤ 1.4× decomposed.

    .venv/bin/python benchmarks/attribution_update.py [--repeats 3] [--batch 64] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time

import torch
from _emit import emit  # benchmarks/_emit.py (the script's own folder is on sys.path)

from originlens.attribution import COMPONENTS, AdamAttributor, Probe, decompose, influence_table, reference_projections
from originlens.attribution.jvp import grouped_jvps
from originlens.attribution.replay import with_training_gradient
from originlens.counting import count_dispatch, optimizer_step_counters
from originlens.models import GPT, GPTConfig

TYPES = [0, 1, 2]  # the feature types, known on the host (as the replay knows them from the task's arrays)


def reference_attribute(state, opt, names, params, pathways, beta1=0.9, beta2=0.999):
    """Per-component Adam per parameter tensor, the check read per tensor (the straightforward path)."""
    group = opt.param_groups[0]
    lr, eps = float(group["lr"]), float(group["eps"])
    tau = int(opt.state[params[0]]["step"])
    bc1, bc2 = 1 - beta1**tau, 1 - beta2**tau
    denom = {n: (opt.state[p]["exp_avg_sq"].double().sqrt() / bc2**0.5).add_(eps) for n, p in zip(names, params)}
    real = {n: lr / bc1 * opt.state[p]["exp_avg"].double() / denom[n] for n, p in zip(names, params)}
    out = {}
    for s, pg in pathways.items():
        mom = state.setdefault(
            s, {c: {n: torch.zeros_like(p, dtype=torch.float64) for n, p in zip(names, params)} for c in COMPONENTS}
        )
        steps = {}
        for c in COMPONENTS:
            for n in names:
                g = (
                    pg.full[n].double() - pg.direct[n].double() - pg.precached[n].double()
                    if c == "shared"
                    else getattr(pg, c)[n].double()
                )
                mom[c][n].lerp_(g, 1 - beta1)
            steps[c] = {n: lr / bc1 * mom[c][n] / denom[n] for n in names}
        err = sum(float((sum(steps[c][n] for c in COMPONENTS) - real[n]).pow(2).sum()) for n in names)
        assert err**0.5 <= 1e-6 * sum(float(real[n].pow(2).sum()) for n in names) ** 0.5
        out[s] = steps
    return out


def reference_influences(model, x, steps, probes, refs, types):
    """One probe and one type subset at a time, read per probe (the straightforward path)."""
    B = x.shape[0]
    with torch.no_grad():
        _, res = model(x, return_residuals=True, myopic=False)
    jvps = grouped_jvps(model, x, {s: [steps[s][c] for c in steps[s]] for s in {p.site for p in probes}})
    out = {}
    for p in probes:
        jv = jvps[p.site]
        w = p.direction.to(jv.dtype)
        diff = res[p.layer][:, p.position] @ p.direction - refs[p.name].to(jv.dtype)
        moved = jv @ w
        ty = types[p.name]
        for tau in [None, *sorted(set(ty.tolist()))]:
            rows = torch.ones(B, dtype=torch.bool) if tau is None else ty == tau
            n = int(rows.sum())
            for j, c in enumerate(steps[p.site]):
                out[(p.name, tau, c)] = 2.0 / n * float((moved[j][rows] * diff[rows]).sum())
    return out


def cpu(fn, repeats):
    times, out = [], None
    for _ in range(repeats):
        t = time.process_time()
        out = fn()
        times.append(time.process_time() - t)
    return out, statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="2 layers × 64, batch 16, 2 positions (for make bench)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    L, d, B, positions = (2, 64, 16, [12, 36]) if args.quick else (4, 128, args.batch, [12, 24, 36, 48])
    cfg = GPTConfig(vocab_size=61, seq_len=59, n_layer=L, d_model=d, n_head=4)
    torch.manual_seed(0)
    model, final = GPT(cfg), GPT(cfg)
    model.attn_impl = "eager"
    sites = [(k, i) for k in range(1, L + 1) for i in positions]
    g = torch.Generator().manual_seed(1)

    def probes_for(per_site):
        return [Probe(f"L{k}.P{i}.c{j}", k, i, torch.randn(d, generator=g)) for k, i in sites for j in range(per_site)]

    probes, probes2 = probes_for(48), probes_for(96)
    batches = [torch.randint(0, 61, (B, 59), generator=g) for _ in range(args.repeats + 2)]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    names = [n for n, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]

    def train_step(m, o, x):
        o.zero_grad(set_to_none=True)
        m.loss(x).backward()
        o.step()

    def types_of(x, ps):
        return {p.name: (x[:, p.position] % 3) for p in ps}

    alone = copy.deepcopy(model)
    alone_opt = torch.optim.Adam(alone.parameters(), lr=1e-3)
    t_train = cpu(lambda: train_step(alone, alone_opt, batches[0]), args.repeats)[1]
    flat = AdamAttributor(opt, model)
    ref_state: dict = {}
    times: dict[str, list[float]] = {"decomposed": [], "recorded": [], "ref_decomposed": [], "ref_recorded": []}
    counts = {}
    att_times: list[float] = []
    ref_att_times: list[float] = []
    worst = {"steps": 0.0, "influence": 0.0}
    # as in the replay: each batch's ids checked once, the forwards trust them
    model.check_token_range = final.check_token_range = False
    for r, x in enumerate(batches):
        counted = r == 1  # the second update is counted (operators and host reads), the others timed
        shadow = copy.deepcopy(model)
        types = types_of(x, probes)
        t = time.process_time()
        steppers = optimizer_step_counters(opt)  # CPU scalars on every device: not device reads
        with count_dispatch(steppers) if counted else contextlib.nullcontext() as c_dec:
            model.check_tokens(x)
            dec = decompose(model, x, sites)
            train_step(model, opt, x)
            # the replay's components: ∇L of the training kernel, G_sh = ∇L − G_dir − G_pre
            dec, _ = with_training_gradient(dec, {n: p.grad for n, p in zip(names, params)})
            t_base = time.process_time() - t
            t = time.process_time()
            steps = flat.attribute(dec)
        t_att = time.process_time() - t
        t = time.process_time()
        ref_steps = reference_attribute(ref_state, opt, names, params, dec)
        t_ref_att = time.process_time() - t
        t = time.process_time()
        with count_dispatch() if counted else contextlib.nullcontext() as c_inf:
            refs = reference_projections(final, x, probes)
            table = influence_table(shadow, x, steps, probes, refs, types=types, type_values=TYPES, drop_absent=True)
        t_inf = time.process_time() - t
        t = time.process_time()
        want = reference_influences(shadow, x, ref_steps, probes, reference_projections(final, x, probes), types)
        t_ref_inf = time.process_time() - t
        for st in sites:
            for c in COMPONENTS:
                for n in names:
                    a_, b_ = steps[st][c][n], ref_steps[st][c][n]
                    rel = float((a_ - b_).abs().max()) / max(float(b_.abs().max()), 1e-30)
                    worst["steps"] = max(worst["steps"], rel)
        got = {
            (
                table.probe[j],
                None if table.feature_type[j] < 0 else int(table.feature_type[j]),
                table.component[j],
            ): float(table.value[j])
            for j in range(len(table))
            if table.component[j] != "full"
        }
        scale = max(abs(v) for v in want.values())
        worst["influence"] = max(worst["influence"], max(abs(got[k] - v) for k, v in want.items()) / scale)
        if counted:
            types2 = types_of(x, probes2)
            with count_dispatch() as c_inf2:
                refs2 = reference_projections(final, x, probes2)
                influence_table(shadow, x, steps, probes2, refs2, types=types2, type_values=TYPES, drop_absent=True)
            counts = {"dec": c_dec, "inf": c_inf, "inf2": c_inf2}
            continue
        # both paths share the decomposition and the training step (t_base); their attributors differ
        times["decomposed"].append(t_base + t_att)
        times["recorded"].append(t_base + t_att + t_inf)
        times["ref_decomposed"].append(t_base + t_ref_att)
        times["ref_recorded"].append(times["ref_decomposed"][-1] + t_ref_inf)
        att_times.append(t_att)
        ref_att_times.append(t_ref_att)
    med = {k: statistics.median(v) for k, v in times.items()}
    ops_dec, ops_rec = counts["dec"].n_kernels, counts["dec"].n_kernels + counts["inf"].n_kernels
    ops_rec2 = counts["dec"].n_kernels + counts["inf2"].n_kernels
    reads_dec, reads_rec = counts["dec"].n_host_reads, counts["dec"].n_host_reads + counts["inf"].n_host_reads
    print(
        f"size: {L} layers × {d}, batch {B}, {len(sites)} sites × 48 directions, 1 thread, CPU time, median of {args.repeats}"
    )
    print(f"training step                 {t_train:8.3f} s")
    print(
        f"attributor alone the attributor     {statistics.median(att_times):8.3f} s flat vs {statistics.median(ref_att_times):.3f} s per tensor"
    )
    print(
        f"decomposed update             {med['decomposed']:8.3f} s   (straightforward attributor: {med['ref_decomposed']:.3f} s)"
    )
    print(
        f"recorded update               {med['recorded']:8.3f} s   (straightforward influences: {med['ref_recorded']:.3f} s)"
    )
    print(
        f"recorded / decomposed         {med['recorded'] / med['decomposed']:8.2f}×  (straightforward {med['ref_recorded'] / med['ref_decomposed']:.2f}×; floor ≤ 1.4×)"
    )
    print(
        f"host reads per update         decomposed {reads_dec}, recorded {reads_rec} (floor ≤ {1 + len(sites)}); by kind {dict(counts['dec'].host_reads + counts['inf'].host_reads)}"
    )
    print(
        f"operators per update          decomposed {ops_dec}, recorded {ops_rec}; probes doubled {ops_rec2} (+{100 * (ops_rec2 / ops_rec - 1):.1f} %, floor < 5 %)"
    )
    print(
        f"agreement with the straightforward paths: Δ_c {worst['steps']:.1e}, influences {worst['influence']:.1e} (relative to the largest)"
    )
    emit("attribution_update.decomposed_over_recorded", med["decomposed"] / med["recorded"], cpu=True, goal=1 / 1.4)
    emit("attribution_update.recorded_speedup", med["ref_recorded"] / med["recorded"], cpu=True)
    emit("attribution_update.reads_margin", (1 + len(sites)) / max(1, reads_rec), cpu=False, goal=1.0)
    emit("attribution_update.ops_growth_margin", 1.05 / (ops_rec2 / ops_rec), cpu=False, goal=1.0)


if __name__ == "__main__":
    main()
