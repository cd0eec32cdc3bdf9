"""The stages of one seed of the formal-feature experiment (:mod:`.formal`), under ``OUT/seed-<s>``:
training the standard and myopic models and the untrained null with their held-out loss per domain
(:func:`window_losses`), then per trained model the SAE, the labels, Q(w) and the look-ahead maps
(:func:`_features_stage`), and on the standard model the steering (:func:`_steering_stage`).  Each stage is
skipped when its file exists; :func:`run_seed` runs them all and keeps the seconds of each stage.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..progress import log
from ..storage import atomic_write_json, read_json
from . import formal_metrics as fm
from .formal_corpus import MixedCorpus
from .formal_report import REGIMES

if TYPE_CHECKING:
    from .formal_config import FormalConfig


def window_losses(model: Any, tokens: np.ndarray, batch: int = 64) -> np.ndarray:
    """Mean next-token cross-entropy of each window ``(N, T+1)`` → ``(N,)``."""
    import torch
    import torch.nn.functional as F

    out = []
    dev = next(model.parameters()).device
    with torch.no_grad():
        for a in range(0, len(tokens), batch):
            x = torch.from_numpy(np.asarray(tokens[a : a + batch], dtype=np.int64)).to(dev)
            logits = model(x)[:, :-1].double()
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="none")
            out.append(ce.view(x.shape[0], -1).mean(1).cpu().numpy())
    return np.concatenate(out)


def _adapter(run: Path, corpus: MixedCorpus, device: str) -> Any:
    from ..lm.loading import load_adapter
    from ..lm.native import GPTAdapter

    adapter = cast(GPTAdapter, load_adapter(run / "model.safetensors", tokenizer=str(corpus.path)))
    adapter.module.to(device).eval()
    return adapter


def _features_stage(config: FormalConfig, corpus: MixedCorpus, adapter: Any, seed: int, d: Path) -> None:
    """SAE, labels, Q(w) and look-ahead of one trained model (each stage skipped when its file exists)."""
    import torch

    from ..lm.qscore import qscore
    from ..lm.qscore_config import QScoreConfig
    from ..lm.steering import LookaheadConfig, lookahead
    from ..runs import release_lock
    from ..sae import SAETrainConfig, read_sae, train_sae_run
    from ..sae.activations import site_residuals

    s, k = config.settings, adapter.n_layers // 2
    if not (d / "sae" / "results.json").is_file():
        n_train = len(corpus.tokens) - corpus.n_heldout
        idx = np.sort(np.random.default_rng([seed, 37]).permutation(n_train)[: s["sae_windows"]])
        tc = SAETrainConfig(
            architecture="topk",
            expansion=s["sae_expansion"],
            k=s["sae_k"],
            lr=s["sae_lr"],
            steps=s["sae_steps"],
            batch_size=s["sae_batch"],
            seed=seed,
        )
        train_sae_run(adapter, corpus.tokens[idx], k, tc, d / "sae", prepend_bos=False, dataset_path=str(corpus.path))
        release_lock(d / "sae")
    sae = read_sae(d / "sae" / "sae", device=config.device)
    A = corpus.tokens[corpus.analysis(s["analysis_windows"], config.split_seed)]
    dom = corpus.domain[corpus.analysis(s["analysis_windows"], config.split_seed)]
    if not (d / "labels.npz").is_file():
        masses, norm, n = np.zeros((2, sae.d_sae)), 0.0, 0
        with torch.no_grad():
            for a in range(0, len(A), 32):
                x = site_residuals(adapter, torch.from_numpy(np.asarray(A[a : a + 32], np.int64)).to(adapter.device), k)
                acts = sae.encode(x).reshape(-1, sae.d_sae).double().cpu().numpy()
                masses += fm.domain_masses(acts, np.repeat(dom[a : a + 32], x.shape[1]))
                norm, n = norm + float(x.norm(dim=-1).sum()), n + x.shape[0] * x.shape[1]
        share = fm.python_shares(masses)
        np.savez(
            d / "labels.npz",
            masses=masses,
            share=share,
            label=fm.label_features(share, s["threshold"]),
            resid_norm=norm / n,
            threshold=s["threshold"],
        )
    lab = np.load(d / "labels.npz")
    if not (d / "qscore.npz").is_file():
        live = [int(f) for f in np.nonzero(lab["label"] != fm.DEAD)[0]]
        qc = QScoreConfig(
            n_contexts=s["q_contexts"],
            max_offset=s["q_max_offset"],
            min_total_kl=s["q_min_total_kl"],
            prepend_bos=False,
        )
        res = qscore(adapter, sae, A, live, qc) if live else None
        arr: dict[str, Any] = {
            key: np.full(sae.d_sae, np.nan) for key in ("q", "q_median", "q_ratio_of_means", "total_kl")
        }
        arr["kept"], arr["n_examples"] = np.zeros(sae.d_sae, bool), np.zeros(sae.d_sae, np.int64)
        for fq in res.features if res else []:
            arr["kept"][fq.feature], arr["n_examples"][fq.feature] = fq.kept, fq.n_examples
            for key in ("q", "q_median", "q_ratio_of_means", "total_kl"):
                arr[key][fq.feature] = getattr(fq, key) if fq.kept else np.nan
        np.savez(d / "qscore.npz", **arr)
    q = np.load(d / "qscore.npz")["q"]
    if not (d / "lookahead.npz").is_file():
        feats = [int(f) for f in np.nonzero(np.isfinite(fm.log_q(q)))[0]]
        K, r = s["la_max_offset"], max(1, round(s["la_rank_frac"] * adapter.d_model))
        align, curve, vl = (
            np.full((K, sae.d_sae), np.nan),
            np.full((K, adapter.d_model), np.nan),
            np.full((2, K), np.nan),
        )
        if len(feats) >= 3:
            lc = LookaheadConfig(
                max_offset=K,
                lr=s["la_lr"],
                epochs=s["la_epochs"],
                batch_size=s["la_batch"],
                seed=seed,
                max_positions=s["la_max_positions"],
                prepend_bos=False,
            )
            la = lookahead(adapter, sae, A, lc, features=feats, q={f: float(q[f]) for f in feats})
            for off, al in la.alignment.items():
                align[off - 1, feats], curve[off - 1] = al[:, r - 1], al.mean(0)
            vl = np.array([[m.val_loss for m in la.maps], [m.val_loss_identity for m in la.maps]])
        np.savez(d / "lookahead.npz", alignment=align, rank=r, curve=curve, val_loss=vl)


def _steering_stage(config: FormalConfig, corpus: MixedCorpus, adapter: Any, seed: int, d: Path) -> None:
    """Steering of the standard model → ``steering.json``: the features of each group, α and c, and one
    cell per (prompt, group, α) (group "zero": c = 0, α recorded as 0) with ``code_frac`` (pooled over the
    group's features and samples), ``punct_frac`` (mean of the samples' punctuation-only token fractions)
    and ``python_token_frac`` (tokens whose python share is ≥ ``threshold``).  Skipped when it exists."""
    from ..lm.steering import steer
    from ..sae import read_sae

    if (d / "steering.json").is_file():
        return
    s = config.settings
    sae, codec = read_sae(d / "sae" / "sae", device=config.device), adapter.tokenizer
    q, norm = np.load(d / "qscore.npz")["q"], float(np.load(d / "labels.npz")["resid_norm"])
    scored = np.nonzero(np.isfinite(fm.log_q(q)))[0]
    kk = min(s["steer_k"], len(scored) // 3)
    if kk < 1:
        atomic_write_json(d / "steering.json", {"skipped": f"only {len(scored)} scored features", "cells": []})
        return
    order = scored[np.argsort(q[scored], kind="stable")]
    rest = order[kk:-kk]
    groups = {
        "top": order[-kk:][::-1],
        "bottom": order[:kk],
        "random": np.random.default_rng([seed, 41]).choice(rest if len(rest) >= kk else order, kk, replace=False),
    }
    alphas = [float(a) for a in s["steer_alphas"]]
    coefs = [a * norm for a in alphas]
    bos = codec.bos_id
    starts = [w for w in corpus.heldout_of(fm.STORY) if corpus.tokens[w, 0] == bos][: s["steer_prompts"]]
    if not starts:
        atomic_write_json(d / "steering.json", {"skipped": "no held-out story opening", "cells": []})
        return
    tok_share = fm.python_token_share(
        corpus.tokens[~corpus.heldout], corpus.domain[~corpus.heldout], adapter.vocab_size
    )
    feats = [int(f) for g in groups.values() for f in g]
    cells, examples = [], []

    def cell(p: int, g: str, a: float, samples: list[Any]) -> dict[str, Any]:
        texts = [codec.decode(row) for x in samples for row in x.ids]
        ids = [row for x in samples for row in x.ids]
        return {
            "prompt": p,
            "group": g,
            "alpha": a,
            **fm.pooled_fractions(texts),  # code_frac and punct_chars_frac (kept in the cells, not tested)
            "punct_frac": fm.nanmean([x.stats.get("punct_frac", math.nan) for x in samples]),
            "python_token_frac": fm.python_token_fraction(ids, tok_share, s["threshold"]),
        }

    for p, w in enumerate(starts):
        prompt = [int(t) for t in corpus.tokens[w, : s["steer_prompt_tokens"]]]
        res = steer(
            adapter,
            sae,
            feats,
            coefs,
            prompt_ids=prompt,
            tokenizer=codec,
            n_samples=s["steer_samples"],
            max_new_tokens=s["steer_new_tokens"],
            temperature=1.0,
            seed=1000 * seed + p,
        )
        by = {(x.feature, x.coefficient): x for x in res}
        cells.append(cell(p, "zero", 0.0, [res[0]]))
        for g, fs in groups.items():
            for a, c in zip(alphas, coefs):
                cells.append(cell(p, g, a, [by[(int(f), float(c))] for f in fs]))
        top = max(coefs)
        examples.append(
            {
                "prompt": codec.decode(prompt),
                "zero": codec.decode(res[0].ids[0]),
                **{g: codec.decode(by[(int(fs[0]), top)].ids[0]) for g, fs in groups.items()},
            }
        )
    atomic_write_json(
        d / "steering.json",
        {
            "features": {g: [int(f) for f in v] for g, v in groups.items()},
            "alphas": alphas,
            "coefficients": coefs,
            "resid_norm": norm,
            "cells": cells,
            "examples": examples,
        },
    )


def run_seed(config: FormalConfig, corpus: MixedCorpus, seed: int, out: Path) -> None:
    """Every stage of one seed under ``OUT/seed-<s>`` (finished stages are skipped)."""
    from ..models.gpt import GPT
    from ..train.ntp import Trainer, is_finished

    sd = out / f"seed-{seed}"
    for name, regime, initial in (
        ("standard", "standard", False),
        ("myopic", "myopic", False),
        ("initial", "standard", True),
    ):
        run = sd / name / "run"
        ncfg = config.ntp_config(seed, regime, corpus.path, corpus.n_heldout, initial=initial)
        if not is_finished(run, ncfg):
            t = time.time()
            Trainer(ncfg, run, resume=True).run()
            log(f"[formal] seed {seed} {name}: trained in {time.time() - t:.0f} s", level=2)
        if not (sd / name / "losses.json").is_file():
            model = GPT.load(run / "model.safetensors").to(config.device).eval()
            n = config.settings["eval_windows"]
            losses = {
                nm: float(window_losses(model, corpus.tokens[corpus.heldout_of(d)[:n]]).mean())
                for d, nm in enumerate(fm.DOMAINS)
            }
            atomic_write_json(sd / name / "losses.json", losses)
    for regime in REGIMES:
        adapter = _adapter(sd / regime / "run", corpus, config.device)
        _timed(
            sd, f"{regime}: SAE, labels, Q(w), look-ahead", _features_stage, config, corpus, adapter, seed, sd / regime
        )
        if regime == "standard":
            _timed(sd, "standard: steering", _steering_stage, config, corpus, adapter, seed, sd / regime)


def _timed(sd: Path, key: str, fn: Any, *args: Any) -> None:
    """Run ``fn(*args)``; the wall seconds of the first call (the one that did the work) go to
    ``SEED/timings.json``."""
    t = time.time()
    fn(*args)
    f = sd / "timings.json"
    rec = read_json(f) if f.is_file() else {}
    if key not in rec:
        atomic_write_json(f, {**rec, key: round(time.time() - t, 3)})
