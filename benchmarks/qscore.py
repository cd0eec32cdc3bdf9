"""Q(w) throughput: the batched implementation vs a per-example loop, same model, SAE and contexts, CPU.

Model: ``stories260K`` (llama2.c, d = 64, 5 layers; TinyStories windows of 64 tokens) or ``--model gpt``
(our GPT, d = 128, 4 layers, vocabulary 512, random weights and tokens).  SAE: a random standard SAE with
``--d-sae`` latents on ``resid.3``.  Contexts: ``--features`` features × ``--contexts`` top-activating
contexts found once by :func:`originlens.lm.qscore.find_top_contexts` (with ``return_streams=True``: it
also keeps the site-3 streams of the selected windows; shared by both paths, timed separately).

Ablation step, for every (feature, context) example, KL_1..KL_K (K = 10):

* ``batched`` — :func:`originlens.lm.qscore.ablation_kl` with ``--method`` (default ``auto`` = ``cached``:
  one clean run per window keeps the keys/values above the site, each ablated copy re-runs only its K
  positions above the site).  The cached method is given the streams kept by the search, so its clean
  runs only run the blocks above the site (it reuses the search's blocks below the site); also timed
  without them (``cached, full clean runs``) and, for reference, ``run_from`` (each ablated copy re-runs
  its whole prefix above the site) unless ``--method`` names another one;
* ``loop``    — written out here: one forward per (context, feature) holding the clean and the ablated
  copy of that example (2 rows, truncated after p + K − 1), KL from the logits.

End to end (``--e2e``, default on): :func:`originlens.lm.qscore.qscore` (batched search keeping the
streams + cached ablation + aggregation) against a per-feature pipeline as a simple script would write
it: for each feature, scan all windows (model run to the site with a stopping hook,
:func:`originlens.sae.activations.site_residuals`, then the SAE's full ``encode``), take its top
candidates by the same rules (maximum over eligible positions, top ``n_contexts × pool_factor``, greedy
edit-distance de-duplication), then the per-example loop above.  The per-feature pipeline is timed
``--e2e-repeat`` times (default 1: it takes tens of seconds), ours ``--repeat`` times.

Prints seconds (minimum over ``--repeat`` interleaved repetitions: the machine is shared, the minimum is
the least disturbed run), features/second, the speed-up (also in process CPU time, less sensitive to
other processes) and the largest disagreement of KL_d and of the per-feature Q (mean of ratios); then the
time of the clean runs alone (each window's prefix once through every block), whose ratio to the loop
bounds the speed-up of any method that needs them.  Usage: ``.venv/bin/python benchmarks/qscore.py [--model stories260K|gpt]
[--features 64] [--contexts 8] [--window 64] [--threads 1] [--repeat 5] [--method auto] [--float64]
[--no-e2e] [--e2e-repeat 1]``.
Caveat: shared 2-core CPU; single runs vary by ±30 %, hence the minimum.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from _emit import emit  # benchmarks/_emit.py (the script's own folder is on sys.path)

from originlens.lm.native import GPTAdapter, Llama2cAdapter
from originlens.lm.qscore import aggregate, qscore
from originlens.lm.qscore_ablation import ablation_kl, kl_divergence
from originlens.lm.qscore_config import QScoreConfig
from originlens.lm.qscore_contexts import find_top_contexts, within_edit_distance
from originlens.sae import SAE, SAEConfig
from originlens.sae.activations import as_sequences, site_residuals


def build(model: str, n_windows: int, window: int):
    if model == "gpt":
        from originlens.models.gpt import GPT, GPTConfig

        torch.manual_seed(0)
        ad = GPTAdapter(GPT(GPTConfig(vocab_size=512, seq_len=window + 1, n_layer=4, d_model=128, n_head=4)), bos_id=0)
        toks = np.random.default_rng(0).integers(1, 512, size=(n_windows, window))
        return ad, toks
    from originlens.lm.llama2c import load_llama2c
    from originlens.lm.llama2c_tokenizer import Llama2cTokenizer
    from originlens.paths import data_path, tinystories_files

    d = data_path("models", "stories260K")
    m = load_llama2c(d / "stories260K.bin")
    tok = Llama2cTokenizer.from_file(d / "tok512.bin", m.cfg.vocab_size)
    rows = []
    for line in tinystories_files()[0].read_text(encoding="utf-8").splitlines():
        ids = tok.encode(line, bos=False)
        rows += [ids[i : i + window] for i in range(0, len(ids) - window + 1, window)]
        if len(rows) >= n_windows:
            break
    return Llama2cAdapter(m), np.array(rows[:n_windows])


def random_sae(d: int, m: int, hook: str) -> SAE:
    g = torch.Generator().manual_seed(0)
    sae = SAE(SAEConfig(d_in=d, d_sae=m, hook_name=hook)).requires_grad_(False)
    with torch.no_grad():
        w = torch.randn(m, d, generator=g)
        sae.W_dec.copy_(w / w.norm(dim=1, keepdim=True))
        sae.W_enc.copy_(sae.W_dec.T)
    return sae


def loop_kl(ad, sae, k, seqs, ex, cfg):
    """One forward per (feature, context): rows [clean, ablated], truncated after p + K − 1."""
    K = cfg.max_offset
    out = np.zeros((len(ex), K))
    with torch.no_grad():
        for e in range(len(ex)):
            p, f = int(ex.position[e]), int(ex.feature[e])
            tok = seqs[int(ex.seq_index[e]), : p + K].expand(2, -1)

            def hook(x, _k):
                x = x.clone()
                a = sae.encode(x[1, p])
                x[1, p] = x[1, p] - a[f] * sae.W_dec[f]
                return x

            logits = ad.run(tok, hooks={k: hook})
            out[e] = kl_divergence(logits[0, p : p + K], logits[1, p : p + K]).numpy()
    return out


def per_feature_search(ad, sae, k, seqs, feats, cfg):
    """For each feature: scan every window (run to the site, full SAE encode), keep its best eligible
    position per window, sort, take the top n_contexts × pool_factor, de-duplicate greedily."""
    K, L = cfg.max_offset, seqs.shape[1]
    out = []
    with torch.no_grad():
        for f in feats:
            vals, poss = [], []
            for s in range(0, len(seqs), cfg.scan_batch_size):
                a = sae.encode(site_residuals(ad, seqs[s : s + cfg.scan_batch_size], k))[:, :, f]  # (B, L)
                v, p = a[:, 1 : L - K].max(dim=1)  # eligible: 1..L-1-K
                vals.append(v.double()), poss.append(p + 1)
            v, p = torch.cat(vals), torch.cat(poss)
            order = torch.sort(v, descending=True, stable=True).indices[: cfg.n_contexts * cfg.pool_factor]
            kept = []
            for i in order.tolist():
                if not v[i] > 0 or len(kept) >= cfg.n_contexts:
                    break
                text = seqs[i, 1 : int(p[i]) + K + 1].tolist()
                if any(within_edit_distance(text, t, cfg.dedup_distance) for _, _, t in kept):
                    continue
                kept.append((i, int(p[i]), text))
                out.append((f, i, int(p[i]), float(v[i])))
    from originlens.lm.qscore_config import Examples

    arr = np.array([r[:3] for r in out], dtype=np.int64).reshape(-1, 3)
    return Examples(arr[:, 0], arr[:, 1], arr[:, 2], np.array([r[3] for r in out]))


def per_feature_pipeline(ad, sae, k, seqs, feats, cfg):
    ex = per_feature_search(ad, sae, k, seqs, feats, cfg)
    return ex, loop_kl(ad, sae, k, seqs, ex, cfg)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="stories260K", choices=["stories260K", "gpt"])
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--contexts", type=int, default=8)
    ap.add_argument("--d-sae", type=int, default=256)
    ap.add_argument("--windows", type=int, default=400)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--float64", action="store_true", help="model and SAE in float64 (agreement ~1e-12)")
    ap.add_argument("--repeat", type=int, default=5, help="timed repetitions (minimum reported)")
    ap.add_argument("--method", default="auto", choices=["auto", "cached", "run_from", "hooks"])
    ap.add_argument("--no-e2e", dest="e2e", action="store_false", help="skip the end-to-end comparison")
    ap.add_argument("--e2e-repeat", type=int, default=1, help="repetitions of the per-feature pipeline")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ad, toks = build(a.model, a.windows, a.window)
    sae = random_sae(ad.d_model, a.d_sae, "blocks.2.hook_resid_post")
    if a.float64:
        ad.module.double()
        sae.double()
    k = 3
    cfg = QScoreConfig(n_contexts=a.contexts, max_offset=10, batch_size=a.batch_size)
    seqs = as_sequences(toks, ad)
    feats = list(range(a.features))
    t_scans = []
    for _ in range(max(1, a.repeat)):
        t0 = time.perf_counter()
        ex, streams = find_top_contexts(ad, sae, k, seqs, feats, cfg, first=1, return_streams=True)
        t_scans.append(time.perf_counter() - t0)
    t_scan = min(t_scans)
    n_feat = len(set(ex.feature.tolist()))
    ref = "run_from" if a.method in ("auto", "cached") else None
    runs = {
        "batched": lambda: ablation_kl(ad, sae, k, seqs, ex, cfg, method=a.method, streams=streams)[0],
        "loop": lambda: loop_kl(ad, sae, k, seqs, ex, cfg),
    }
    if ref:
        runs["full"] = lambda: ablation_kl(ad, sae, k, seqs, ex, cfg, method=a.method)[0]
        runs[ref] = lambda: ablation_kl(ad, sae, k, seqs, ex, cfg, method=ref)[0]
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    out = {}
    for _ in range(max(1, a.repeat)):  # interleaved, so that load changes hit every path alike
        for name, fn in runs.items():
            t0, c0 = time.perf_counter(), time.process_time()
            out[name] = fn()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    t_b, t_l = min(times["batched"]), min(times["loop"])
    kl_b, kl_l = out["batched"], out["loop"]
    q_b = np.array([f.q for f in aggregate(ex, kl_b, feats, cfg)[0] if f.n_examples])
    q_l = np.array([f.q for f in aggregate(ex, kl_l, feats, cfg)[0] if f.n_examples])
    print(
        f"model {a.model} (d={ad.d_model}, L={ad.n_layers}, V={ad.vocab_size}), SAE d_sae={a.d_sae} on resid.{k}, "
        f"{n_feat} features x <= {a.contexts} contexts = {len(ex)} examples, K=10, threads={a.threads}"
    )
    print(
        f"context search (shared, keeps the site streams of {len(streams.streams)} windows, "
        f"{streams.nbytes / 2**20:.1f} MiB): {t_scan:.3f} s over {len(seqs)} windows of {seqs.shape[1]} tokens "
        f"(min of {a.repeat})"
    )
    print(f"ABLATION STEP; times: min of {a.repeat} (median in brackets)")
    print(
        f"batched ({a.method}, clean runs from the search's site streams): {t_b:.3f} s "
        f"[{np.median(times['batched']):.3f}]  ({n_feat / t_b:.1f} features/s)"
    )
    if ref:
        t_f = min(times["full"])
        print(
            f"batched ({a.method}, full clean runs, no streams): {t_f:.3f} s [{np.median(times['full']):.3f}]  "
            f"({n_feat / t_f:.1f} features/s, {t_l / t_f:.1f}x the loop)"
        )
        t_r = min(times[ref])
        print(
            f"batched ({ref}, previous method): {t_r:.3f} s [{np.median(times[ref]):.3f}]  "
            f"({n_feat / t_r:.1f} features/s, {t_l / t_r:.1f}x the loop)"
        )
    print(f"loop:    {t_l:.3f} s [{np.median(times['loop']):.3f}]  ({n_feat / t_l:.2f} features/s)")
    print(
        f"speed-up: {t_l / t_b:.1f}x (medians: {np.median(times['loop']) / np.median(times['batched']):.1f}x; "
        f"process CPU time, min: {min(cpu['loop']) / min(cpu['batched']):.1f}x)"
    )
    emit(f"qscore.{a.model}.loop_over_batched", min(cpu["loop"]) / min(cpu["batched"]), cpu=True)
    print(
        f"max |KL_batched - KL_loop| = {np.abs(kl_b - kl_l).max():.2e} (max KL {kl_l.max():.3g}); "
        f"max relative |Q diff| = {np.max(np.abs(q_b - q_l) / np.maximum(np.abs(q_l), 1e-12)):.2e}"
    )
    if ref:
        print(
            f"max |KL_batched - KL_{ref}| = {np.abs(kl_b - out[ref]).max():.2e}; "
            f"max |KL_batched - KL_full clean runs| = {np.abs(kl_b - out['full']).max():.2e}"
        )
    if getattr(ad, "supports_cached_ablation", False):
        t_c = min(timed(lambda: clean_runs_only(ad, k, seqs, ex, cfg)) for _ in range(max(1, a.repeat)))
        print(
            f"clean runs alone (every window's prefix through all blocks, as without streams): {t_c:.3f} s; "
            f"loop / clean = {t_l / t_c:.1f}x bounds the speed-up of a method that runs them"
        )
        t_s = min(timed(lambda: clean_runs_only(ad, k, seqs, ex, cfg, streams)) for _ in range(max(1, a.repeat)))
        print(
            f"clean runs from the site streams (blocks above the site only, part of 'batched'): {t_s:.3f} s; "
            f"loop / clean = {t_l / t_s:.1f}x"
        )
    if a.e2e:
        end_to_end(a, ad, sae, k, toks, seqs, feats, cfg, ex, t_scan + t_l)


def end_to_end(a, ad, sae, k, toks, seqs, feats, cfg, ex_ref, t_shared_loop):
    """qscore() vs the per-feature pipeline; ``t_shared_loop``: our batched search + the per-example loop
    (times measured above), printed as the middle ground."""
    t_ours, t_naive = [], []
    for _ in range(max(1, a.repeat)):
        t0 = time.perf_counter()
        res = qscore(ad, sae, toks, feats, cfg, site=k)
        t_ours.append(time.perf_counter() - t0)
    for _ in range(max(1, a.e2e_repeat)):
        t0 = time.perf_counter()
        ex_n, kl_n = per_feature_pipeline(ad, sae, k, seqs, feats, cfg)
        t_naive.append(time.perf_counter() - t0)
    t_o, t_n = min(t_ours), min(t_naive)
    ex = res.examples
    same = all(np.array_equal(getattr(ex, n), getattr(ex_n, n)) for n in ("feature", "seq_index", "position"))
    n_feat = len(set(ex.feature.tolist()))
    print(
        f"END TO END ({len(feats)} features requested, {n_feat} with contexts, {len(ex)} examples): "
        f"qscore() {t_o:.3f} s (min of {a.repeat}; {n_feat / t_o:.1f} features/s) vs per-feature pipeline "
        f"{t_n:.2f} s (min of {a.e2e_repeat}; {n_feat / t_n:.2f} features/s): speed-up {t_n / t_o:.1f}x"
    )
    print(
        f"  for reference: batched search + per-example loop {t_shared_loop:.3f} s "
        f"({t_shared_loop / t_o:.1f}x qscore()'s time)"
    )
    print(
        f"  same contexts as the per-feature search: {same}; same as the shared search above: "
        f"{all(np.array_equal(getattr(ex, n), getattr(ex_ref, n)) for n in ('feature', 'seq_index', 'position'))}"
    )
    if same:
        q_o = np.array([f.q for f in res.features if f.n_examples])
        q_n = np.array([f.q for f in aggregate(ex_n, kl_n, feats, cfg)[0] if f.n_examples])
        print(
            f"  max |KL_qscore - KL_per-feature| = {np.abs(res.kl - kl_n).max():.2e} (max KL {kl_n.max():.3g}); "
            f"max relative |Q diff| = {np.max(np.abs(q_o - q_n) / np.maximum(np.abs(q_n), 1e-12)):.2e}; "
            f"max |activation diff| = {np.abs(ex.activation - ex_n.activation).max():.2e}"
        )


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def clean_runs_only(ad, k, seqs, ex, cfg, streams=None):
    """The clean part of the cached method: each window once, up to max p + K, ~clean_tokens per forward;
    from the kept site streams (blocks above the site only) when ``streams`` is given."""
    need: dict[int, int] = {}
    for w, p in zip(ex.seq_index.tolist(), ex.position.tolist()):
        need[w] = max(need.get(w, 0), p + cfg.max_offset)
    wins = sorted(need, key=need.get)
    with torch.no_grad():
        i = 0
        while i < len(wins):
            n = max(1, cfg.clean_tokens // need[wins[min(len(wins), i + 1) - 1]])
            while n > 1 and n * need[wins[min(len(wins), i + n) - 1]] > cfg.clean_tokens:
                n -= 1
            chunk = wins[i : i + n]
            if streams is None:
                ad.run_cached(seqs[torch.tensor(chunk), : need[chunk[-1]]], k)
            else:
                T = need[chunk[-1]]
                x = torch.zeros((len(chunk), T, ad.d_model), dtype=streams.streams[chunk[0]].dtype)
                for r, w in enumerate(chunk):
                    t = streams.streams[w][:T]
                    x[r, : t.shape[0]] = t
                ad.run_cached_from(k, x)
            i += n


if __name__ == "__main__":
    main()
