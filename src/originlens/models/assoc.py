"""The one-hot attention-only transformer of arXiv 2601.19208, Definition 3.1 (spec §2).

Parameters (paper numbering, layers l = 1..L)::

    W_O          |V|×|V|   unembedding, applied once at the end
    W[l]         |V|×|V|   tied query-key bilinear form
    V[l]         |V|×|V|   value matrix (no output projection)
    P[l]         length T  relative-position bias, DM(p)[t, t−d] = p[d] (d = 0: self)

Forward for one sequence (h0 = X one-hot, rows = positions, matrices act on the right)::

    S   = h W[l] hᵀ + DM(P[l]);  A = softmax(causal_mask(S))  (diagonal kept)
    h  <- h + A h V[l]
    logits = h W_O

No 1/√d scaling, LayerNorm, MLP, biases or heads.  Loss: mean cross-entropy over all N·T positions.

Three implementations of the same function (``impl``):

* ``"paths"`` — path expansion.  Because h0 = X is one-hot, the residual stream is exactly
  ``h_l = Σ_{S ⊆ {1..l}} A_S X V_S`` with ``A_S = A_{s_k}…A_{s_1}`` (T×T, per sequence) and
  ``V_S = V_{s_1}…V_{s_k}`` (|V|×|V|, batch independent).  Hence scores are
  ``Σ_{S,S'} A_S (V_S W V_{S'}ᵀ)[x, x] A_{S'}ᵀ`` (gathers of |V|×|V| matrices at token pairs) and logits
  ``W_O[x] + Σ_{S≠∅} A_S (V_S W_O)[x]`` (row gathers).  No (B·T)×|V|×|V| product is formed.  The
  batch-independent products (:meth:`AssocModel.path_products`; 25 |V|³ products at L = 3, stacked into
  9 matmuls) are computed once per optimiser step however many chunks the batch is split into; the
  per-batch part (:class:`_PathPass`) has a hand-written backward (no autograd graph over (B, T, |V|)
  tensors), and :meth:`AssocModel.accumulate_gradients` forms logits, cross-entropy and their gradients
  chunk by chunk in small reused buffers without ever holding the (B, T, |V|) logits.  Per step the cost
  is ≈ 3·(25 |V|³ + 7·B·T²·|V|) multiply-adds at L = 3: best when B·T ≫ |V| and L is small (the paper's
  L = 3); the |V|³ products do not shrink with the batch, so the gain over "dense" grows with it.
* ``"gather"`` — first layer by gathers (``W[x_t, x_j]``, ``V[x_j]``), deeper layers dense matmuls on
  the (B, T, |V|) residual stream.  Per-batch cost ≈ (2L − 1)·B·T·|V|².
* ``"dense"`` — the straightforward one-hot implementation (reference for tests and benchmarks),
  ≈ (2L + 1)·B·T·|V|².

``"auto"`` (default) picks between ``"paths"`` and ``"gather"`` with a cost estimate (:func:`path_cost`).
All three agree to round-off (same terms, different summation order; float64 ≈ 1e-13 relative); the
hand-written backward is tested against Lemma D.7's gradients, the dense implementation and finite
differences.  Speed: ``benchmarks/assoc_train.py`` (figures in the benchmark notes).

Memory: "paths" keeps per chunk the attention products (B, T, (2^L − 1)·T) and the gathered pair
matrices (2^{L−1}, B, T, 2^{L−1}·T) of each layer; rows of the logits path are gathered ≈ 16 MiB at a
time (CPU).  The training loop reuses these buffers from step to step (:class:`Workspace`, released with
:meth:`AssocModel.release_workspace`).  Runs on CPU or CUDA (all tensors on the parameters' device).

Threads: on CPU the per-chunk loop of the logits path (hundreds of small ops per step) runs on
``torch.get_num_threads()`` worker threads with single-threaded ops — chunk k on worker k mod n, per-worker
gradient accumulators summed in a fixed order (deterministic for a given thread count; different thread
counts differ by round-off) — instead of paying an intra-op thread barrier per op, which stalls
whenever a core is busy with another process.  The |V|³ products and the attention part use torch's
intra-op threads.

Saved weights use the paper's 1-based layer numbers: keys ``W_O``, ``W.1``…``W.L``, ``V.l``, ``P.l``
(:meth:`AssocModel.weights` / :meth:`AssocModel.load_weights`); the torch ``state_dict`` keeps
``nn.ParameterList``'s 0-based keys and is not the on-disk format.
"""
from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import CompatibilityError, ConfigError, InputError

IMPLS = ("auto", "paths", "gather", "dense")
MODEL_KIND = "assoc-model"
CHECKPOINT_KIND = "assoc-checkpoint"


@dataclass
class AssocConfig:
    """Shape and initialisation of an :class:`AssocModel`.

    ``init``: ``"zero"`` (paper experiments, Thm D.9) or ``"gaussian"`` (i.i.d. N(0, init_std²) on every
    parameter, Thm D.12 uses std = v/|V|^{1+ξ}).  ``seed`` seeds the Gaussian draw.
    """

    vocab_size: int
    seq_len: int
    n_layers: int = 3
    init: str = "zero"
    init_std: float = 0.0
    dtype: str = "float32"
    seed: int = 0
    impl: str = "auto"

    def validate(self) -> None:
        if int(self.vocab_size) < 1:
            raise ConfigError(f"vocab_size must be ≥ 1 (got {self.vocab_size})", "pass a positive vocabulary size")
        if int(self.seq_len) < 1:
            raise ConfigError(f"seq_len must be ≥ 1 (got {self.seq_len})", "pass T ≥ 1")
        if int(self.n_layers) < 1:
            raise ConfigError(f"n_layers must be ≥ 1 (got {self.n_layers})", "pass L ≥ 1")
        if self.init not in ("zero", "gaussian"):
            raise ConfigError(f"unknown init '{self.init}'", "use init='zero' or init='gaussian'")
        if self.init == "gaussian" and not (self.init_std > 0 and math.isfinite(self.init_std)):
            raise ConfigError(f"gaussian init needs init_std > 0 (got {self.init_std})", "pass init_std")
        if self.dtype not in ("float32", "float64"):
            raise ConfigError(f"dtype must be float32 or float64 (got {self.dtype})", "pick one of the two")
        if self.impl not in IMPLS:
            raise ConfigError(f"unknown impl '{self.impl}'", f"use one of {', '.join(IMPLS)}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.float64 if self.dtype == "float64" else torch.float32


def weight_names(n_layers: int) -> list[str]:
    """On-disk names in a fixed order: ``W_O``, then ``W.l``, ``V.l``, ``P.l`` for l = 1..L."""
    names = ["W_O"]
    for l in range(1, n_layers + 1):
        names += [f"W.{l}", f"V.{l}", f"P.{l}"]
    return names


BMM_PENALTY = 2.0    # batched T-sized products run ~2× slower per multiply-add than large GEMMs
ELEMENT_COST = 20.0  # one gathered/scattered element costs about as much as 20 GEMM multiply-adds


def path_cost(batch: int, seq_len: int, vocab: int, n_layers: int) -> dict[str, float]:
    """Cost estimates of one forward + backward in GEMM multiply-add equivalents (calibrated on CPU:
    batched T-sized products weighted by ``BMM_PENALTY``, memory-bound gathers/scatters by
    ``ELEMENT_COST`` per element); used by ``impl="auto"``.

    ``paths``: 3 × (number of |V|³ products) × |V|³ + 3·m·B·T²·|V| for the logits path (m = 2^L − 1) +
    the attention mixing + gathers/scatters of K entries and Z rows.
    """
    B, T, V, L = batch, seq_len, vocab, n_layers
    m = 2 ** L - 1
    n_prod = m                                                   # V_S W_O
    mix = 0.0
    elems = 2 * m * B * T * V                                    # Z rows gathered, their gradients scattered
    for l in range(1, L + 1):
        k = 2 ** (l - 1)
        n_prod += (k - 1) + k * (k - 1)                          # V_S W and V_S W V_S'ᵀ
        mix += 3 * (k * B * T * T * k * T + B * T * T * k * T)   # Y = Σ A_S G[S], s = Y Acatᵀ, ×3 with backward
        elems += 2 * B * T * T * k * k                           # K entries gathered and scattered
    paths = 3 * n_prod * V ** 3 + BMM_PENALTY * (3 * m * B * T * T * V + mix) / 2 + ELEMENT_COST * elems
    gather = ((2 * L - 1) * 3 * B * T * V * V + BMM_PENALTY * (2 * L - 1) * 3 * B * T * T * V
              + ELEMENT_COST * 4 * B * T * V)
    dense = (2 * L + 1) * 3 * B * T * V * V + BMM_PENALTY * 2 * L * 3 * B * T * T * V + ELEMENT_COST * B * T * V
    return {"paths": float(paths), "gather": float(gather), "dense": float(dense)}


def diag_matrix(p: torch.Tensor, T: int) -> torch.Tensor:
    """DM(p) restricted to T positions: (T, T) with DM[t, t−d] = p[d] for t ≥ d, 0 above the diagonal."""
    t = torch.arange(T, device=p.device)
    off = t[:, None] - t[None, :]
    return torch.where(off >= 0, p[off.clamp(min=0)], torch.zeros((), dtype=p.dtype, device=p.device))


def _causal_softmax(scores: torch.Tensor) -> torch.Tensor:
    T = scores.shape[-1]
    mask = torch.ones(T, T, dtype=torch.bool, device=scores.device).triu(1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)


ROWS_BYTES = {"cpu": 16 * 1024 ** 2, "other": 1024 ** 3}   # gathered rows per chunk of the logits path


class Workspace:
    """Reusable scratch tensors keyed by name (one flat buffer per name, grown on demand).

    Large fresh allocations are expensive on CPU (every first touch of a new page faults); the training
    loop reuses these buffers from step to step.  A tensor handed out under a name is valid until the
    same name is requested again.
    """

    def __init__(self) -> None:
        self._bufs: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, *,
            zero: bool = False) -> torch.Tensor:
        n = math.prod(shape)
        buf = self._bufs.get(name)
        if buf is None or buf.numel() < n or buf.dtype != dtype or buf.device != device:
            buf = torch.empty(n, dtype=dtype, device=device)
            self._bufs[name] = buf
        out = buf[:n].view(shape)
        return out.zero_() if zero else out

    def clear(self) -> None:
        self._bufs.clear()


class _Fresh:
    """Workspace stand-in that always allocates (autograd path: tensors may outlive the call)."""

    @staticmethod
    def get(name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, *,
            zero: bool = False) -> torch.Tensor:
        return (torch.zeros if zero else torch.empty)(shape, dtype=dtype, device=device)


def _pair_layout(x: torch.Tensor, n: int, V: int) -> torch.Tensor:
    """Flat indices into K_l viewed as (n, n·|V|²): entry (b, i, S', j) → S'·|V|² + x_i·|V| + x_j."""
    B, T = x.shape
    idx = (x[:, :, None, None] * V + x[:, None, None, :]
           + torch.arange(n, device=x.device)[None, None, :, None] * (V * V))
    return idx.reshape(-1)


class _PathPass:
    """Forward and hand-written backward of the path expansion on one chunk (no autograd inside).

    Inputs (one device, one dtype): token ids ``x`` (B, T); the batch-independent products of
    :meth:`AssocModel.path_products` — ``Ks[l]`` (n², |V|²) with n = 2^l (0-based l), row S·n + S' holding
    K_{S,S'} = V_S W V_{S'}ᵀ, and ``Z`` ((2^L − 1)·|V|, |V|) = [V_S W_O]_{S≠∅} — plus ``W_O`` and the
    position vectors ``Ps[l]`` (length ≥ T).  Subsets S of the earlier layers are bitmasks; A_∅ = I and
    the attention products A_S (B, T, T) of the non-empty subsets are kept side by side in ``abar``
    (B, T, (2^L − 1)·T), block S at columns (S − 1)·T … S·T.

    Forward (attention part in ``__init__``)::

        G_l[S][b, i, (S', j)] = K_{S,S'}[x_i, x_j]             (n, B, T, n·T), one gather
        Y_l        = Σ_S A_S G_l[S]                             (B, T, n·T), Y_l[:, :, S'] = Σ_S A_S G[S, S']
        s_l        = Y_l[:, :, ∅] + Σ_{S'≠∅} Y_l[:, :, S'] A_{S'}ᵀ + DM(P_l);   A_l = causal_softmax(s_l)
        A_{n+S}    = A_l A_S                                    (new blocks of abar)
        logits     = W_O[x] + Σ_{S≠∅} A_S Z_S[x]                (rows Z_S[x_j] gathered per batch chunk)

    Backward, with g = ∂L/∂logits: ∂A_S = g Z_S[x]ᵀ and ∂Z_S = scatter(A_Sᵀ g) (:meth:`logits_backward`,
    or :meth:`fused_loss_backward`, which forms logits, cross-entropy and these gradients chunk by chunk
    without keeping the logits); then (:meth:`attention_backward`) for l = L..1 the chain
    A_{n+S} = A_l A_S (∂A_l += ∂A_{n+S} A_Sᵀ, ∂A_S += A_lᵀ ∂A_{n+S}); the softmax Jacobian
    ∂s = A ⊙ (∂A − rowsum(∂A ⊙ A)); ∂P_l[d] = Σ_t ∂s[t, t−d]; with U = ∂s [I, A_1, …] (B, T, n·T):
    ∂G[S] = A_Sᵀ U (scattered into ∂K) and ∂A_S += U G[S]ᵀ + ∂sᵀ Y[:, :, S].  Entries of ∂A_S above the
    diagonal are never used (they multiply zeros of causal attention).
    """

    def __init__(self, x: torch.Tensor, Ks: list[torch.Tensor], Z: torch.Tensor, W_O: torch.Tensor,
                 Ps: list[torch.Tensor], *, save: bool = True, ws: Workspace | None = None) -> None:
        B, T = x.shape
        V = W_O.shape[0]
        L = len(Ks)
        m = (1 << L) - 1
        dev, dt = W_O.device, W_O.dtype
        self.ws = ws if ws is not None else _Fresh()
        self.x, self.Ks, self.Z, self.W_O, self.Ps = x, Ks, Z, W_O, Ps
        self.B, self.T, self.V, self.L, self.m, self.Tfull = B, T, V, L, m, Ps[0].shape[0]
        self.dev, self.dt = dev, dt
        budget = ROWS_BYTES["cpu" if dev.type == "cpu" else "other"]
        self.bc = max(1, min(B, budget // max(1, T * m * V * W_O.element_size())))
        self.ridx = (x[:, :, None] + torch.arange(m, device=dev) * V).reshape(B, T * m)   # Z_S[x_j], (j, S)
        self.idx: list[torch.Tensor | None] = [None] * L
        self.G: list[torch.Tensor | None] = [None] * L
        self.Y: list[torch.Tensor | None] = [None] * L
        mask = torch.ones(T, T, dtype=torch.bool, device=dev).triu(1)
        abar = self.ws.get("abar", (B, T, m * T), dt, dev)
        for l in range(L):
            n = 1 << l
            idx = _pair_layout(x, n, V)
            G = self.ws.get(f"G{l}", (n, B, T, n * T), dt, dev)
            Kl = Ks[l].view(n, n * V * V)
            for S in range(n):                                   # row by row: faster than one 2-D gather
                torch.index_select(Kl[S], 0, idx, out=G[S].view(-1))
            if n == 1:
                Y = G[0]
                s = Y.clone()
            else:
                Y = self.ws.get(f"Y{l}", (B, T, n * T), dt, dev)
                Y.copy_(G[0])
                for S in range(1, n):
                    Y.baddbmm_(abar[:, :, (S - 1) * T:S * T], G[S])
                s = torch.baddbmm(Y[:, :, :T], Y[:, :, T:], abar[:, :, :(n - 1) * T].transpose(1, 2))
            if save:
                self.idx[l], self.G[l], self.Y[l] = idx, G, Y
            s += diag_matrix(Ps[l][:T], T)
            s.masked_fill_(mask, float("-inf"))
            A = torch.softmax(s, dim=-1)
            abar[:, :, (n - 1) * T:n * T] = A
            if n > 1:
                abar[:, :, n * T:(2 * n - 1) * T] = torch.bmm(A, abar[:, :, :(n - 1) * T])
        self.abar = abar

    # ------------------------------------------------------------------ logits path
    def _workers(self, n_chunks: int) -> int:
        """Worker threads for the chunk loop: on CPU, torch's thread count (each worker then runs its
        chunks with single-threaded ops — hundreds of small ops per step, whose per-op thread barriers
        stall whenever a core is busy elsewhere); on other devices 1."""
        if self.dev.type != "cpu":
            return 1
        return max(1, min(torch.get_num_threads(), n_chunks))

    def _for_chunks(self, body, n_workers: int) -> None:
        """Call ``body(w, b0, b1, rows, cp)`` for every batch chunk; chunk k goes to worker k mod
        n_workers (deterministic).  rows (nb, T·m, |V|) = Z_S[x_j] in (j, S) order and cp (nb, T, T·m)
        with cp[b, t, (j, S)] = A_S[b, t, j] live in per-worker buffers."""
        B, T, m, V = self.B, self.T, self.m, self.V
        bounds = [(b0, min(B, b0 + self.bc)) for b0 in range(0, B, self.bc)]

        def work(w: int) -> None:
            rbuf = self.ws.get(f"rows.{w}", (self.bc * T * m, V), self.dt, self.dev)
            cbuf = self.ws.get(f"cp.{w}", (self.bc * T * T * m,), self.dt, self.dev)
            for b0, b1 in bounds[w::n_workers]:
                nb = b1 - b0
                rows = torch.index_select(self.Z, 0, self.ridx[b0:b1].reshape(-1), out=rbuf[:nb * T * m])
                cp = cbuf[:nb * T * T * m].view(nb, T, T, m)
                cp.copy_(self.abar[b0:b1].view(nb, T, m, T).permute(0, 1, 3, 2))
                body(w, b0, b1, rows.view(nb, T * m, V), cp.view(nb, T, T * m))

        if n_workers <= 1:
            work(0)
            return
        errors: list[BaseException] = []

        def guarded(w: int) -> None:
            try:
                with torch.no_grad():      # grad mode is thread-local: new threads start with it on
                    work(w)
            except BaseException as exc:   # re-raised in the calling thread
                errors.append(exc)

        prev = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            threads = [threading.Thread(target=guarded, args=(w,)) for w in range(1, n_workers)]
            for t in threads:
                t.start()
            guarded(0)
            for t in threads:
                t.join()
        finally:
            torch.set_num_threads(prev)
        if errors:
            raise errors[0]

    def _accumulators(self, n_workers: int, dZ: torch.Tensor, dW_O: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(dZ, dW_O)] + [(self.ws.get(f"dZ.{w}", tuple(dZ.shape), self.dt, self.dev, zero=True),
                                self.ws.get(f"dW_O.{w}", tuple(dW_O.shape), self.dt, self.dev, zero=True))
                               for w in range(1, n_workers)]

    @staticmethod
    def _reduce(accs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for dz, dw in accs[1:]:                  # fixed order: deterministic for a given thread count
            accs[0][0].add_(dz)
            accs[0][1].add_(dw)

    def logits(self) -> torch.Tensor:
        """Logits (B, T, |V|) (a fresh tensor)."""
        B, T, V = self.B, self.T, self.V
        out = self.W_O.index_select(0, self.x.reshape(-1)).view(B, T, V)

        def body(w, b0, b1, rows, cp):
            out[b0:b1].baddbmm_(cp, rows)
        self._for_chunks(body, self._workers(-(-B // self.bc)))
        return out

    def _grad_chunk(self, w: int, b0: int, b1: int, rows: torch.Tensor, cp: torch.Tensor, g: torch.Tensor,
                    dZ: torch.Tensor, dW_O: torch.Tensor, dabar: torch.Tensor) -> None:
        T, m, V = self.T, self.m, self.V
        nb = b1 - b0
        dcp = self.ws.get(f"dcp.{w}", (nb, T, T, m), self.dt, self.dev)
        torch.bmm(g, rows.transpose(1, 2), out=dcp.view(nb, T, T * m))
        dabar[b0:b1].view(nb, T, m, T).copy_(dcp.permute(0, 1, 3, 2))
        drows = self.ws.get(f"drows.{w}", (nb, T * m, V), self.dt, self.dev)
        torch.bmm(cp.transpose(1, 2), g, out=drows)
        dZ.index_add_(0, self.ridx[b0:b1].reshape(-1), drows.view(-1, V))
        dW_O.index_add_(0, self.x[b0:b1].reshape(-1), g.reshape(-1, V))

    def logits_backward(self, g: torch.Tensor, dZ: torch.Tensor, dW_O: torch.Tensor) -> torch.Tensor:
        """Add ∂Z and ∂W_O (the W_O[x] term) of g = ∂L/∂logits to ``dZ``, ``dW_O``; returns ∂abar."""
        g = g.contiguous()
        dabar = self.ws.get("dabar", (self.B, self.T, self.m * self.T), self.dt, self.dev)
        nw = self._workers(-(-self.B // self.bc))
        accs = self._accumulators(nw, dZ, dW_O)

        def body(w, b0, b1, rows, cp):
            self._grad_chunk(w, b0, b1, rows, cp, g[b0:b1], accs[w][0], accs[w][1], dabar)
        self._for_chunks(body, nw)
        self._reduce(accs)
        return dabar

    def fused_loss_backward(self, targets: torch.Tensor, weight: float, dZ: torch.Tensor,
                            dW_O: torch.Tensor) -> tuple[float, torch.Tensor]:
        """Mean cross-entropy against ``targets`` (B, T) and, chunk by chunk, the gradients of
        ``weight`` × that loss: added to ``dZ`` / ``dW_O``; returns (loss, ∂abar).  Logits are formed in a
        chunk buffer only (same values as :meth:`logits`)."""
        B, T, V = self.B, self.T, self.V
        count = B * T
        dabar = self.ws.get("dabar", (B, T, self.m * T), self.dt, self.dev)
        nw = self._workers(-(-B // self.bc))
        accs = self._accumulators(nw, dZ, dW_O)
        totals = [torch.zeros((), dtype=torch.float64, device=self.dev) for _ in range(nw)]

        def body(w, b0, b1, rows, cp):
            nb = b1 - b0
            lg = self.ws.get(f"logits.{w}", (nb, T, V), self.dt, self.dev)
            torch.index_select(self.W_O, 0, self.x[b0:b1].reshape(-1), out=lg.view(nb * T, V))
            lg.baddbmm_(cp, rows)
            flat = lg.view(-1, V)
            y = targets[b0:b1].reshape(-1, 1)
            picked = flat.gather(1, y)
            lse = torch.logsumexp(flat, 1, keepdim=True)
            totals[w] += (lse - picked).sum(dtype=torch.float64)
            flat.sub_(lse).exp_()                                  # softmax
            flat.scatter_add_(1, y, torch.full_like(picked, -1.0))
            flat.mul_(weight / count)
            self._grad_chunk(w, b0, b1, rows, cp, lg, accs[w][0], accs[w][1], dabar)
        self._for_chunks(body, nw)
        self._reduce(accs)
        return float(sum(float(t) for t in totals)) / count, dabar

    # ------------------------------------------------------------------ attention part
    def attention_backward(self, dabar: torch.Tensor, dKs: list[torch.Tensor], dPs: list[torch.Tensor]) -> None:
        """Add ∂K_l and ∂P_l to ``dKs`` (each (n², |V|²)) and ``dPs`` given ∂abar (modified in place)."""
        B, T, V, L = self.B, self.T, self.V, self.L
        abar, dev, dt = self.abar, self.dev, self.dt
        t = torch.arange(T, device=dev)
        off = t[:, None] - t[None, :]
        low = off >= 0
        off_low = off[low]
        for l in range(L - 1, -1, -1):
            n = 1 << l
            A = abar[:, :, (n - 1) * T:n * T]
            dA = dabar[:, :, (n - 1) * T:n * T]
            if n > 1:                                          # A_{n+S} = A_l A_S for S = 1..n−1
                dhi = dabar[:, :, n * T:(2 * n - 1) * T]
                dA = torch.baddbmm(dA, dhi, abar[:, :, :(n - 1) * T].transpose(1, 2))
                dabar[:, :, :(n - 1) * T] += torch.bmm(A.transpose(1, 2), dhi)
            ds = A * (dA - (dA * A).sum(-1, keepdim=True))    # softmax Jacobian (masked entries: A = 0)
            dPs[l].index_add_(0, off_low, ds.sum(0)[low])
            G, Y = self.G[l], self.Y[l]
            dG = self.ws.get(f"dG{l}", (n, B, T, n * T), dt, dev)
            U = dG[0]                                           # ∂s [I, A_1, …]
            U[:, :, :T] = ds
            if n > 1:
                U[:, :, T:] = torch.bmm(ds, abar[:, :, :(n - 1) * T])
                dab = torch.bmm(ds.transpose(1, 2), Y[:, :, T:])             # ∂sᵀ Y[:, :, S]
                for S in range(1, n):
                    a_S = abar[:, :, (S - 1) * T:S * T]
                    torch.bmm(a_S.transpose(1, 2), U, out=dG[S])              # A_Sᵀ U
                    dab[:, :, (S - 1) * T:S * T] += torch.bmm(U, G[S].transpose(1, 2))   # U G[S]ᵀ
                dabar[:, :, :(n - 1) * T] += dab
            dKs[l].view(n, n * V * V).index_add_(1, self.idx[l], dG.view(n, -1))

    def backward(self, g: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """Fresh gradients (dKs, dZ, dW_O of the W_O[x] term only, dPs) for g = ∂L/∂logits."""
        dZ = torch.zeros_like(self.Z)
        dW_O = torch.zeros_like(self.W_O)
        dKs = [torch.zeros_like(k) for k in self.Ks]
        dPs = [torch.zeros_like(p) for p in self.Ps]
        dabar = self.logits_backward(g, dZ, dW_O)
        self.attention_backward(dabar, dKs, dPs)
        return dKs, dZ, dW_O, dPs


class _PathsFunction(torch.autograd.Function):
    """Autograd wrapper of :class:`_PathPass`: logits from (W_O, Z, Ks, Ps); backward by hand."""

    @staticmethod
    def forward(ctx, x, W_O, Z, *rest):  # rest = Ks (L) then Ps (L)
        L = len(rest) // 2
        p = _PathPass(x, list(rest[:L]), Z, W_O, list(rest[L:]), save=True)
        ctx.pass_ = p
        return p.logits()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        dKs, dZ, dW_O, dPs = ctx.pass_.backward(g)
        return (None, dW_O, dZ, *dKs, *dPs)


class AssocModel(nn.Module):
    """Attention-only transformer on one-hot tokens (Def. 3.1), fast one-hot forward.

    ``forward(inputs)``: inputs (B, T') int64 with T' ≤ T → logits (B, T', |V|).
    ``loss(tokens)``: tokens (B, T'+1) → mean cross-entropy over all B·T' positions.
    """

    def __init__(self, cfg: AssocConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        V, T, L = int(cfg.vocab_size), int(cfg.seq_len), int(cfg.n_layers)
        dt = cfg.torch_dtype
        self.W_O = nn.Parameter(torch.zeros(V, V, dtype=dt))
        self.W = nn.ParameterList([nn.Parameter(torch.zeros(V, V, dtype=dt)) for _ in range(L)])
        self.V = nn.ParameterList([nn.Parameter(torch.zeros(V, V, dtype=dt)) for _ in range(L)])
        self.P = nn.ParameterList([nn.Parameter(torch.zeros(T, dtype=dt)) for _ in range(L)])
        if cfg.init == "gaussian":
            g = torch.Generator().manual_seed(int(cfg.seed))
            with torch.no_grad():
                for name in weight_names(L):  # fixed draw order
                    p = self.param(name)
                    p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(dt) * cfg.init_std)

    # ------------------------------------------------------------------ parameters by paper name
    @property
    def vocab_size(self) -> int:
        return int(self.cfg.vocab_size)

    @property
    def seq_len(self) -> int:
        return int(self.cfg.seq_len)

    @property
    def n_layers(self) -> int:
        return int(self.cfg.n_layers)

    def param(self, name: str) -> nn.Parameter:
        """Parameter by on-disk name (``W_O``, ``W.l``, ``V.l``, ``P.l`` with 1-based l)."""
        if name == "W_O":
            return self.W_O
        kind, _, l = name.partition(".")
        if kind in ("W", "V", "P") and l.isdigit() and 1 <= int(l) <= self.n_layers:
            return getattr(self, kind)[int(l) - 1]
        raise KeyError(name)

    def named_weights(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, self.param(n)) for n in weight_names(self.n_layers)]

    def weights(self) -> dict[str, torch.Tensor]:
        """Detached copies keyed ``W_O``, ``W.l``, ``V.l``, ``P.l`` (l = 1..L)."""
        return {n: p.detach().clone() for n, p in self.named_weights()}

    @torch.no_grad()
    def load_weights(self, tensors: Mapping[str, object], *, strict: bool = True) -> None:
        """Copy weights from a mapping with the on-disk keys (numpy or torch values).

        Extra keys (e.g. trainer state in a checkpoint) are ignored; missing or mis-shaped keys raise
        :class:`~originlens.errors.CompatibilityError`.
        """
        for name, p in self.named_weights():
            if name not in tensors:
                if strict:
                    raise CompatibilityError(f"weights lack '{name}'",
                                             f"load a file saved for an L={self.n_layers} AssocModel")
                continue
            v = torch.as_tensor(np.asarray(tensors[name]) if not torch.is_tensor(tensors[name]) else tensors[name])
            if tuple(v.shape) != tuple(p.shape):
                raise CompatibilityError(f"'{name}' has shape {tuple(v.shape)}, model expects {tuple(p.shape)}",
                                         "load weights saved for the same |V|, T and L")
            p.copy_(v.to(p.dtype))

    # ------------------------------------------------------------------ forward
    def _check_inputs(self, inputs: torch.Tensor) -> torch.Tensor:
        x = torch.as_tensor(inputs)
        if x.dim() != 2 or x.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise InputError(f"inputs must be a (B, T) integer tensor, got {x.dtype} {tuple(x.shape)}",
                             "pass token ids")
        if x.shape[1] > self.seq_len or x.shape[1] < 1:
            raise InputError(f"sequence length {x.shape[1]} outside 1..{self.seq_len}",
                             f"this model has T = {self.seq_len} positions")
        if x.numel() and (int(x.min()) < 0 or int(x.max()) >= self.vocab_size):
            raise InputError(f"token ids must lie in 0..{self.vocab_size - 1}", "check the vocabulary")
        return x.long()

    def choose_impl(self, batch: int, seq_len: int) -> str:
        """The implementation ``auto`` resolves to for a (batch, seq_len) input (flop estimate)."""
        impl = self.cfg.impl
        if impl != "auto":
            return impl
        c = path_cost(batch, seq_len, self.vocab_size, self.n_layers)
        return "paths" if c["paths"] <= c["gather"] else "gather"

    def forward(self, inputs: torch.Tensor, *, impl: str | None = None) -> torch.Tensor:
        """Logits (B, T', |V|) for inputs (B, T') of token ids."""
        x = self._check_inputs(inputs)
        if impl is None or impl == "auto":
            impl = self.choose_impl(x.shape[0], x.shape[1])
        if impl == "paths":
            return self._forward_paths(x)
        if impl == "gather":
            return self._forward_gather(x)
        if impl == "dense":
            return self._forward_dense(x)
        raise ConfigError(f"unknown impl '{impl}'", f"use one of {', '.join(IMPLS)}")

    def loss(self, tokens: torch.Tensor, *, impl: str | None = None) -> torch.Tensor:
        """Mean cross-entropy over all B·T' positions; tokens (B, T'+1): inputs x_0..x_{T'-1}, targets x_1..x_T'."""
        tokens = torch.as_tensor(tokens)
        if tokens.dim() != 2 or tokens.shape[1] < 2:
            raise InputError(f"tokens must be (B, T+1) with T ≥ 1, got {tuple(tokens.shape)}", "pass token windows")
        logits = self(tokens[:, :-1], impl=impl)
        tgt = tokens[:, 1:].long()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))

    def _dm(self, l: int, T: int) -> torch.Tensor:
        return diag_matrix(self.P[l][:T], T)

    def _forward_dense(self, x: torch.Tensor) -> torch.Tensor:
        """Straightforward one-hot implementation (the reference)."""
        T = x.shape[1]
        h = F.one_hot(x, self.vocab_size).to(self.W_O.dtype)
        for l in range(self.n_layers):
            s = (h @ self.W[l]) @ h.transpose(1, 2) + self._dm(l, T)
            a = _causal_softmax(s)
            h = h + a @ (h @ self.V[l])
        return h @ self.W_O

    def _forward_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Layer 1 by gathers, deeper layers dense."""
        T = x.shape[1]
        W0 = self.W[0]
        s = W0[x[:, :, None], x[:, None, :]] + self._dm(0, T)
        a = _causal_softmax(s)
        h = a @ F.embedding(x, self.V[0])
        h = h + F.one_hot(x, self.vocab_size).to(h.dtype)
        for l in range(1, self.n_layers):
            s = (h @ self.W[l]) @ h.transpose(1, 2) + self._dm(l, T)
            a = _causal_softmax(s)
            h = h + a @ (h @ self.V[l])
        return h @ self.W_O

    def path_products(self) -> list[torch.Tensor]:
        """The batch-independent |V|×|V| products of the path expansion (with autograd graph).

        Element l−1 (l = 1..L) stacks K_{S,S'} = V_S W^(l) V_{S'}ᵀ for S, S' ⊆ {1..l−1} as
        (4^{l−1}, |V|·|V|), row S·2^{l−1} + S'; the last element stacks Z_S = V_S W_O for non-empty
        S ⊆ {1..L} as ((2^L − 1)·|V|, |V|).  Subsets are bitmasks (bit l−1 = layer l) in increasing order,
        V_S = V_{s_1}…V_{s_k} in increasing layer order.  Every product is one matmul with a parameter
        (peeling the lowest layer: V_S M = V_{s_1}(V_{S∖s_1} M), K_{S,S'} = K_{S,S'∖s_1} V_{s_1}ᵀ), and the
        products sharing that parameter are stacked into one large matmul (9 matmuls at L = 3 instead of
        25 — same flops, better multi-threaded efficiency).  :meth:`accumulate_gradients` computes them once
        per optimiser step however many chunks the batch is split into.
        """
        V = self.vocab_size

        def above(i: int, bits: int) -> list[int]:     # subsets of {i+1..bits−1} (bitmasks), increasing
            return [R for R in range(1 << bits) if R & ((1 << (i + 1)) - 1) == 0]

        def left_products(Wm: torch.Tensor, bits: int) -> dict[int, torch.Tensor]:
            """V_S Wm for all S ⊆ {0..bits−1}: for the lowest layer i of S, V_i (V_{S∖i} Wm), one stacked
            matmul V_i [V_R Wm]_R per i (R above i)."""
            left = {0: Wm}
            for i in range(bits - 1, -1, -1):
                Rs = above(i, bits)
                prod = self.V[i] @ (torch.cat([left[R] for R in Rs], dim=1) if len(Rs) > 1 else left[0])
                # split (not slicing): its backward is one concatenation, not a zero-filled copy per slice
                for R, part in zip(Rs, prod.split(V, dim=1)):
                    left[R | (1 << i)] = part
            return left

        out = []
        for l in range(self.n_layers):
            n = 1 << l
            left = left_products(self.W[l], l)
            K = {(S, 0): left[S] for S in range(n)}
            for i in range(l - 1, -1, -1):       # K_{S,S'} = K_{S,S'∖i} V_iᵀ, stacked over (S, S'∖i)
                pairs = [(S, R) for S in range(n) for R in above(i, l)]
                prod = torch.cat([K[p] for p in pairs], dim=0) @ self.V[i].T
                for (S, R), part in zip(pairs, prod.split(V, dim=0)):
                    K[(S, R | (1 << i))] = part
            out.append(torch.stack([K[(S, S2)] for S in range(n) for S2 in range(n)]).reshape(n * n, -1))
        Z = left_products(self.W_O, self.n_layers)
        out.append(torch.cat([Z[S] for S in range(1, 1 << self.n_layers)]))
        return out

    def _path_inputs(self, products: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
        V = self.vocab_size
        return [k.reshape(-1, V * V) for k in products[:-1]], products[-1]

    def _forward_paths(self, x: torch.Tensor) -> torch.Tensor:
        """Path expansion h_l = Σ_S A_S X V_S (see module docstring and :class:`_PathPass`)."""
        track = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        products = self.path_products() if track else self._cached_products()
        Ks, Z = self._path_inputs(products)
        Ps = list(self.P)
        if track:
            return _PathsFunction.apply(x, self.W_O, Z, *Ks, *Ps)
        with torch.no_grad():
            return _PathPass(x, Ks, Z, self.W_O, Ps, save=False, ws=self.workspace()).logits()

    def accumulate_gradients(self, tokens: torch.Tensor, *, chunk: int | None = None,
                             impl: str | None = None) -> float:
        """Add ∇ of the mean cross-entropy over all positions of ``tokens`` (B, T'+1) to ``.grad``.

        The batch is processed in chunks of ``chunk`` sequences (None = all at once), each weighted by
        its share of the batch, so the result equals the unchunked gradient up to round-off.  With the
        path implementation the batch-independent products are computed once per call, the chunks are
        differentiated by hand (:class:`_PathPass`, cross-entropy gradient formed in place) and the
        products' gradients back-propagated once.  Returns the batch loss (a float; NaN/Inf are
        returned, not raised).  ``impl`` is resolved for the whole batch size.
        """
        tokens = torch.as_tensor(tokens)
        if tokens.dim() != 2 or tokens.shape[1] < 2:
            raise InputError(f"tokens must be (B, T+1) with T ≥ 1, got {tuple(tokens.shape)}", "pass token windows")
        tokens = tokens.to(self.W_O.device)
        n = tokens.shape[0]
        chunk = n if chunk is None else max(1, int(chunk))
        if impl is None or impl == "auto":
            impl = self.choose_impl(n, tokens.shape[1] - 1)
        if impl != "paths":
            total = 0.0
            for i in range(0, n, chunk):
                c = tokens[i:i + chunk]
                loss = self.loss(c, impl=impl)
                w = c.shape[0] / n
                (loss * w if w != 1.0 else loss).backward()
                total += loss.item() * w
            return total
        with torch.enable_grad():
            prods = self.path_products()
        Ks, Z = self._path_inputs([p.detach() for p in prods])
        W_O, Ps = self.W_O.detach(), [p.detach() for p in self.P]
        ws = self.workspace()
        dKs = [ws.get(f"acc.K{l}", tuple(k.shape), k.dtype, k.device, zero=True) for l, k in enumerate(Ks)]
        dZ = ws.get("acc.Z", tuple(Z.shape), Z.dtype, Z.device, zero=True)
        dW_O = torch.zeros_like(W_O)
        dPs = [torch.zeros_like(p) for p in Ps]
        total = 0.0
        with torch.no_grad():
            for i in range(0, n, chunk):
                c = tokens[i:i + chunk]
                x = self._check_inputs(c[:, :-1])
                p = _PathPass(x, Ks, Z, W_O, Ps, ws=ws)
                loss, dabar = p.fused_loss_backward(c[:, 1:].long(), c.shape[0] / n, dZ, dW_O)
                p.attention_backward(dabar, dKs, dPs)
                total += loss * c.shape[0] / n
                del p, dabar
        torch.autograd.backward(prods, [d.view_as(p) for d, p in zip(dKs + [dZ], prods)])
        with torch.no_grad():
            for p, d in [(self.W_O, dW_O)] + list(zip(self.P, dPs)):
                if p.grad is None:
                    p.grad = d
                else:
                    p.grad += d
        return total

    def workspace(self) -> Workspace:
        """Scratch buffers reused by the path implementation across calls (see :class:`Workspace`)."""
        ws = self.__dict__.get("_workspace")
        if ws is None:
            ws = Workspace()
            self.__dict__["_workspace"] = ws
        return ws

    def release_workspace(self) -> None:
        """Free the scratch buffers and cached products (they are re-created on the next call)."""
        self.__dict__.pop("_workspace", None)
        self.__dict__.pop("_product_cache", None)

    def _cached_products(self) -> list[torch.Tensor]:
        """:meth:`path_products` without autograd, reused while no parameter changes (evaluation loops
        over many batches: intervention, held-out losses).  Keyed on each parameter's storage and
        in-place version counter, so any update (optimizer step, ``load_weights``, ``copy_``) invalidates it."""
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in self.parameters())
        hit = self.__dict__.get("_product_cache")
        if hit is not None and hit[0] == key:
            return hit[1]
        with torch.no_grad():
            prods = self.path_products()
        self.__dict__["_product_cache"] = (key, prods)
        return prods


def dense_logits(model: AssocModel, inputs: torch.Tensor) -> torch.Tensor:
    """Logits of the straightforward one-hot implementation (reference; same parameters)."""
    return model(inputs, impl="dense")


def load_assoc(path: str | os.PathLike, *, impl: str = "auto") -> tuple[AssocModel, dict[str, str]]:
    """Load an :class:`AssocModel` from ``model.safetensors`` or a trainer checkpoint.

    The shape (|V|, T, L) and dtype are read from the tensors; returns (model, metadata).
    """
    from ..storage import load_tensors
    arrays, meta = load_tensors(path)
    if meta.get("kind") not in (MODEL_KIND, CHECKPOINT_KIND):
        raise CompatibilityError(f"{path} holds '{meta.get('kind')}', not an AssocModel",
                                 "pass a model.safetensors or checkpoint written by train_assoc")
    if "W_O" not in arrays:
        raise CompatibilityError(f"{path} has no W_O tensor", "pass an AssocModel file")
    L = 0
    while f"W.{L + 1}" in arrays:
        L += 1
    V = arrays["W_O"].shape[0]
    T = arrays["P.1"].shape[0] if L else 1
    dtype = "float64" if arrays["W_O"].dtype == np.float64 else "float32"
    model = AssocModel(AssocConfig(vocab_size=V, seq_len=T, n_layers=max(L, 1), dtype=dtype, impl=impl))
    model.load_weights(arrays)
    return model, meta
