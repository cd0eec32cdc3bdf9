"""The ablation step of the Q(w) score (:mod:`.qscore`): remove features from the SAE reconstruction at
one (site, position) and measure the KL of the next-token distribution at every later position
(:func:`ablation_kl`; cached, run-from and hook methods, equal up to round-off).  Batching and
precision are described in :mod:`.qscore`."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import ConfigError
from ..progress import progress
from .qscore_config import (
    ABLATION_METHODS,
    Examples,
    QScoreConfig,
    SiteStreams,
)

# ----------------------------------------------------------------------------------------------------
# ablation


def ablate_rows(sae: Any, x: Tensor, positions: Tensor, features: Tensor, ablation: str) -> tuple[Tensor, Tensor]:
    """Ablate latent ``features[r]`` at ``positions[r]`` of row r of ``x (R, T, d)``.

    Returns the new stream and the latent activations found there ``(R,)``.  Rows past ``len(features)``
    (clean rows) are left untouched.
    """
    R = features.shape[0]
    rows = torch.arange(R, device=x.device)
    xs = x[rows, positions]
    acts, state = sae.encode_with_state(xs.to(sae.W_enc.device))
    f = features.to(acts.device)
    r = torch.arange(R, device=acts.device)
    a_f = acts[r, f]
    if ablation == "faithful":
        acts = acts.clone()
        acts[r, f] = 0
        new = sae.decode(acts, state)
    else:
        new = xs.to(sae.dtype) - sae.feature_contribution(a_f, f, state)
    x = x.clone()
    x[rows, positions] = new.to(device=x.device, dtype=x.dtype)
    return x, a_f


def _pad_rows(rows: list[Tensor], pad: int = 0) -> Tensor:
    T = max(r.shape[0] for r in rows)
    out = torch.full((len(rows), T), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out


def kl_divergence(clean_logits: Tensor, ablated_logits: Tensor) -> Tensor:
    """``KL(softmax(clean) ‖ softmax(ablated))`` over the last axis, in float64.

    Large inputs are processed in blocks of about 2¹⁷ values: float64 temporaries of many megabytes are
    mapped and unmapped by the allocator at every call, and those page faults cost more than the
    arithmetic (4× slower for (1280, 512) on our CPU)."""
    shape = clean_logits.shape[:-1]
    V = clean_logits.shape[-1]
    a, b = clean_logits.reshape(-1, V), ablated_logits.reshape(-1, V)
    step = max(1, (1 << 17) // max(1, V))
    out = torch.empty(a.shape[0], dtype=torch.float64, device=a.device)
    for i in range(0, a.shape[0], step):
        lp = torch.log_softmax(a[i : i + step].double(), dim=-1)
        lq = torch.log_softmax(b[i : i + step].double(), dim=-1)
        out[i : i + step] = (lp.exp() * (lp - lq)).sum(-1)
    return out.reshape(shape)


def ablation_kl(
    adapter: Any,
    sae: Any,
    k: int,
    sequences: Tensor,
    examples: Examples,
    config: QScoreConfig,
    *,
    method: str = "auto",
    streams: SiteStreams | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``KL_d`` for every example ``(E, K)`` (float64) and the ablated latent's value ``(E,)``.

    ``method`` (see "Batching" in the module docstring): ``"cached"`` (clean keys/values cached, ablated
    copies re-run K positions above the site; needs ``adapter.supports_cached_ablation``),
    ``"run_from"`` (ablated copies re-run their whole prefix above the site), ``"hooks"`` (whole prefix,
    every block), or ``"auto"``: the first one the adapter supports (the cached one only when window
    length + K is within the adapter's ``cached_ablation_max_len``, e.g. a sliding attention window).  All give the same numbers up to
    round-off.  ``streams`` (from ``find_top_contexts(..., return_streams=True)`` on the same model and
    sequences): the cached method's clean runs start from these site-k streams, running only the blocks
    above k, for the windows they hold (the others run in full); ignored by the other methods and by
    adapters without ``run_cached_from``.
    """
    config.validate()
    if method not in ABLATION_METHODS:
        raise ConfigError(f"unknown ablation method {method!r}", f"use one of: {', '.join(ABLATION_METHODS)}")
    cached = bool(getattr(adapter, "supports_cached_ablation", False))
    run_from = bool(getattr(adapter, "supports_run_from", False))
    limit = getattr(adapter, "cached_ablation_max_len", None)  # e.g. a sliding attention window
    fits = limit is None or sequences.shape[1] + config.max_offset <= limit
    if method == "auto":
        method = "cached" if cached and fits else "run_from" if run_from else "hooks"
    if (method == "cached" and not cached) or (method == "run_from" and not run_from):
        raise ConfigError(
            f"this model ({getattr(adapter, 'family', type(adapter).__name__)}) does not support "
            f"the {method!r} ablation method",
            "use method='auto' or 'hooks'",
        )
    if method == "cached" and not fits:
        raise ConfigError(
            f"windows of {sequences.shape[1]} tokens + K = {config.max_offset} exceed this model's limit of "
            f"{limit} positions for the cached ablation",
            "use method='auto' (it falls back to re-running prefixes) or shorter windows",
        )
    K, E = config.max_offset, len(examples)
    kl = np.zeros((E, K), dtype=np.float64)
    act = np.zeros(E, dtype=np.float64)
    if E == 0:
        return kl, act
    if streams is not None and streams.site != k:
        raise ConfigError(
            f"streams kept at resid.{streams.site} passed for an ablation at resid.{k}",
            "pass the streams found by find_top_contexts at the same site, or none",
        )
    bar: Any = progress(total=E, desc=f"ablation ({config.ablation})", unit="ex")
    with torch.no_grad():
        if method == "cached":
            _ablation_kl_cached(adapter, sae, k, sequences, examples, config, kl, act, bar, streams)
        else:
            _ablation_kl_prefix(adapter, sae, k, sequences, examples, config, kl, act, bar, method == "run_from")
    if hasattr(bar, "close"):
        bar.close()
    return kl, act


def _ablation_kl_cached(
    adapter: Any,
    sae: Any,
    k: int,
    sequences: Tensor,
    examples: Examples,
    config: QScoreConfig,
    kl: np.ndarray,
    act: np.ndarray,
    bar: Any,
    streams: SiteStreams | None = None,
) -> None:
    """The ``"cached"`` method: one clean run per window keeps the keys/values of the blocks above site k;
    each ablated copy re-runs only its K positions p..p+K−1 above the site over that clean prefix.

    Windows (sorted by the prefix length they need) form groups whose clean state fits
    ``max_clean_bytes``; a group's clean runs (``clean_tokens`` tokens per forward) fill one padded
    buffer, then its examples, sorted by p, go ``batch_size`` rows per partial forward.  Windows whose
    site-k stream is in ``streams`` (covering the prefix they need) run only the blocks above k
    (``adapter.run_cached_from``); they are ordered after the others so that forwards rarely mix both."""
    K, dev = config.max_offset, adapter.device
    pos, feat = examples.position, examples.feature
    wins, inv = np.unique(examples.seq_index, return_inverse=True)
    need = np.zeros(len(wins), dtype=np.int64)  # clean prefix length per window
    np.maximum.at(need, inv, pos + K)
    held = streams.streams if streams is not None and hasattr(adapter, "run_cached_from") else {}
    has = np.array([w in held and held[w].shape[0] >= n for w, n in zip(wins.tolist(), need.tolist())], dtype=bool)
    order = np.lexsort((need, has))  # similar lengths share a forward
    itemsize = torch.empty((), dtype=next(iter(adapter.parameters())).dtype).element_size()
    per_window = int(need.max()) * (2 * (adapter.n_layers - k) + 2) * adapter.d_model * itemsize
    n_group = max(1, config.max_clean_bytes // max(1, per_window))
    offs = torch.arange(K, device=dev)
    for g0 in range(0, len(wins), n_group):
        gw = order[g0 : g0 + n_group]  # window ids (into wins) of this group
        row_of = np.full(len(wins), -1, dtype=np.int64)
        row_of[gw] = np.arange(len(gw))
        T = int(need[gw].max())
        buf: list[Tensor] = []
        c0 = 0
        while c0 < len(gw):  # clean runs, ~clean_tokens tokens each
            n = max(1, config.clean_tokens // int(need[gw[c0]]))
            while n > 1 and n * int(need[gw[min(len(gw), c0 + n) - 1]]) > config.clean_tokens:
                n -= 1
            cw = gw[c0 : c0 + n]
            Tc = int(need[cw].max())
            parts = _clean_parts(adapter, k, sequences, wins[cw], has[cw], held, Tc, dev)
            if len(cw) == len(gw):  # one forward holds the whole group
                buf = parts
                break
            if not buf:  # batch axis 0, position axis 1 or 2
                buf = [
                    t.new_zeros((len(gw), T, *t.shape[2:]))
                    if i < 2
                    else t.new_zeros((len(gw), t.shape[1], T, *t.shape[3:]))
                    for i, t in enumerate(parts)
                ]
            for i, t in enumerate(parts):
                if i < 2:
                    buf[i][c0 : c0 + len(cw), :Tc] = t
                else:
                    buf[i][c0 : c0 + len(cw), :, :Tc] = t
            c0 += len(cw)
        resid_L, resid_k = buf[0], buf[1]
        past = list(zip(buf[2::2], buf[3::2]))
        es = np.nonzero(row_of[inv] >= 0)[0]
        es = es[np.argsort(pos[es], kind="stable")]  # similar past lengths share a forward
        for b0 in range(0, len(es), config.batch_size):
            sub = es[b0 : b0 + config.batch_size]
            rows = torch.from_numpy(row_of[inv[sub]]).to(dev)
            p = torch.from_numpy(pos[sub]).to(dev)
            idx = (rows[:, None], p[:, None] + offs)
            clean = adapter.unembed(resid_L[idx])  # (R, K, V)
            x, a_f = ablate_rows(sae, resid_k[idx], torch.zeros_like(p), torch.from_numpy(feat[sub]), config.ablation)
            P = int(pos[sub].max())
            abl = adapter.run_positions_from(k, x, p, [(kk[rows, :, :P], vv[rows, :, :P]) for kk, vv in past])
            kl[sub] = kl_divergence(clean, abl).cpu().numpy()
            act[sub] = a_f.double().cpu().numpy()
            if hasattr(bar, "update"):
                bar.update(len(sub))


def _clean_parts(
    adapter: Any,
    k: int,
    sequences: Tensor,
    ws: np.ndarray,
    has: np.ndarray,
    held: dict[int, Tensor],
    T: int,
    dev: torch.device,
) -> list[Tensor]:
    """Clean state of windows ``ws`` over their first T positions: ``[resid_L, resid_k, k_1, v_1, ...]``
    (keys/values of the blocks above k); windows with ``has`` start from their held site-k stream."""
    out: list[list[Tensor]] = []
    if (~has).any():
        resid_L, resid_k, past = adapter.run_cached(sequences[torch.from_numpy(ws[~has]), :T].to(dev), k)
        out.append([resid_L, resid_k] + [t for kv in past for t in kv])
    if has.any():
        rows = [held[w][:T] for w in ws[has].tolist()]  # each covers its own need; zero-padded to T
        x = rows[0].new_zeros((len(rows), T, rows[0].shape[-1]))
        for i, r in enumerate(rows):
            x[i, : r.shape[0]] = r
        x = x.to(dev)
        resid_L, past = adapter.run_cached_from(k, x)
        out.append([resid_L, x] + [t for kv in past for t in kv])
    if len(out) == 1:
        return out[0]
    back = torch.from_numpy(np.argsort(np.concatenate([np.nonzero(~has)[0], np.nonzero(has)[0]]), kind="stable"))
    return [torch.cat(ts)[back.to(ts[0].device)] for ts in zip(*out)]


def _ablation_kl_prefix(
    adapter: Any,
    sae: Any,
    k: int,
    sequences: Tensor,
    examples: Examples,
    config: QScoreConfig,
    kl: np.ndarray,
    act: np.ndarray,
    bar: Any,
    fast: bool,
) -> None:
    """The ``"run_from"`` (``fast``) and ``"hooks"`` methods: clean runs once per window, each ablated copy
    re-runs its whole prefix (above the site when ``fast``)."""
    K, E = config.max_offset, len(examples)
    dev = adapter.device
    V = adapter.vocab_size
    itemsize = torch.empty((), dtype=next(iter(adapter.parameters())).dtype).element_size()
    block = max(config.batch_size, int(config.max_clean_bytes // max(1, K * V * itemsize)))
    pos_all = torch.from_numpy(examples.position)
    seq_all = torch.from_numpy(examples.seq_index)
    feat_all = torch.from_numpy(examples.feature)
    offs = torch.arange(K)
    for b0 in range(0, E, block):
        ids = torch.arange(b0, min(E, b0 + block))
        # clean: once per window, truncated to the longest prefix its examples need
        need: dict[int, int] = {}
        for e in ids.tolist():
            w = int(seq_all[e])
            need[w] = max(need.get(w, 0), int(pos_all[e]) + K)
        wins = sorted(need, key=lambda w: need[w])
        clean = torch.empty((len(ids), K, V), dtype=torch.float64 if itemsize == 8 else torch.float32)
        by_win: dict[int, list[int]] = {}
        for j, e in enumerate(ids.tolist()):
            by_win.setdefault(int(seq_all[e]), []).append(j)
        site: dict[int, Tensor] = {}  # clean stream at site k per window (fast path)
        for c0 in range(0, len(wins), config.batch_size):
            chunk = wins[c0 : c0 + config.batch_size]
            tok = _pad_rows([sequences[w, : need[w]] for w in chunk]).to(dev)
            if fast:
                logits, res = adapter.run(tok, return_residuals=True)
            else:
                logits = adapter.run(tok)
            for r, w in enumerate(chunk):
                if fast:
                    site[w] = res[k][r, : need[w]]
                for j in by_win[w]:
                    pos = int(pos_all[ids[j]])
                    clean[j] = logits[r, pos + offs].to(clean.dtype).cpu()
        # ablated copies: sorted by length, many (feature, context) pairs per forward
        order = sorted(range(len(ids)), key=lambda j: int(pos_all[ids[j]]))
        for c0 in range(0, len(order), config.batch_size):
            js = order[c0 : c0 + config.batch_size]
            es = ids[js]
            tok = _pad_rows([sequences[int(seq_all[e]), : int(pos_all[e]) + K] for e in es]).to(dev)
            p = pos_all[es].to(dev)
            f = feat_all[es]
            found: list[Tensor] = []

            def hook(x: Tensor, _k: int, p=p, f=f, found=found) -> Tensor:
                new, a_f = ablate_rows(sae, x, p, f, config.ablation)
                found.append(a_f)
                return new

            if fast:  # only the blocks above the site run; causal, so a clean prefix is exact
                L = max(int(pos_all[e]) + K for e in es)
                x = torch.zeros((len(js), L, adapter.d_model), dtype=site[int(seq_all[es[0]])].dtype, device=dev)
                for r, e in enumerate(es.tolist()):
                    n = int(pos_all[e]) + K
                    x[r, :n] = site[int(seq_all[e])][:n]
                logits = adapter.run_from(k, hook(x, k))
            else:
                logits = adapter.run(tok, hooks={k: hook})
            rows = torch.arange(len(js), device=logits.device)[:, None]
            abl = logits[rows, p[:, None] + offs.to(dev)].cpu()
            kl[es.numpy()] = kl_divergence(clean[js], abl).numpy()
            act[es.numpy()] = found[0].double().cpu().numpy()
            if hasattr(bar, "update"):
                bar.update(len(js))
