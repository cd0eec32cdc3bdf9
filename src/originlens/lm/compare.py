"""Leading-term features in real language models across training checkpoints (arXiv 2601.19208,
the Pythia comparison).

Per checkpoint and layer l (1-based, as in the paper) the model's mappings are compared with the corpus
statistics restricted to the K most frequent tokens (rows = tokens, in the statistics' order):

* **attention mapping** ``A_tok = E_pre A_emb E_preᵀ`` with ``A_emb = mean_h W_Q[h]ᵀ W_K[h]`` (d×d; the
  adapter convention is q_h = W_Q[h] x, so the token × token score matrix of head h is
  ``E_pre W_Q[h]ᵀ W_K[h] E_preᵀ``, rows = query token), against Q̄ (query × key);
* **embedding mapping** ``E_post`` (block output, MLP included) and **no-MLP embedding** ``E_attn`` against
  the value target Φ̄ᵀB̄ᵀ (rows = key token);
* **per head** (chosen layers): head h's ``E_pre W_Q[h]ᵀ W_K[h] E_preᵀ`` against Q̄.

``E_pre``/``E_attn``/``E_post`` are each token fed alone (length-1 sequence, no BOS), from
:meth:`~originlens.lm.adapter.LMAdapter.single_token_states`; biases, rotary, LayerNorm and 1/√d are
ignored, as in the paper.  The statistic is :func:`cov_cosine` (the paper's covariance cosine): theory
rows L2-normalised (zero rows stay zero), model rows not normalised, both row-centred, Frobenius cosine of
the token × token covariances.

How it stays fast: no K×K covariance and no K×K model matrix is ever formed.  With Z_A, Z_B the
row-centred matrices, ``tr(C_A C_B) = ‖Z_Aᵀ Z_B‖²`` and ``‖C‖ = ‖ZᵀZ‖`` (the smaller Gram).  The attention
mapping is low rank: ``Z_B = U V_cᵀ`` with ``U = E_pre W_Qᵀ`` and ``V_c = E_pre W_Kᵀ`` centred over tokens, so
``tr(C_A C_B) = tr(W Wᵀ R)`` with ``W = Uᵀ Z_A``, ``R = V_cᵀ V_c`` and ``‖C_B‖² = tr(P R P R)``, ``P = UᵀU``.  Per
checkpoint this is two matmuls against the theory (all layers stacked): O(K²·L·d) flops; heads are
diagonal blocks of the same products.  Tokens are processed in chunks, so the model states never
exceed ``token_chunk`` rows; accumulators take O(K·L·d) memory per variant, the theory one K×K matrix per
target and non-null variant (the null shares it through a row permutation applied per chunk).  At
K = 20,000 in float64 a K×K matrix is 3.2 GB: keep the variants few, or use ``dtype="float32"``.

The statistics in the model's tokenizer (windows, top-K tokens, vocabulary checks) come from
:mod:`originlens.lm.compare_statistics`; :mod:`originlens.lm.compare_report` draws the heatmaps and writes
the run directory (:func:`~originlens.lm.compare_report.write_comparison`).

Extensions (beyond the paper's statistic; :data:`VARIANTS`):

* ``null_baseline`` (on by default, since the statistic's chance level is high): the same cosines against the theory with its token rows randomly permuted (one fixed
  permutation): the agreement a mapping gets without any token correspondence.  The paper's statistic
  has a high chance level: its "covariances" are Gram matrices of row-centred rows, so a component shared
  by all tokens (a common mean row, e.g. anisotropic embeddings) makes both close to a multiple of 11ᵀ.
* ``token_centred``: the cosine after also centring each column over the tokens (J Z with
  J = I − 11ᵀ/K on both sides), which removes that shared component; same fast path (the theory is
  centred once, the model side needs only Σ_tokens U and Σ_tokens Z_B).

Caveats: the comparison is empirical (the theorem covers attention-only models from near-zero init);
E_pre of layer 1 is the raw token embedding.  Statistics given precomputed (``--stats``) are used as
they are (their BOS handling is whatever produced them).  Results are float64 by default;
``dtype="float32"`` is for very large K on an accelerator.

Size: the statistic, its per-checkpoint evaluation, the sweep over checkpoints and the null-level warning
are one computation with one result type (:class:`ComparisonResult`); its statistics inputs and its report
live apart (:mod:`.compare_statistics`, :mod:`.compare_report`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..errors import CompatibilityError, ConfigError, InputError, NumericalError
from ..progress import progress

MAPPINGS = ("attention", "embedding_no_mlp", "embedding")
PANEL_TITLES = {
    "attention": "Attention Mapping",
    "embedding_no_mlp": "No MLP Embedding",
    "embedding": "Embedding Mapping",
}
RESULTS_KIND = "originlens.lm-compare"


# ----------------------------------------------------------------------------------------------------
# the statistic


def row_normalise(A: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm; zero rows stay zero (float64)."""
    A = np.asarray(A, dtype=np.float64)
    n = np.linalg.norm(A, axis=1, keepdims=True)
    return np.divide(A, n, out=np.zeros_like(A), where=n > 0)


def _gram_norm(Z: Any) -> float:
    """‖Z Zᵀ‖_F computed through the smaller of the two Grams (‖Z Zᵀ‖_F = ‖Zᵀ Z‖_F)."""
    G = Z.T @ Z if Z.shape[1] <= Z.shape[0] else Z @ Z.T
    return float((G * G).sum()) ** 0.5


def cov_cosine(A_theory: Any, B_model: Any, *, centre_tokens: bool = False) -> float:
    """The paper's covariance cosine (rows = tokens in both; float64).

    ``A_theory`` is row-normalised (zero rows stay zero), ``B_model`` is not; both are centred row-wise
    and ``tr(cov(A)ᵀ cov(B)) / (‖cov(A)‖ ‖cov(B)‖)`` is returned, computed as
    ``‖Z_Aᵀ Z_B‖² / (‖Z_AᵀZ_A‖ ‖Z_BᵀZ_B‖)`` (no tokens × tokens matrix).  NaN when either covariance is 0.
    ``centre_tokens=True`` (not in the paper) also centres each column over the tokens, removing the
    component shared by all tokens (the mean row), which otherwise makes unrelated matrices look alike.
    """
    A = np.asarray(A_theory, dtype=np.float64)
    B = np.asarray(B_model, dtype=np.float64)
    if A.ndim != 2 or B.ndim != 2 or A.shape[0] != B.shape[0]:
        raise ConfigError(
            f"cov_cosine needs two matrices with the same number of rows (tokens), got {A.shape} and {B.shape}",
            "pass token × feature matrices in the same token order",
        )
    ZA = row_normalise(A)
    ZA -= ZA.mean(axis=1, keepdims=True)
    ZB = B - B.mean(axis=1, keepdims=True)
    if centre_tokens:
        ZA -= ZA.mean(axis=0, keepdims=True)
        ZB -= ZB.mean(axis=0, keepdims=True)
    den = _gram_norm(ZA) * _gram_norm(ZB)
    if den == 0.0:
        return float("nan")
    M = ZA.T @ ZB
    return float((M * M).sum()) / den


# ----------------------------------------------------------------------------------------------------
# theory side (prepared once per statistics)


@dataclass
class TheoryTarget:
    """A theory matrix ready for comparison: ``Z`` (K, m) row-normalised and row-centred (torch),
    ``cov_norm`` = ‖Z Zᵀ‖_F, and optionally ``rows`` (K,), a permutation of the token rows applied on
    the fly (the null baseline shares ``Z`` with the true target)."""

    name: str
    Z: Any
    cov_norm: float
    rows: Any = None

    def block(self, start: int, stop: int) -> Any:
        """Rows ``start:stop`` of the (permuted) target, ``(stop − start, m)``."""
        return self.Z[start:stop] if self.rows is None else self.Z.index_select(0, self.rows[start:stop])

    @property
    def size(self) -> int:
        return int(self.Z.shape[0])

    def permuted(self, permutation: np.ndarray, name: str = "") -> TheoryTarget:
        """The same target with token rows permuted (no copy; ‖Z Zᵀ‖ is permutation invariant)."""
        import torch

        rows = torch.as_tensor(np.asarray(permutation, dtype=np.int64), device=self.Z.device)
        return TheoryTarget(name or self.name, self.Z, self.cov_norm, rows)


def prepare_theory(
    A: np.ndarray,
    name: str = "",
    *,
    device: str = "cpu",
    dtype: str = "float64",
    block: int = 2048,
    centre_tokens: bool = False,
) -> TheoryTarget:
    """Row-normalise and row-centre (and optionally centre over tokens) theory matrix ``A`` (K, m).

    ``‖Z Zᵀ‖_F`` is accumulated over column blocks of ``ZᵀZ`` so no second K×K matrix is formed.
    """
    import torch

    Z = row_normalise(A)
    Z -= Z.mean(axis=1, keepdims=True)
    if centre_tokens:
        Z -= Z.mean(axis=0, keepdims=True)
    Zt = torch.from_numpy(np.ascontiguousarray(Z)).to(device=device, dtype=_torch_dtype(dtype))
    del Z
    sq = 0.0
    for s in range(0, Zt.shape[1], block):
        G = Zt[:, s : s + block].T @ Zt
        sq += float((G * G).sum())
    return TheoryTarget(name, Zt, sq**0.5)


def _torch_dtype(name: str):
    import torch

    table = {"float64": torch.float64, "float32": torch.float32}
    if name not in table:
        raise ConfigError(f"unknown dtype {name!r}", "use float64 or float32")
    return table[name]


# ----------------------------------------------------------------------------------------------------
# one checkpoint


VARIANTS = ("spec", "null", "token_centred", "token_centred_null")
VARIANT_TITLES = {
    "spec": "covariance cosine (the paper's statistic)",
    "null": "null baseline: theory token rows permuted",
    "token_centred": "token-centred covariance cosine (mean row removed; not in the paper)",
    "token_centred_null": "token-centred, theory token rows permuted",
}


@dataclass
class CheckpointCosines:
    """Cosines of one checkpoint: ``values[variant][mapping]`` (n_layers,) and
    ``heads[variant][layer]`` (n_heads,) for each computed variant (``"spec"`` always)."""

    values: dict[str, dict[str, np.ndarray]]
    heads: dict[str, dict[int, np.ndarray]]
    seconds: float = 0.0


def _ratio(num: float, a: float, b: float) -> float:
    den = a * b
    return float(num / den) if den > 0 and math.isfinite(den) else float("nan")


def prepare_targets(
    stats: Any, *, variants: Sequence[str] = ("spec",), device: str = "cpu", dtype: str = "float64", seed: int = 0
) -> dict[str, dict[str, TheoryTarget]]:
    """``{variant: {"query_key": …, "value_target": …}}`` for the requested :data:`VARIANTS`."""
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or "spec" not in variants:
        raise ConfigError(
            f"variants must include 'spec' and be among {VARIANTS}, got {list(variants)}", "e.g. ('spec', 'null')"
        )
    perm = np.random.default_rng(seed).permutation(stats.size)
    out: dict[str, dict[str, TheoryTarget]] = {}
    for v in sorted(variants, key=lambda v: v.endswith("null")):  # true targets first, nulls share them
        base = {"null": "spec", "token_centred_null": "token_centred"}.get(v)
        if base is not None:
            if base not in out:
                raise ConfigError(f"variant {v!r} needs {base!r} as well", f"add {base!r} to the variants")
            out[v] = {key: t.permuted(perm, f"{t.name}:null") for key, t in out[base].items()}
        else:
            out[v] = {
                key: prepare_theory(
                    getattr(stats, key), f"{key}:{v}", device=device, dtype=dtype, centre_tokens=v == "token_centred"
                )
                for key in ("query_key", "value_target")
            }
    return {v: out[v] for v in variants}


def checkpoint_cosines(
    adapter: Any,
    token_ids: Sequence[int],
    targets: Mapping[str, Mapping[str, TheoryTarget]],
    *,
    layers: Sequence[int],
    head_layers: Sequence[int] = (),
    token_chunk: int = 4096,
    device: str = "cpu",
    dtype: str = "float64",
) -> CheckpointCosines:
    """Cosines of one model against the prepared theory (fast path, see the module docstring).

    ``token_ids`` (K,) are model token ids in the theory's row order; ``targets`` comes from
    :func:`prepare_targets`; ``layers`` and ``head_layers`` are 0-based (``head_layers`` ⊆ ``layers``).
    Returned arrays are indexed like ``layers``.
    """
    import torch

    t0 = time.perf_counter()
    dt = _torch_dtype(dtype)
    ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64))
    K = len(ids)
    for tv in targets.values():
        for key in ("query_key", "value_target"):
            if tv[key].size != K:
                raise CompatibilityError(
                    f"theory {key} has {tv[key].size} rows but {K} tokens were given",
                    "use the token ids of the same statistics",
                )
    variants = list(targets)
    layers = [int(l) for l in layers]
    if not layers:
        raise ConfigError("no layers selected", "select at least one layer")
    bad = [l + 1 for l in head_layers if l not in layers]
    if bad:
        raise ConfigError(f"per-head layers {bad} are not among the compared layers", "include them in --layers")
    nl, d = len(layers), int(adapter.d_model)
    chunk = max(1, int(token_chunk))
    WQ, WK = [], []
    with torch.no_grad():
        for l in layers:
            q, k = adapter.qk_weights(l)
            WQ.append(q.detach().reshape(-1, d).to(device=device, dtype=dt))
            WK.append(k.detach().reshape(-1, d).to(device=device, dtype=dt))
        H = int(adapter.qk_weights(layers[0])[0].shape[0])
        r = WQ[0].shape[0]
        z = dict(device=device, dtype=dt)
        W = {v: torch.zeros(nl * r, K, **z) for v in variants}  # Uᵀ Z_Q, all layers stacked
        P = torch.zeros(nl, r, r, **z)  # UᵀU
        us = torch.zeros(nl, r, **z)  # Σ_tokens U
        VV = torch.zeros(nl, r, r, **z)  # VᵀV (uncentred)
        vs = torch.zeros(nl, r, **z)  # Σ_tokens V
        G = {v: torch.zeros(K, 2 * nl * d, **z) for v in variants}  # Z_Vᵀ [Z_attn | Z_post]
        S = torch.zeros(2 * nl, d, d, **z)  # Z_BᵀZ_B per block
        bs = torch.zeros(2 * nl, d, **z)  # Σ_tokens Z_B
        model_device = adapter.device
        for s in range(0, K, chunk):
            e = min(K, s + chunk)
            st = adapter.single_token_states(ids[s:e].to(model_device))
            sel = torch.as_tensor(layers, device=st.pre.device)
            pre = st.pre.index_select(0, sel).to(**z)  # (nl, n, d)
            U = torch.stack([pre[i] @ WQ[i].T for i in range(nl)])  # (nl, n, r)
            V = torch.stack([pre[i] @ WK[i].T for i in range(nl)])
            P += U.transpose(1, 2) @ U
            us += U.sum(dim=1)
            VV += V.transpose(1, 2) @ V
            vs += V.sum(dim=1)
            U_all = U.permute(1, 0, 2).reshape(e - s, nl * r)
            for v in variants:
                W[v] += U_all.T @ targets[v]["query_key"].block(s, e)
            del U, V, U_all, pre
            emb = torch.cat([st.attn.index_select(0, sel), st.post.index_select(0, sel)]).to(**z)
            del st
            emb = emb - emb.mean(dim=2, keepdim=True)  # centre each token's row
            S += emb.transpose(1, 2) @ emb
            bs += emb.sum(dim=1)
            emb_all = emb.permute(1, 0, 2).reshape(e - s, 2 * nl * d)
            for v in variants:
                G[v] += targets[v]["value_target"].block(s, e).T @ emb_all
            del emb, emb_all
        R = VV - torch.einsum("la,lb->lab", vs, vs) / K  # V_cᵀV_c (centred over tokens)
        # token-centred model side: Uᵀ J U and Z_Bᵀ J Z_B (J = I − 11ᵀ/K); the theory side is centred already
        Pc = P - torch.einsum("la,lb->lab", us, us) / K
        Sc = S - torch.einsum("la,lb->lab", bs, bs) / K
        values: dict[str, dict[str, np.ndarray]] = {}
        heads_out: dict[str, dict[int, np.ndarray]] = {}
        dh = r // H
        for v in variants:
            tc = v.startswith("token_centred")
            PP, SS = (Pc, Sc) if tc else (P, S)
            qa, va = targets[v]["query_key"].cov_norm, targets[v]["value_target"].cov_norm
            att, no_mlp, post = np.empty(nl), np.empty(nl), np.empty(nl)
            heads: dict[int, np.ndarray] = {}
            for i, l in enumerate(layers):
                Wl = W[v][i * r : (i + 1) * r]
                WW = Wl @ Wl.T
                Ri, Pi = R[i], PP[i]
                M = Pi @ Ri
                att[i] = _ratio(float((WW * Ri).sum()), qa, float((M * M.T).sum()) ** 0.5)
                Ga = G[v][:, i * d : (i + 1) * d]
                Gp = G[v][:, (nl + i) * d : (nl + i + 1) * d]
                no_mlp[i] = _ratio(float((Ga * Ga).sum()), va, float((SS[i] * SS[i]).sum()) ** 0.5)
                post[i] = _ratio(float((Gp * Gp).sum()), va, float((SS[nl + i] * SS[nl + i]).sum()) ** 0.5)
                if l in head_layers:
                    hv = np.empty(H)
                    for h in range(H):
                        b = slice(h * dh, (h + 1) * dh)
                        Mh = Pi[b, b] @ Ri[b, b]
                        hv[h] = _ratio(float((WW[b, b] * Ri[b, b]).sum()), qa, float((Mh * Mh.T).sum()) ** 0.5)
                    heads[l] = hv
            values[v] = {"attention": att, "embedding_no_mlp": no_mlp, "embedding": post}
            heads_out[v] = heads
    return CheckpointCosines(values, heads_out, time.perf_counter() - t0)


# ----------------------------------------------------------------------------------------------------
# the sweep


@dataclass
class CompareConfig:
    """Settings of a comparison (layers are 1-based; ``None`` = all).

    ``null_baseline`` adds the permuted-token baseline, ``token_centred`` the token-centred cosine
    (both extensions, see the module docstring); ``null_seed`` fixes the permutation.
    """

    top_tokens: int = 2000
    layers: Sequence[int] | None = None
    head_layers: Sequence[int] = ()
    null_baseline: bool = True
    token_centred: bool = False
    null_seed: int = 0
    token_chunk: int = 4096
    device: str = "cpu"
    dtype: str = "float64"

    @property
    def variants(self) -> list[str]:
        out = ["spec"] + (["null"] if self.null_baseline else [])
        if self.token_centred:
            out += ["token_centred"] + (["token_centred_null"] if self.null_baseline else [])
        return out


@dataclass
class ComparisonResult:
    """Cosines of every checkpoint: ``cosines[variant][mapping]`` (n_layers, n_checkpoints) and
    ``heads[variant][layer]`` (n_heads, n_checkpoints); layers are 1-based; variant ``"spec"`` is the
    paper's statistic."""

    labels: list[str]
    layers: list[int]
    cosines: dict[str, dict[str, np.ndarray]]
    heads: dict[str, dict[int, np.ndarray]]
    grid: dict[str, Any] = field(default_factory=dict)
    statistics: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        def arr(a: np.ndarray) -> list:
            return [[None if not math.isfinite(x) else round(float(x), 6) for x in row] for row in a]

        return {
            "kind": RESULTS_KIND,
            "labels": self.labels,
            "layers": self.layers,
            "cosines": {v: {k: arr(m) for k, m in d.items()} for v, d in self.cosines.items()},
            "heads": {v: {str(l): arr(m) for l, m in d.items()} for v, d in self.heads.items()},
            "grid": self.grid,
            "statistics": self.statistics,
            "model": self.model,
            "config": self.config,
            "timings": self.timings,
            "warnings": self.warnings,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ComparisonResult:
        """The result :meth:`to_json` wrote (``null`` cosines read back as NaN; values as rounded there)."""
        if d.get("kind") != RESULTS_KIND:
            raise InputError("not the results of a checkpoint comparison", "pass an `lm compare` run directory")

        def arr(rows: list) -> np.ndarray:
            return np.array([[np.nan if x is None else float(x) for x in row] for row in rows], dtype=np.float64)

        return cls(
            labels=list(d["labels"]),
            layers=[int(x) for x in d["layers"]],
            cosines={v: {k: arr(m) for k, m in m_.items()} for v, m_ in d["cosines"].items()},
            heads={v: {int(l): arr(m) for l, m in m_.items()} for v, m_ in d["heads"].items()},
            grid=dict(d.get("grid") or {}),
            statistics=dict(d.get("statistics") or {}),
            model=dict(d.get("model") or {}),
            config=dict(d.get("config") or {}),
            timings=dict(d.get("timings") or {}),
            warnings=list(d.get("warnings") or []),
        )


StatsProvider = Callable[[Any], Any]


def statistics_info(stats: Any) -> dict[str, Any]:
    return {
        "K": int(stats.size),
        "vocab_size": int(stats.vocab_size),
        "seq_len": int(stats.seq_len),
        "n_pairs": int(stats.n_pairs),
        "centering": float(stats.centering),
        "token_ids_head": [
            int(i) for i in (stats.token_ids[:20] if stats.token_ids is not None else range(min(20, stats.size)))
        ],
        "tokens_head": list(stats.vocab[:20]) if stats.vocab is not None else None,
        "meta": dict(stats.meta),
    }


def _arch(adapter: Any) -> tuple[int, int, int, int]:
    return (int(adapter.n_layers), int(adapter.d_model), int(adapter.n_heads), int(adapter.vocab_size))


def compare_checkpoints(
    grid: Any,
    statistics: Any | StatsProvider,
    config: CompareConfig | None = None,
    *,
    check_model: Callable[[str, Any], list[str]] | None = None,
) -> ComparisonResult:
    """Run the checkpoint comparison over a :class:`~originlens.lm.checkpoints.CheckpointGrid` (or any iterable
    of ``(label, adapter)`` with ``len``).

    ``statistics``: a :class:`~originlens.stats.CorpusStatistics` (rows = its ``token_ids``, which are
    model token ids), or a callable ``adapter -> CorpusStatistics`` evaluated on the first checkpoint
    (to tokenise the corpus with that model's tokenizer).  ``check_model(label, adapter)`` may raise
    for an incompatible checkpoint and returns warnings.  Checkpoints must share the architecture and
    vocabulary.
    """
    cfg = config or CompareConfig()
    t_start = time.perf_counter()
    labels: list[str] = []
    per: list[CheckpointCosines] = []
    warnings: list[str] = []
    state: dict[str, Any] = {}
    t_stats = 0.0
    load_times: list[float] = []
    t_prev = time.perf_counter()
    for label, adapter in progress(grid, total=len(grid), desc="checkpoints", unit="ckpt"):
        load_times.append(time.perf_counter() - t_prev)
        if check_model is not None:
            warnings += [f"{label}: {w}" for w in check_model(label, adapter)]
        if not state:
            ts = time.perf_counter()
            stats = statistics(adapter) if callable(statistics) else statistics
            t_stats = time.perf_counter() - ts
            state.update(_prepare(stats, adapter, cfg))
            state["arch"] = _arch(adapter)
        elif _arch(adapter) != state["arch"]:
            raise CompatibilityError(
                f"checkpoint {label!r} has another architecture or vocabulary "
                f"(layers, d, heads, |V|) = {_arch(adapter)} vs {state['arch']}",
                "compare checkpoints of one model",
            )
        res = checkpoint_cosines(
            adapter,
            state["token_ids"],
            state["targets"],
            layers=state["layers0"],
            head_layers=state["heads0"],
            token_chunk=cfg.token_chunk,
            device=cfg.device,
            dtype=cfg.dtype,
        )
        labels.append(label)
        per.append(res)
        del adapter
        t_prev = time.perf_counter()
    if not per:
        raise InputError("no checkpoint could be compared (all were skipped)", "check the checkpoint list")
    variants = cfg.variants
    cos = {v: {k: np.stack([p.values[v][k] for p in per], axis=1) for k in MAPPINGS} for v in variants}
    heads = {v: {l + 1: np.stack([p.heads[v][l] for p in per], axis=1) for l in state["heads0"]} for v in variants}
    result = ComparisonResult(labels=labels, layers=[l + 1 for l in state["layers0"]], cosines=cos, heads=heads)
    result.grid = grid.summary() if hasattr(grid, "summary") else {}
    result.statistics = state["stats_info"]
    n_layers, d, H, V = state["arch"]
    result.model = {"n_layers": n_layers, "d_model": d, "n_heads": H, "vocab_size": V}
    result.config = {**asdict(cfg), "variants": variants}
    result.warnings = (
        warnings
        + [f"checkpoint {x['label']} has the same weights as {x['same_as']}" for x in result.grid.get("duplicates", [])]
        + null_level_warnings(result)
    )
    result.timings = {
        "statistics_s": round(t_stats, 3),
        "theory_prepare_s": round(state["prep_s"], 3),
        "load_s": [round(x, 3) for x in load_times],
        "compare_s": [round(p.seconds, 3) for p in per],
        "total_s": round(time.perf_counter() - t_start, 3),
    }
    return result


def _prepare(stats: Any, adapter: Any, cfg: CompareConfig) -> dict[str, Any]:
    t0 = time.perf_counter()
    K = stats.size
    token_ids = np.arange(K) if stats.token_ids is None else np.asarray(stats.token_ids, dtype=np.int64)
    if int(token_ids.max()) >= adapter.vocab_size:
        raise CompatibilityError(
            f"the statistics use token ids up to {int(token_ids.max())} but the model has {adapter.vocab_size} tokens",
            "use statistics in the model's tokenizer",
        )
    L = adapter.n_layers
    layers1 = list(range(1, L + 1)) if cfg.layers is None else [int(l) for l in cfg.layers]
    bad = [l for l in list(layers1) + list(cfg.head_layers) if not 1 <= int(l) <= L]
    if bad:
        raise ConfigError(f"layer(s) {bad} out of range for a {L}-layer model (layers are 1-based)", f"use 1..{L}")
    layers1 = sorted(set(layers1) | {int(l) for l in cfg.head_layers})
    targets = prepare_targets(stats, variants=cfg.variants, device=cfg.device, dtype=cfg.dtype, seed=cfg.null_seed)
    for key in ("query_key", "value_target"):
        if targets["spec"][key].cov_norm == 0:
            raise NumericalError(
                f"the theory matrix {key} has zero covariance (constant rows)",
                "use a corpus with more text or more tokens",
            )
    return {
        "token_ids": token_ids,
        "targets": targets,
        "layers0": [l - 1 for l in layers1],
        "heads0": sorted({int(l) - 1 for l in cfg.head_layers}),
        "stats_info": statistics_info(stats),
        "prep_s": time.perf_counter() - t0,
    }


# ----------------------------------------------------------------------------------------------------
# the null level


NULL_MARGIN = 0.02  # a cosine within this of its token-permuted null is reported as null-level agreement


def null_level_warnings(result: ComparisonResult, margin: float = NULL_MARGIN) -> list[str]:
    """One warning per (variant, mapping) whose cosine is within ``margin`` of the token-permuted null at
    some (layer, checkpoint): there the agreement needs no token correspondence at all."""
    out = []
    for v, null in (("spec", "null"), ("token_centred", "token_centred_null")):
        if v not in result.cosines or null not in result.cosines:
            continue
        for key in MAPPINGS:
            real, base = np.asarray(result.cosines[v][key]), np.asarray(result.cosines[null][key])
            close = np.abs(real - base) < margin
            if close.any():
                out.append(
                    f"{VARIANT_TITLES[v]}: {PANEL_TITLES[key]} is within {margin} of its token-permuted null "
                    f"at {int(close.sum())} of {close.size} (layer, checkpoint) cells (max cosine "
                    f"{float(real.max()):.3f} vs null {float(base.max()):.3f}): null-level agreement, "
                    f"not evidence of the leading term"
                )
    return out
