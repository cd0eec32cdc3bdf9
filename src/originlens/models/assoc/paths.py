"""The path implementation of the one-hot attention model: batch-independent |V|×|V| products in pair-major /
token-major layouts, the chunked forward pass with its hand-written backward, and the autograd function that
wraps them.  Part of :mod:`originlens.models.assoc` (its docstring explains the path expansion)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F

from .ops import diag_matrix
from .workers import (
    CHUNK_BYTES,
    ROW_POSITIONS,
    ROWS_BYTES,
    Team,
    Workspace,
    batched_mm,
    block_ranges,
    fresh_pass,
    low_rank,
)


def _pair_columns(L: int) -> tuple[list[int], int]:
    """Column offset of each layer's n² = 4^{l−1} pair values in a pair-major row (largest layer first,
    every block of more than one value at a multiple of 4 so it can be moved as wide elements), and the
    row width (padded to a multiple of 4)."""
    offs, o = [0] * L, 0
    for l in range(L - 1, -1, -1):
        offs[l] = o
        o += 4**l
    return offs, (o if L == 1 else -(-o // 4) * 4)


class Products:
    """The batch-independent |V|×|V| products of one optimiser step, in the layouts the chunk pass reads,
    with a hand-written backward (no autograd graph, every product written into reused buffers).

    * ``ZL`` (|V|, 2^L, |V|), token-major: ``ZL[x, S]`` = (V_S W_O)[x] for every S ⊆ {1..L} (S = ∅: W_O),
      so the 2^L − 1 rows a position needs are one contiguous read.  V_S W_O = V_i (V_{S∖i} W_O) with i
      the lowest layer of S.
    * ``K[l]`` (n, n, |V|, |V|), n = 2^{l−1}: K_{S,S'} = V_S W^(l) V_{S'}ᵀ (left products V_i K_{S∖i,∅},
      then K_{S,S'} = K_{S,S'∖i} V_iᵀ), and ``Kr`` the pair-major copy of all layers (|V|², width): row
      x·|V| + x' holds K_{S,S'}[x, x'] of layer l at column offs[l] + S·n + S' (:func:`_pair_columns`),
      packed block by block (cache-sized transposes, ~3× faster than one strided copy).

    One matmul per product (25 at L = 3, torch's intra-op threads or, for tiny values, the team's
    workers: :func:`batched_mm`); :meth:`backward` takes 2 per product (∂ of both factors).
    """

    def __init__(self, W_O: torch.Tensor, Ws: list[torch.Tensor], Vs: list[torch.Tensor], ws, team: Team) -> None:
        V, L = W_O.shape[0], len(Ws)
        self.V, self.L, self.Vs, self.ws = V, L, Vs, ws
        dev, dt = W_O.device, W_O.dtype
        ZL = ws("prod.ZL", (V, 1 << L, V), dt, dev)
        ZL[:, 0] = W_O
        for S in range(1, 1 << L):
            i, P = low_rank(S)
            batched_mm(team, ZL[:, S], Vs[i], ZL[:, P])
        self.ZL = ZL
        self.K: list[torch.Tensor | None] = [None] * L
        for l in range(1, L):
            n = 1 << l
            K = ws(f"prod.K{l}", (n, n, V, V), dt, dev)
            K[0, 0] = Ws[l]
            for S in range(1, n):
                i, P = low_rank(S)
                batched_mm(team, K[S, 0], Vs[i], K[P, 0])
            for S in range(n):
                for S2 in range(1, n):
                    i, P = low_rank(S2)
                    batched_mm(team, K[S, S2], K[S, P], Vs[i].t())
            self.K[l] = K
        offs, width = _pair_columns(L)
        self.Kr = ws("prod.Kr", (V * V, width), dt, dev)
        srcs = cast("list[torch.Tensor]", [None] * L)  # every entry is set below, before use
        srcs[0] = Ws[0].reshape(-1, 1)
        for l in range(1, L):
            srcs[l] = cast(torch.Tensor, self.K[l]).view(4**l, V * V)  # set above for l ≥ 1
        pad = torch.zeros(1, width - (4**L - 1) // 3, dtype=dt, device=dev)

        def pack(r0: int, r1: int) -> None:  # rows r0..r1 of Kr, contiguous writes
            parts = [srcs[l][r0:r1] if l == 0 else srcs[l][:, r0:r1].t() for l in range(L - 1, -1, -1)]
            torch.cat(parts + [pad.expand(r1 - r0, -1)], dim=1, out=self.Kr[r0:r1])

        block_ranges(team, V * V, pack, dev)

    def backward(self, dW: torch.Tensor, dZ: torch.Tensor, dKr: torch.Tensor, team: Team) -> dict[str, torch.Tensor]:
        """Gradients of W_O, W^(l), V^(l) (on-disk names) from ∂W_O (direct term, (|V|, |V|)), ∂Z_S
        (|V|, 2^L − 1, |V|) token-major, and pair-major ∂K (layout of ``Kr``); all three are consumed
        (modified in place) and ``Kr`` is overwritten (its memory holds ∂K_{S,S'}).  Returned tensors are
        scratch: copy them before the next step."""
        V, L, Vs, ZL = self.V, self.L, self.Vs, self.ZL
        dev, dt = ZL.device, ZL.dtype
        dVs = [self.ws(f"prod.dV{i}", (V, V), dt, dev, zero=True) for i in range(L)]
        dZL = [dW] + [dZ[:, S] for S in range((1 << L) - 1)]
        for S in range((1 << L) - 1, 0, -1):  # Z_S = V_i Z_P
            i, P = low_rank(S)
            batched_mm(team, dVs[i], dZL[S], ZL[:, P].t(), add=True)
            batched_mm(team, dZL[P], Vs[i].t(), dZL[S], add=True)
        offs, _ = _pair_columns(L)
        out = {"W_O": dW, "W.1": dKr[:, offs[0]].view(V, V)}
        o_dK = [0, 0]
        for l in range(2, L):
            o_dK.append(o_dK[-1] + 4 ** (l - 1) * V * V)
        for l in range(1, L):
            n = 1 << l
            K = self.K[l]
            assert K is not None  # set for every layer l ≥ 1
            dK = self.Kr.view(-1)[o_dK[l] : o_dK[l] + n * n * V * V].view(n, n, V, V)  # Kr is dead: reuse it
            dst, src = dK.view(n * n, V * V), dKr[:, offs[l] : offs[l] + n * n]
            block_ranges(team, V * V, lambda r0, r1, dst=dst, src=src: dst[:, r0:r1].copy_(src[r0:r1].t()), dev)
            for S in range(n):
                for S2 in range(n - 1, 0, -1):  # K_{S,S2} = K_{S,P} V_iᵀ
                    i, P = low_rank(S2)
                    batched_mm(team, dVs[i], dK[S, S2].t(), K[S, P], add=True)
                    batched_mm(team, dK[S, P], dK[S, S2], Vs[i], add=True)
            for S in range(n - 1, 0, -1):  # K_{S,∅} = V_i K_{P,∅}
                i, P = low_rank(S)
                batched_mm(team, dVs[i], dK[S, 0], K[P, 0].t(), add=True)
                batched_mm(team, dK[P, 0], Vs[i].t(), dK[S, 0], add=True)
            out[f"W.{l + 1}"] = dK[0, 0]
        for i in range(L):
            out[f"V.{i + 1}"] = dVs[i]
        return out


@dataclass
class PathInputs:
    """What a chunk pass reads (detached): pair-major ``Kr`` (|V|², width) — row x·|V| + x' holds
    K_{S,S'}[x, x'] of every layer (:func:`_pair_columns`), one gathered row serving all subset pairs of
    all layers for a token pair —,
    token-major ``ZL`` (|V|, 2^L, |V|) (block 0 = W_O), and ``bias[l]`` (T', T') = DM(P_l) with −inf
    above the diagonal (causal mask folded in)."""

    Kr: torch.Tensor
    ZL: torch.Tensor
    bias: list[torch.Tensor]
    eye: torch.Tensor
    low: tuple[torch.Tensor, torch.Tensor]  # flat (t, j) indices with j ≤ t, and their offsets t − j

    @property
    def T(self) -> int:
        return self.eye.shape[0]

    @property
    def L(self) -> int:
        return len(self.bias)

    @classmethod
    def build(cls, Kr: torch.Tensor, ZL: torch.Tensor, Ps: list[torch.Tensor], T: int) -> PathInputs:
        mask = torch.ones(T, T, dtype=torch.bool, device=ZL.device).triu(1)
        bias = [diag_matrix(p[:T].detach(), T).masked_fill(mask, float("-inf")) for p in Ps]
        t = torch.arange(T, device=ZL.device)
        off = (t[:, None] - t[None, :]).view(-1)
        low = torch.nonzero(off >= 0).view(-1)
        return cls(Kr, ZL, bias, torch.eye(T, dtype=ZL.dtype, device=ZL.device), (low, off[low]))


class _Grads:
    """Gradient accumulators of one lane: ∂K_l (pair-major), ∂W_O of the W_O[x] term, ∂Z_S
    (|V|, 2^L − 1, |V|) token-major (contiguous: ``index_add_`` into a strided view is ~10× slower),
    ∂P_l (length T'), and the summed cross-entropy (float64)."""

    def __init__(self, inp: PathInputs, get) -> None:
        dev, dt = inp.ZL.device, inp.ZL.dtype
        V, M = inp.ZL.shape[0], inp.ZL.shape[1]
        self.dKr = get("dK", tuple(inp.Kr.shape), dt, dev, zero=True)
        self.dW = get("dW", (V, V), dt, dev, zero=True)
        self.dZ = get("dZ", (V, M - 1, V), dt, dev, zero=True)
        self.dP = [get(f"dP{l}", (inp.T,), dt, dev, zero=True) for l in range(inp.L)]
        self.loss = torch.zeros((), dtype=torch.float64, device=dev)

    def add_(self, other: _Grads) -> None:
        for a, b in zip([self.dKr, self.dW, self.dZ] + self.dP, [other.dKr, other.dW, other.dZ] + other.dP):
            a.add_(b)
        self.loss += other.loss


def _chunk_bytes(T: int, L: int, elem: int) -> int:
    """Bytes of attention state per sequence in a :class:`_Chunk` (sizes the chunks)."""
    m = (1 << L) - 1
    per = 2 * (m + 1) + 2 * m + sum(3 * (1 << l) ** 2 + 2 * (1 << l) for l in range(L))
    return per * T * T * elem


class _Chunk:
    """Forward and hand-written backward of the path expansion for a few sequences (no autograd inside).

    ``x`` (c, T') token ids; tensors of :class:`PathInputs`; scratch from ``ws`` under names prefixed
    by ``tag`` (one prefix per lane).  Subsets S of the earlier layers are bitmasks; the attention
    products are kept side by side with the identity, ``AI`` (c, T', 2^L·T'), block S at columns
    S·T' … (S+1)·T' holding A_S (A_∅ = I, A_{S∪{l}} = A_l A_S for S ⊆ {1..l−1}).

    Attention, layer l (n = 2^{l−1}).  One pair-major row of ``Kr`` is gathered per token pair (k, j)
    for all layers at once; with the subset index interleaved next to the position index,
    Â[i, (k, S)] = A_S[i, k] (S < n) and G[(k, S), (j, S')] = K_{S,S'}[x_k, x_j] (the gathered rows with
    j and S swapped: a copy of 4·n-byte elements)::

        Y = Â G;   s = Y Âᵀ + DM(P_l) (masked);   A_l = softmax(s);   A_{n+S} = A_l A_S

    Logits ``W_O[x] + Σ_{S≠∅} A_S Z_S[x]`` with cp[t, (j, S)] = A_S[t, j]: the rows ZL[x_j, 1:] are
    gathered for a block of key positions j (and ``bc`` sequences) at a time and kept for the
    backward pass of the block; only query rows t ≥ first j of the block are multiplied (causal: the
    rest are zeros).  The cross-entropy gradient g is formed in place of the logits; per block
    ∂cpᵀ = rows gᵀ and ∂ZL[x_j, 1:] += (cpᵀ g)[j] (the factor 1/(N·T) enters as the GEMMs' alpha).
    Attention backward, l = L..1: chain A_{n+S} = A_l A_S; ∂s = A ⊙ (∂A − rowsum(∂A ⊙ A));
    ∂P_l[d] = Σ_t ∂s[t, t−d]; U = ∂s Â; ∂Â = ∂sᵀ Y + U Gᵀ; ∂G = Âᵀ U, swapped back to pair rows and
    scattered (all layers at once) into ∂Kr.  Entries of ∂A_S above the diagonal are never used (they
    multiply zeros of causal attention) and are left unspecified.
    """

    def __init__(self, inp: PathInputs, x: torch.Tensor, ws: Workspace, tag: str) -> None:
        c, T = x.shape
        V = inp.ZL.shape[0]
        L = inp.L
        m = (1 << L) - 1
        self.inp, self.x, self.ws, self.tag = inp, x, ws, tag
        self.c, self.T, self.V, self.L, self.m = c, T, V, L, m
        self.dev, self.dt = inp.ZL.device, inp.ZL.dtype
        kind = "cpu" if self.dev.type == "cpu" else "other"
        jb = min(T, ROW_POSITIONS[kind] or T)
        self.blocks = [(j0, min(T, j0 + jb)) for j0 in range(0, T, jb)]
        self.bc = max(1, min(c, ROWS_BYTES[kind] // (jb * m * V * inp.ZL.element_size())))
        self.dAI: torch.Tensor | None = None
        base = self._buf("base", (c, T, T), torch.long)
        torch.add(x[:, :, None] * V, x[:, None, :], out=base)
        self.base = base.view(-1)
        AI = self._buf("AI", (c, T, (m + 1) * T))
        AI[:, :, :T] = inp.eye
        self.G: list[torch.Tensor] = []
        self.Y: list[torch.Tensor | None] = []
        self.Ai: list[torch.Tensor | None] = []
        self.offs, width = _pair_columns(L)
        R = self._buf("R", (c, T, T, width))  # gathered pair rows [b, k, j, :]
        torch.index_select(inp.Kr, 0, self.base, out=R.view(-1, width))
        for l in range(L):
            n, o = 1 << l, self.offs[l]
            if n == 1:
                G = R[..., o]
                s = G + inp.bias[0]
                Y = Ai = None
            else:
                G = self._buf(f"G{l}", (c, T, n, T, n))  # [b, k, S, j, S']
                _swap_copy(G, R[..., o : o + n * n].view(c, T, T, n, n))
                G = G.view(c, T * n, T * n)
                Ai = self._buf(f"Ai{l}", (c, T, T, n))  # Ai[b, i, k, S] = A_S[b, i, k], S < n
                Ai.copy_(AI[:, :, : n * T].view(c, T, n, T).permute(0, 1, 3, 2))
                Ai = Ai.view(c, T, T * n)
                Y = torch.bmm(Ai, G, out=self._buf(f"Y{l}", (c, T, T * n)))
                s = torch.bmm(Y, Ai.transpose(1, 2))
                s += inp.bias[l]
            self.G.append(G)
            self.Y.append(Y)
            self.Ai.append(Ai)
            A = torch.softmax(s, dim=-1)
            AI[:, :, n * T : (n + 1) * T] = A
            if n > 1:
                torch.bmm(A, AI[:, :, T : n * T], out=AI[:, :, (n + 1) * T : 2 * n * T])
        self.AI = AI

    def _buf(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype | None = None, *, zero: bool = False
    ) -> torch.Tensor:
        return self.ws.get(f"{self.tag}.{name}", shape, dtype or self.dt, self.dev, zero=zero)

    # ------------------------------------------------------------------ logits path
    def _cp(self) -> torch.Tensor:
        """cp (c, T', T'·m) with cp[b, t, j·m + S − 1] = A_S[b, t, j]."""
        c, T, m = self.c, self.T, self.m
        cp = self._buf("cp", (c, T, T, m))
        cp.copy_(self.AI[:, :, T:].view(c, T, m, T).permute(0, 1, 3, 2))
        return cp.view(c, T, T * m)

    def _rows(self, k: int, b0: int, b1: int, *, gather: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids of row block k and its rows (b1−b0, (j1−j0)·m, |V|): row (j, S) = Z_S[x_j] (gathered
        unless ``gather`` is False: then the buffer still holds them from the forward pass)."""
        j0, j1 = self.blocks[k]
        idx = self.x[b0:b1, j0:j1].reshape(-1)
        rows = self._buf(f"rows{k}", (b1 - b0, (j1 - j0) * self.m, self.V))
        if gather:
            torch.index_select(self.inp.ZL.view(self.V, -1)[:, self.V :], 0, idx, out=rows.view(idx.shape[0], -1))
        return idx, rows

    def _logits_into(self, lg: torch.Tensor, b0: int, b1: int, cp: torch.Tensor) -> None:
        m = self.m
        torch.index_select(self.inp.ZL[:, 0], 0, self.x[b0:b1].reshape(-1), out=lg.view(-1, self.V))
        for k, (j0, j1) in enumerate(self.blocks):
            _, rows = self._rows(k, b0, b1)
            lg[:, j0:].baddbmm_(cp[b0:b1, j0:, j0 * m : j1 * m], rows)

    def _grads_from(
        self,
        g: torch.Tensor,
        b0: int,
        b1: int,
        cp: torch.Tensor,
        dcpT: torch.Tensor,
        acc: _Grads,
        *,
        gathered: bool,
        scale: float = 1.0,
    ) -> None:
        """Gradients from ``scale`` · g, g = ∂L/∂logits (b1−b0, T', |V|)."""
        m, V = self.m, self.V
        dZ = acc.dZ.view(V, -1)
        for k, (j0, j1) in enumerate(self.blocks):
            idx, rows = self._rows(k, b0, b1, gather=not gathered)
            out = dcpT[b0:b1, j0 * m : j1 * m, j0:]
            torch.baddbmm(out, rows, g[:, j0:].transpose(1, 2), beta=0, alpha=scale, out=out)
            drows = self._buf("drows", tuple(rows.shape))
            torch.baddbmm(
                drows, cp[b0:b1, j0:, j0 * m : j1 * m].transpose(1, 2), g[:, j0:], beta=0, alpha=scale, out=drows
            )
            dZ.index_add_(0, idx, drows.view(idx.shape[0], -1))
        acc.dW.index_add_(0, self.x[b0:b1].reshape(-1), g.reshape(-1, V), alpha=scale)

    def _set_dAI(self, dcpT: torch.Tensor) -> None:
        """∂AI blocks S ≥ 1 from ∂cpᵀ (c, T'·m, T') (rows (j, S), columns t)."""
        c, T, m = self.c, self.T, self.m
        dAI = self._buf("dAI", (c, T, (m + 1) * T))
        dAI[:, :, T:].view(c, T, m, T).copy_(dcpT.view(c, T, m, T).permute(0, 3, 2, 1))
        self.dAI = dAI

    def logits_into(self, out: torch.Tensor) -> None:
        """Write the logits (c, T', |V|) into ``out``."""
        cp = self._cp()
        for b0 in range(0, self.c, self.bc):
            b1 = min(self.c, b0 + self.bc)
            self._logits_into(out[b0:b1], b0, b1, cp)

    def loss_backward(self, targets: torch.Tensor, scale: float, acc: _Grads) -> None:
        """Cross-entropy against ``targets`` (c, T') added to ``acc.loss`` (sum over positions); the
        gradient of ``scale`` × that sum w.r.t. ZL added to ``acc``; ∂AI kept for
        :meth:`attention_backward`.  Logits live in a (bc, T', |V|) buffer only."""
        c, T, V, m = self.c, self.T, self.V, self.m
        cp = self._cp()
        dcpT = self._buf("dcpT", (c, T * m, T), zero=True)
        for b0 in range(0, c, self.bc):
            b1 = min(c, b0 + self.bc)
            lg = self._buf("logits", (b1 - b0, T, V))
            self._logits_into(lg, b0, b1, cp)
            y = targets[b0:b1].reshape(-1, 1)
            ls = torch.log_softmax(lg.view(-1, V), 1, out=self._buf("ls", (lg.shape[0] * T, V)))
            acc.loss -= ls.gather(1, y).sum(dtype=torch.float64)
            g = torch.exp(ls, out=lg.view(-1, V))  # softmax
            g.scatter_add_(1, y, torch.full(y.shape, -1.0, dtype=g.dtype, device=g.device))
            self._grads_from(lg, b0, b1, cp, dcpT, acc, gathered=True, scale=scale)
        self._set_dAI(dcpT)

    def grad_backward(self, g: torch.Tensor, acc: _Grads) -> None:
        """Given g = ∂L/∂logits (c, T', |V|): ∂ZL added to ``acc``; ∂AI kept."""
        cp = self._cp()
        dcpT = self._buf("dcpT", (self.c, self.T * self.m, self.T), zero=True)
        g = g.contiguous()
        for b0 in range(0, self.c, self.bc):
            b1 = min(self.c, b0 + self.bc)
            self._grads_from(g[b0:b1], b0, b1, cp, dcpT, acc, gathered=False)
        self._set_dAI(dcpT)

    # ------------------------------------------------------------------ attention part
    def attention_backward(self, acc: _Grads) -> None:
        """Add ∂K_l (pair-major) and ∂P_l to ``acc`` given the ∂AI of the logits path."""
        c, T, L = self.c, self.T, self.L
        AI, dAI = self.AI, self.dAI
        assert dAI is not None  # set by the logits backward (loss_backward / grad_backward)
        low, off_low = self.inp.low
        width = self.inp.Kr.shape[1]
        dR = self._buf("R", (c, T, T, width))  # the forward's buffer: its padding is 0
        for l in range(L - 1, -1, -1):
            n = 1 << l
            A = AI[:, :, n * T : (n + 1) * T]
            dA = dAI[:, :, n * T : (n + 1) * T]
            lo = AI[:, :, T : n * T]
            if n > 1:  # A_{n+S} = A_l A_S for S = 1..n−1
                dhi = dAI[:, :, (n + 1) * T : 2 * n * T]
                dA = torch.baddbmm(dA, dhi, lo.transpose(1, 2))
                dAI[:, :, T : n * T] += torch.bmm(A.transpose(1, 2), dhi, out=self._buf("dlo", (c, T, (n - 1) * T)))
            ds = A * (dA - (dA * A).sum(-1, keepdim=True))  # softmax Jacobian (masked entries: A = 0)
            acc.dP[l].index_add_(0, off_low, ds.sum(0).view(-1).index_select(0, low))
            if n == 1:
                dR[..., self.offs[0]] = ds
                continue
            G, Y, Ai = self.G[l], self.Y[l], self.Ai[l]
            assert Y is not None and Ai is not None  # kept for every layer with n > 1
            U = torch.bmm(ds, Ai, out=self._buf("U", (c, T, T * n)))  # ∂Y = ∂s Â
            dAi = torch.bmm(ds.transpose(1, 2), Y, out=self._buf("dAi", (c, T, T * n)))
            dAi.baddbmm_(U, G.transpose(1, 2))  # ∂Â = ∂sᵀ Y + U Gᵀ
            dAI[:, :, T : n * T].view(c, T, n - 1, T).add_(dAi.view(c, T, T, n)[:, :, :, 1:].permute(0, 1, 3, 2))
            dG = torch.bmm(Ai.transpose(1, 2), U, out=self._buf("dG", (c, T * n, T * n)))  # Âᵀ U
            _swap_copy(dR[..., self.offs[l] : self.offs[l] + n * n].view(c, T, T, n, n), dG.view(c, T, n, T, n))
        acc.dKr.index_add_(0, self.base, dR.view(-1, width))


def _swap_copy(out: torch.Tensor, src: torch.Tensor) -> None:
    """out[b, p, q, r, :] = src[b, p, r, q, :] (5-D, last dim contiguous in both).  The last dimension is
    moved as one wide element where its byte size allows (int64 / complex128 views: an exact bit copy),
    which is several times faster than torch's strided copy of a few-element inner dimension."""
    wide = {8: torch.int64, 16: torch.complex128}.get(src.shape[-1] * src.element_size())
    if wide is not None:
        try:
            out.view(wide).copy_(src.view(wide).transpose(2, 3))
            return
        except RuntimeError:  # strides or offset not divisible: copy element by element
            pass
    out.copy_(src.transpose(2, 3))


def team_size(dev: torch.device) -> int:
    """Workers for the path implementation: torch's thread count on CPU, 1 elsewhere."""
    return torch.get_num_threads() if dev.type == "cpu" else 1


def path_pass(
    inp: PathInputs,
    x: torch.Tensor,
    ws: Workspace,
    team: Team,
    *,
    targets: torch.Tensor | None = None,
    g: torch.Tensor | None = None,
    scale: float = 1.0,
    logits: torch.Tensor | None = None,
    chunk: int | None = None,
    fresh: bool = False,
) -> _Grads | None:
    """Run the path expansion over a batch x (B, T') in chunks, one lane per worker of ``team``.

    ``logits`` (B, T', |V|) given: forward only, logits written there.  Otherwise gradients, from
    ``targets`` (B, T'; cross-entropy, weighted by ``scale``) or from ``g`` = ∂L/∂logits (B, T', |V|);
    returns the summed accumulators (lane 0's; fresh tensors if ``fresh``).  At most ``chunk``
    sequences per chunk.  Chunk k belongs to lane k mod (number of lanes); lanes are summed in order,
    so results are deterministic for a given worker count.
    """
    B, T = x.shape
    kind = "cpu" if inp.ZL.device.type == "cpu" else "other"
    c = max(1, min(B, CHUNK_BYTES[kind] // _chunk_bytes(T, inp.L, inp.ZL.element_size())))
    if chunk is not None:
        c = max(1, min(c, int(chunk)))
    if team.n > 1:
        c = min(c, -(-B // team.n))  # at least one chunk per lane
    bounds = [(b0, min(B, b0 + c)) for b0 in range(0, B, c)]
    lanes = min(team.n, len(bounds))
    accs: list[_Grads] = []
    if logits is None:
        accs = [
            _Grads(
                inp,
                fresh_pass if (w == 0 and fresh) else (lambda name, *a, w=w, **k: ws.get(f"acc{w}.{name}", *a, **k)),
            )
            for w in range(lanes)
        ]

    def work(w: int, k: int) -> None:
        b0, b1 = bounds[k]
        p = _Chunk(inp, x[b0:b1], ws, f"lane{w}")
        if logits is not None:
            p.logits_into(logits[b0:b1])
            return
        if targets is not None:
            p.loss_backward(targets[b0:b1], scale, accs[w])
        else:
            assert g is not None  # gradients from targets or from g
            p.grad_backward(g[b0:b1], accs[w])
        p.attention_backward(accs[w])

    team.run(work, [list(range(w, len(bounds), lanes)) for w in range(lanes)])
    if logits is None:
        for a in accs[1:]:  # fixed order: deterministic for a given lane count
            accs[0].add_(a)
        return accs[0]
    return None


def _token_major(W_O: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
    """ZL (|V|, 2^L, |V|) from W_O and the stacked [V_S W_O]_{S≠∅} ((2^L − 1)·|V|, |V|)."""
    V = W_O.shape[0]
    return torch.cat([W_O[None], Z.view(-1, V, V)]).transpose(0, 1).contiguous()


class PathsFunction(torch.autograd.Function):
    """Autograd wrapper of the path expansion: logits from (W_O, Z, K_l, P_l) as stacked by
    :meth:`AssocModel.path_products`; backward by hand (the attention part is recomputed chunk by
    chunk)."""

    @staticmethod
    def forward(ctx, x, ws, W_O, Z, *rest):  # rest = K_l (L, stacked (n², |V|²)) then P_l (L)
        L = len(rest) // 2
        offs, width = _pair_columns(L)
        Kr = torch.zeros(W_O.shape[0] ** 2, width, dtype=W_O.dtype, device=W_O.device)
        for l, k in enumerate(rest[:L]):
            Kr[:, offs[l] : offs[l] + k.shape[0]] = k.reshape(k.shape[0], -1).t()
        inp = PathInputs.build(Kr, _token_major(W_O, Z), list(rest[L:]), x.shape[1])
        out = torch.empty(*x.shape, W_O.shape[0], dtype=W_O.dtype, device=W_O.device)
        with Team(team_size(W_O.device)) as team:
            path_pass(inp, x, ws, team, logits=out)
        ctx.state = (inp, x, ws, [k.shape for k in rest[:L]], [p.shape[0] for p in rest[L:]])
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        inp, x, ws, kshapes, plens = ctx.state
        with Team(team_size(g.device)) as team:
            acc = path_pass(inp, x, ws, team, g=g, fresh=True)
        V = inp.ZL.shape[0]
        dZ = acc.dZ.transpose(0, 1).reshape(-1, V)
        offs, _ = _pair_columns(len(kshapes))
        dKs = [acc.dKr[:, o : o + s[0]].t().reshape(s) for o, s in zip(offs, kshapes)]
        dPs = [F.pad(d, (0, n - d.shape[0])) for d, n in zip(acc.dP, plens)]
        return (None, None, acc.dW, dZ, *dKs, *dPs)
