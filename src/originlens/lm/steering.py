"""Steering generation and look-ahead maps for SAE features (the Q(w) study of arXiv 2603.14087;
differences from the reference code in ``docs/protocol.md``).

Steering (:func:`steer`): while sampling N new tokens from a prompt (or BOS alone), ``c · W_dec[f]`` is
added to the residual stream at the SAE's site at **all** positions, exactly once per forward (the
reference applies c twice: its c ∈ {1, 10} are effective {1, 100}; use c ∈ {1, 100} to reproduce).  All
coefficients of a feature use the same seed, so samples differ only through the steering (common random
numbers); c = 0 is the unsteered baseline.  :func:`completion_stats` is our completion analysis (the
reference publishes none): fractions of punctuation-only, digit-bearing and distinct tokens, and the
tokens most promoted relative to the baseline.

Look-ahead (:func:`lookahead`): for k = 1..K an affine map ``A_k`` (d×d, identity initialisation) is
trained so that ``unembed(A_k r_t)`` predicts token t+k from the residual r_t at the SAE's site (cross
entropy, Adam, 80/20 split); ``A_k = U S Vᵀ``; for every rank r and SAE feature f the cosine between
the encoder column ``W_enc[:, f]`` and its projection onto the top-r right singular vectors,
``‖V_rᵀ e_f‖ / ‖e_f‖`` (a random direction scores about ``√(r/d)``), and its Spearman correlation with Q.

Caveats: generation re-runs the whole prefix at every step (the adapter protocol has no KV cache; fine
for the short samples of the protocol); prompts longer than the model's context are cropped from the
left; look-ahead positions are those with all K targets inside the window (BOS position excluded).
"""

from __future__ import annotations

import math
import string
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import ConfigError, InputError
from ..progress import progress
from ..sites import site_name

# ----------------------------------------------------------------------------------------------------
# steering


def steering_hook(direction: Tensor, coefficient: float) -> Callable[[Tensor, int], Tensor]:
    """A residual hook adding ``coefficient · direction`` ``(d,)`` at every position (once)."""

    def hook(x: Tensor, _k: int) -> Tensor:
        return x + (coefficient * direction).to(device=x.device, dtype=x.dtype)

    return hook


@torch.no_grad()
def generate_steered(
    adapter: Any,
    site: int,
    direction: Tensor | None,
    coefficient: float,
    prompt_ids: Sequence[int],
    *,
    n_samples: int = 64,
    max_new_tokens: int = 20,
    temperature: float = 1.0,
    seed: int = 42,
) -> Tensor:
    """Sample ``n_samples`` continuations of ``prompt_ids`` with the steering hook → ids ``(n, max_new)``.

    ``temperature = 0`` is greedy decoding; ``direction=None`` or ``coefficient=0`` is unsteered.
    """
    if not prompt_ids:
        raise InputError("an empty prompt and a model without BOS: nothing to condition on", "pass --prompt TEXT")
    if n_samples < 1 or max_new_tokens < 0 or temperature < 0:
        raise ConfigError("need n_samples ≥ 1, max_new_tokens ≥ 0, temperature ≥ 0", "fix the sampling settings")
    dev = adapter.device
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    hooks = {site: steering_hook(direction, coefficient)} if direction is not None and coefficient != 0 else None
    toks = torch.tensor(list(prompt_ids), dtype=torch.long).expand(n_samples, -1).clone().to(dev)
    out = torch.empty((n_samples, max_new_tokens), dtype=torch.long)
    ctx = adapter.max_seq_len
    for i in range(max_new_tokens):
        inp = toks if ctx is None or toks.shape[1] <= ctx else toks[:, -ctx:]
        logits = adapter.run(inp, hooks=hooks)[:, -1].double().cpu()
        if temperature == 0:
            nxt = logits.argmax(-1)
        else:
            nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)[:, 0]
        out[:, i] = nxt
        toks = torch.cat([toks, nxt[:, None].to(dev)], dim=1)
    return out


@dataclass
class SteeringSample:
    """Samples of one (feature, coefficient)."""

    feature: int
    coefficient: float
    ids: list[list[int]]
    texts: list[str] | None
    stats: dict[str, Any] = field(default_factory=dict)


def _piece(tokenizer: Any, i: int) -> str:
    try:
        return tokenizer.decode([i])
    except Exception:
        return f"<{i}>"


def completion_stats(
    ids: Sequence[Sequence[int]], tokenizer: Any = None, baseline: Sequence[Sequence[int]] | None = None, top: int = 10
) -> dict[str, Any]:
    """Completion analysis of sampled ids: ``punct_frac`` (tokens whose text is only punctuation /
    whitespace), ``digit_frac`` (tokens containing a digit), ``distinct_frac`` (distinct / all tokens), and
    ``promoted``: the ``top`` tokens with the largest count increase over ``baseline`` (add-one smoothed)."""
    flat = [int(t) for row in ids for t in row]
    n = max(1, len(flat))
    counts = Counter(flat)
    out: dict[str, Any] = {"n_tokens": len(flat), "distinct_frac": len(counts) / n}
    if tokenizer is not None:
        pieces = {i: _piece(tokenizer, i) for i in counts}
        punct = set(string.punctuation) | set(string.whitespace)
        out["punct_frac"] = sum(c for i, c in counts.items() if pieces[i] and set(pieces[i]) <= punct) / n
        out["digit_frac"] = sum(c for i, c in counts.items() if any(ch.isdigit() for ch in pieces[i])) / n
    if baseline is not None:
        base = Counter(int(t) for row in baseline for t in row)
        nb = max(1, sum(base.values()))
        lift = {i: ((counts[i] + 1) / (n + 1)) / ((base.get(i, 0) + 1) / (nb + 1)) for i in counts}
        best = sorted(lift, key=lambda i: (-lift[i], i))[:top]
        out["promoted"] = [
            {
                "id": i,
                "text": _piece(tokenizer, i) if tokenizer is not None else None,
                "count": counts[i],
                "baseline_count": base.get(i, 0),
                "lift": lift[i],
            }
            for i in best
        ]
    return out


def steer(
    adapter: Any,
    sae: Any,
    features: Sequence[int],
    coefficients: Sequence[float] = (1.0, 100.0),
    *,
    prompt_ids: Sequence[int] | None = None,
    tokenizer: Any = None,
    n_samples: int = 64,
    max_new_tokens: int = 20,
    temperature: float = 1.0,
    seed: int = 42,
    site: int | str | None = None,
    include_baseline: bool = True,
) -> list[SteeringSample]:
    """Steered samples for every (feature, coefficient) (plus one unsteered baseline with c = 0).

    ``prompt_ids`` default: BOS alone.  Texts are decoded when a tokenizer is given.
    """
    from ..sae.model import sae_site

    k = sae_site(sae, adapter, site)
    if prompt_ids is None:
        if adapter.bos_id is None:
            raise InputError("the model has no BOS token and no prompt was given", "pass --prompt TEXT")
        prompt_ids = [int(adapter.bos_id)]
    bad = [f for f in features if not 0 <= int(f) < sae.d_sae]
    if bad:
        raise ConfigError(f"feature ids {bad[:5]} outside 0..{sae.d_sae - 1}", "pick features of this SAE")

    def decode(ids: Tensor) -> list[str] | None:  # prompt + continuation, as the tokenizer renders it
        return None if tokenizer is None else [tokenizer.decode(list(prompt_ids) + row.tolist()) for row in ids]

    out: list[SteeringSample] = []
    base_ids = None
    if include_baseline:
        b = generate_steered(
            adapter,
            k,
            None,
            0.0,
            prompt_ids,
            n_samples=n_samples,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
        )
        base_ids = b.tolist()
        out.append(SteeringSample(-1, 0.0, base_ids, decode(b), completion_stats(base_ids, tokenizer)))
    jobs = [(int(f), float(c)) for f in features for c in coefficients]
    for f, c in progress(jobs, desc="steering", unit="run"):
        ids = generate_steered(
            adapter,
            k,
            sae.W_dec[f].detach(),
            c,
            prompt_ids,
            n_samples=n_samples,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
        )
        out.append(SteeringSample(f, c, ids.tolist(), decode(ids), completion_stats(ids.tolist(), tokenizer, base_ids)))
    return out


# ----------------------------------------------------------------------------------------------------
# look-ahead maps


@dataclass
class LookaheadConfig:
    """Settings of the look-ahead maps (reference: lr 1e-4, 10 epochs, batch 32, 80/20, k = 1..5)."""

    max_offset: int = 5
    lr: float = 1e-4
    epochs: int = 10
    batch_size: int = 32
    train_frac: float = 0.8
    seed: int = 0
    max_positions: int | None = None
    prepend_bos: bool = True

    def validate(self) -> None:
        for name in ("max_offset", "epochs", "batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}", f"set {name} ≥ 1")
        if not 0 < self.train_frac < 1 or not self.lr > 0:
            raise ConfigError("train_frac must be in (0, 1) and lr > 0", "e.g. train_frac=0.8, lr=1e-4")


@dataclass
class LookaheadMap:
    """One trained map ``A_k`` and its singular values; losses are mean CE on held-out positions."""

    offset: int
    weight: Tensor  # (d, d)
    bias: Tensor  # (d,)
    singular_values: Tensor  # (d,)
    right_vectors: Tensor  # Vᵀ (d, d): rows = right singular vectors, by decreasing singular value
    val_loss: float
    val_loss_identity: float
    val_acc: float
    history: list[dict[str, float]] = field(default_factory=list)


def lookahead_data(
    adapter: Any,
    sequences: Tensor,
    k: int,
    max_offset: int,
    *,
    first: int = 1,
    batch_size: int = 32,
    max_positions: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Residuals ``X (n, d)`` at ``resid.k`` and targets ``Y (n, K)`` (token t+1..t+K) for every position
    t ≥ ``first`` whose K targets lie inside its window."""
    from ..sae.activations import site_residuals

    N, L = sequences.shape
    T = L - max_offset
    if first >= T:
        raise InputError(
            f"windows of {L} tokens leave no position with {max_offset} targets",
            "use longer windows or a smaller --max-offset",
        )
    xs, ys, n = [], [], 0
    with torch.no_grad():
        for s in range(0, N, batch_size):
            tok = sequences[s : s + batch_size]
            x = site_residuals(adapter, tok.to(adapter.device), k)[:, first:T].detach().cpu()
            y = torch.stack([tok[:, first + j : T + j] for j in range(1, max_offset + 1)], dim=-1)
            xs.append(x.reshape(-1, x.shape[-1]))
            ys.append(y.reshape(-1, max_offset))
            n += xs[-1].shape[0]
            if max_positions is not None and n >= max_positions:
                break
    X, Y = torch.cat(xs), torch.cat(ys)
    if max_positions is not None:
        X, Y = X[:max_positions], Y[:max_positions]
    return X, Y


def train_lookahead_map(adapter: Any, X: Tensor, y: Tensor, offset: int, config: LookaheadConfig) -> LookaheadMap:
    """Train ``A`` (identity init) so that ``unembed(A x + b)`` predicts ``y``; returns the map and its SVD."""
    config.validate()
    gen = torch.Generator().manual_seed(config.seed + offset)
    n, d = X.shape
    perm = torch.randperm(n, generator=gen)
    n_tr = max(1, int(round(config.train_frac * n)))
    tr, va = perm[:n_tr], perm[n_tr:] if n_tr < n else perm[:n_tr]
    dev = adapter.device
    dt = next(iter(adapter.parameters())).dtype
    W = torch.eye(d, dtype=dt, device=dev).requires_grad_(True)
    b = torch.zeros(d, dtype=dt, device=dev).requires_grad_(True)
    opt = torch.optim.Adam([W, b], lr=config.lr)
    ce = torch.nn.functional.cross_entropy

    def loss_on(idx: Tensor, W_: Tensor, b_: Tensor) -> tuple[Tensor, Tensor]:
        logits = adapter.unembed(X[idx].to(device=dev, dtype=dt) @ W_.T + b_)
        tgt = y[idx].to(dev)
        return ce(logits.float(), tgt), (logits.argmax(-1) == tgt).double().mean()

    def evaluate(W_: Tensor, b_: Tensor) -> tuple[float, float]:
        tot, acc, m = 0.0, 0.0, 0
        with torch.no_grad():
            for s in range(0, va.shape[0], 4096):
                idx = va[s : s + 4096]
                l_, a_ = loss_on(idx, W_, b_)
                tot += float(l_) * idx.shape[0]
                acc += float(a_) * idx.shape[0]
                m += idx.shape[0]
        return tot / m, acc / m

    base_loss, _ = evaluate(torch.eye(d, dtype=dt, device=dev), torch.zeros(d, dtype=dt, device=dev))
    history = []
    for epoch in range(1, config.epochs + 1):
        order = tr[torch.randperm(tr.shape[0], generator=gen)]
        run = 0.0
        for s in range(0, order.shape[0], config.batch_size):
            loss, _ = loss_on(order[s : s + config.batch_size], W, b)
            gW, gb = torch.autograd.grad(loss, [W, b])  # the model's own weights get no gradient
            W.grad, b.grad = gW, gb
            opt.step()
            run += float(loss.detach()) * min(config.batch_size, order.shape[0] - s)
        vl, va_acc = evaluate(W, b)
        history.append(
            {"offset": offset, "epoch": epoch, "train_loss": run / order.shape[0], "val_loss": vl, "val_acc": va_acc}
        )
    vl, va_acc = evaluate(W, b)
    Wd = W.detach().double().cpu()
    _, S, Vh = torch.linalg.svd(Wd)
    return LookaheadMap(offset, Wd, b.detach().double().cpu(), S, Vh, vl, base_loss, va_acc, history)


def subspace_alignment(encoder: Tensor, right_vectors: Tensor) -> Tensor:
    """``cos(e_f, P_r e_f) = ‖V_rᵀ e_f‖ / ‖e_f‖`` for encoder columns ``encoder (d, F)`` and every rank
    r = 1..d (``right_vectors`` = Vᵀ, rows by decreasing singular value) → ``(F, d)``."""
    e = encoder.double()
    proj = right_vectors.double() @ e  # (d, F): coordinates along each right vector
    cum = torch.cumsum(proj**2, dim=0).T  # (F, d)
    return torch.sqrt(cum) / e.norm(dim=0)[:, None].clamp_min(1e-300)


def spearman(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Spearman's ρ and its two-sided p-value (NaN with fewer than 3 finite pairs)."""
    from scipy.stats import spearmanr

    m = np.isfinite(a) & np.isfinite(b)
    if m.sum() < 3 or np.ptp(a[m]) == 0 or np.ptp(b[m]) == 0:
        return math.nan, math.nan
    r = spearmanr(a[m], b[m])
    return float(r.statistic if hasattr(r, "statistic") else r[0]), float(r.pvalue if hasattr(r, "pvalue") else r[1])


@dataclass
class LookaheadResult:
    """Maps per offset, alignments ``(F, d)`` per offset, and Spearman correlations with Q per rank."""

    config: LookaheadConfig
    site: int
    features: list[int]
    maps: list[LookaheadMap]
    alignment: dict[int, np.ndarray]  # offset -> (F, d)
    correlation: dict[int, list[dict[str, float]]] = field(default_factory=dict)  # offset -> per rank

    def to_json(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "site": site_name(self.site),
            "features": self.features,
            "maps": [
                {
                    "offset": m.offset,
                    "val_loss": m.val_loss,
                    "val_loss_identity": m.val_loss_identity,
                    "val_acc": m.val_acc,
                    "singular_values": m.singular_values.tolist(),
                    "history": m.history,
                }
                for m in self.maps
            ],
            "alignment": {str(k): v.tolist() for k, v in self.alignment.items()},
            "correlation_with_q": {str(k): v for k, v in self.correlation.items()},
        }


def lookahead(
    adapter: Any,
    sae: Any,
    tokens: Any,
    config: LookaheadConfig | None = None,
    *,
    features: Sequence[int] | None = None,
    q: dict[int, float] | None = None,
    site: int | str | None = None,
) -> LookaheadResult:
    """Look-ahead maps at the SAE's own site (not the reference's ``resid_pre`` of that layer), encoder
    alignments and correlation with ``q`` (feature → Q; Spearman per rank over features with finite
    positive Q)."""
    from ..sae.activations import as_sequences
    from ..sae.model import sae_site

    config = config or LookaheadConfig()
    config.validate()
    k = sae_site(sae, adapter, site)
    seqs = as_sequences(tokens, adapter, prepend_bos=config.prepend_bos)
    first = 1 if config.prepend_bos and adapter.bos_id is not None else 0
    X, Y = lookahead_data(adapter, seqs, k, config.max_offset, first=first, max_positions=config.max_positions)
    feats = list(range(sae.d_sae)) if features is None else [int(f) for f in features]
    enc = sae.W_enc.detach()[:, feats].cpu()
    maps, align, corr = [], {}, {}
    for off in progress(range(1, config.max_offset + 1), desc="look-ahead maps", unit="map"):
        m = train_lookahead_map(adapter, X, Y[:, off - 1], off, config)
        maps.append(m)
        al = subspace_alignment(enc, m.right_vectors).numpy()
        align[off] = al
        if q:
            qv = np.array([q.get(f, math.nan) for f in feats], dtype=np.float64)
            qv = np.where(qv > 0, qv, math.nan)
            rows = []
            rounded = np.round(al, 12)  # exact ties (e.g. every cosine = 1 at full rank) stay ties
            for r in range(al.shape[1]):
                rho, p = spearman(rounded[:, r], qv)
                rows.append({"rank": r + 1, "rho": rho, "p": p})
            corr[off] = rows
    return LookaheadResult(config, k, feats, maps, align, corr)
