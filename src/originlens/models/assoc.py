"""The one-hot attention-only transformer of arXiv 2601.19208, Definition 3.1.

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
  ``W_O[x] + Σ_{S≠∅} A_S (V_S W_O)[x]`` (row gathers).  No (B·T)×|V|×|V| product is formed.  Per
  optimiser step (:meth:`AssocModel.accumulate_gradients`):

  1. the batch-independent products (:class:`_Products`: 25 |V|³ matmuls at L = 3, one per product,
     torch's intra-op threads), written into reused buffers in the layouts the pass reads: the 2^L − 1
     rows V_S W_O of a token side by side (token-major), and all K_{S,S'} = V_S W V_{S'}ᵀ of all layers
     for a token pair in one 96-byte row (pair-major, L = 3);
  2. the pass over the batch (:func:`_path_pass`) in chunks of a few sequences (:class:`_Chunk`):
     attention forward, logits + cross-entropy + their gradients, attention backward, all by hand (no
     autograd graph, no (B, T, |V|) tensor: logits live in a per-chunk buffer), gradients scattered
     into per-lane accumulators;
  3. the products' backward by hand (2 matmuls per product).

  Cost ≈ 3·25 |V|³ + 3·(5/8)·7·B·T²·|V| multiply-adds at L = 3 (causal: key blocks of 32 positions
  skip the query rows above them) + the attention part (≈ 40·B·T³) + memory traffic (two pair rows
  and 2·7 |V|-rows per token pair / position).  Best when B·T ≫ |V| and L is small (the paper's L = 3);
  the |V|³ products do not shrink with the batch, so the gain over "dense" grows with it.  On one
  core, |V| = 1000, T = 64, batch 512, about 40 % of a step are the products (GEMMs at the core's
  peak), 35 % the logits part (GEMMs plus gathers/scatters of |V|-rows) and 25 % the attention part.
* ``"gather"`` — first layer by gathers (``W[x_t, x_j]``, ``V[x_j]``), deeper layers dense matmuls on
  the (B, T, |V|) residual stream.  Per-batch cost ≈ (2L − 1)·B·T·|V|².
* ``"dense"`` — the straightforward one-hot implementation (reference for tests and benchmarks),
  ≈ (2L + 1)·B·T·|V|².

``"auto"`` (default) picks between ``"paths"`` and ``"gather"`` with a cost estimate (:func:`path_cost`).
All three agree to round-off (same terms, different summation order; float64 ≈ 1e-13 relative); the
hand-written backward is tested against Lemma D.7's gradients, the dense implementation and finite
differences.  Speed: ``benchmarks/assoc_train.py`` (figures in the benchmark notes).

Memory: "paths" keeps the products (≈ 2·4^{L−1}·|V|² floats for the deepest layer, twice, plus
2^L·|V|² for the rows V_S W_O), one gradient accumulator per lane (≈ 1.5·4^{L−1}·|V|² + 2^L·|V|²), and
per chunk a few MiB of attention state (CPU: :data:`CHUNK_BYTES`, :data:`ROWS_BYTES`,
:data:`ROW_POSITIONS`); ≈ 0.45 GiB at |V| = 1000, L = 3 on one thread.  The training loop reuses these
buffers from step to step (:class:`Workspace`, released with :meth:`AssocModel.release_workspace`):
large fresh allocations are expensive on CPU (every first touch of a page faults).  Runs on CPU or
CUDA (all tensors on the parameters' device; other devices use one lane and large chunks).

Threads: on CPU the chunks run on ``torch.get_num_threads()`` worker threads (:class:`_Team`) with
single-threaded ops, chunk k in lane k mod n, a worker taking the next chunk of any lane that is not
running (so a core shared with another process does not hold the other back), lanes summed in a
fixed order: deterministic for a given thread count; different thread counts differ by round-off.
The |V|³ products use torch's intra-op threads.

Saved weights use the paper's 1-based layer numbers: keys ``W_O``, ``W.1``…``W.L``, ``V.l``, ``P.l``
(:meth:`AssocModel.weights` / :meth:`AssocModel.load_weights`); the torch ``state_dict`` keeps
``nn.ParameterList``'s 0-based keys and is not the on-disk format.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass

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


BMM_PENALTY = 2.0  # batched T-sized products run ~2× slower per multiply-add than large GEMMs
ELEMENT_COST = 20.0  # one gathered/scattered element costs about as much as 20 GEMM multiply-adds


def path_cost(batch: int, seq_len: int, vocab: int, n_layers: int) -> dict[str, float]:
    """Cost estimates of one forward + backward in GEMM multiply-add equivalents (calibrated on CPU:
    batched T-sized products weighted by ``BMM_PENALTY``, memory-bound gathers/scatters by
    ``ELEMENT_COST`` per element); used by ``impl="auto"``.

    ``paths``: 3 × (number of |V|³ products) × |V|³ + 3·m·B·T²·|V| for the logits path (m = 2^L − 1) +
    the attention mixing + gathers/scatters of K entries and Z rows.
    """
    B, T, V, L = batch, seq_len, vocab, n_layers
    m = 2**L - 1
    n_prod = m  # V_S W_O
    mix = 0.0
    elems = 2 * m * B * T * V  # Z rows gathered, their gradients scattered
    for l in range(1, L + 1):
        k = 2 ** (l - 1)
        n_prod += (k - 1) + k * (k - 1)  # V_S W and V_S W V_S'ᵀ
        mix += 3 * (k * B * T * T * k * T + B * T * T * k * T)  # Y = Σ A_S G[S], s = Y Acatᵀ, ×3 with backward
        elems += 2 * B * T * T * k * k  # K entries gathered and scattered
    paths = 3 * n_prod * V**3 + BMM_PENALTY * (3 * m * B * T * T * V + mix) / 2 + ELEMENT_COST * elems
    gather = (
        (2 * L - 1) * 3 * B * T * V * V + BMM_PENALTY * (2 * L - 1) * 3 * B * T * T * V + ELEMENT_COST * 4 * B * T * V
    )
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


# Scratch sizes of the path implementation (CPU: cache-sized pieces; other devices: large batches).
CHUNK_BYTES = {"cpu": 8 * 1024**2, "other": 2 * 1024**3}  # attention state of one chunk (worker task)
ROWS_BYTES = {"cpu": 4 * 1024**2, "other": 1024**3}  # gathered Z rows per block of the logits path
ROW_POSITIONS = {"cpu": 32, "other": 0}  # key positions per row block (0: all T')


class Workspace:
    """Reusable scratch tensors keyed by name (one flat buffer per name, grown on demand).

    Large fresh allocations are expensive on CPU (every first touch of a new page faults); the training
    loop reuses these buffers from step to step.  A tensor handed out under a name is valid until the
    same name is requested again.  Worker threads use distinct names.
    """

    def __init__(self) -> None:
        self._bufs: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()

    def get(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, *, zero: bool = False
    ) -> torch.Tensor:
        n = math.prod(shape)
        with self._lock:
            buf = self._bufs.get(name)
            if buf is None or buf.numel() < n or buf.dtype != dtype or buf.device != device:
                buf = torch.empty(n, dtype=dtype, device=device)
                self._bufs[name] = buf
        out = buf[:n].view(shape)
        return out.zero_() if zero else out

    def clear(self) -> None:
        self._bufs.clear()


def _fresh(
    name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, *, zero: bool = False
) -> torch.Tensor:
    return (torch.zeros if zero else torch.empty)(shape, dtype=dtype, device=device)


def _low(S: int) -> tuple[int, int]:
    """(lowest layer index i in bitmask S, S without it)."""
    return (S & -S).bit_length() - 1, S & (S - 1)


class _Job:
    """Tasks grouped in lanes: a lane's tasks run in order, one at a time (they share a lane's
    accumulators and scratch); different lanes run concurrently."""

    def __init__(self, fn, lanes: list[list[int]]) -> None:
        self.fn, self.lanes = fn, lanes
        self.pos = [0] * len(lanes)
        self.busy = [False] * len(lanes)
        self.left = sum(len(q) for q in lanes)  # tasks not yet finished
        self.error: BaseException | None = None

    def take(self, w: int) -> tuple[int, int] | bool | None:
        """(lane, task) to run; None when every task is handed out (or the job failed); False when the
        remaining tasks all belong to running lanes (wait)."""
        if self.error is not None:
            return None
        n = len(self.lanes)
        order = ([w] if w < n else []) + [u for u in range(n) if u != w]
        waiting = False
        for u in order:
            if self.pos[u] < len(self.lanes[u]):
                if not self.busy[u]:
                    self.busy[u] = True
                    self.pos[u] += 1
                    return u, self.lanes[u][self.pos[u] - 1]
                waiting = True
        return False if waiting else None


class _Team:
    """Worker threads for the CPU path implementation (the calling thread is worker 0).

    With n > 1 workers the chunks of a batch (:func:`_path_pass`) are tasks that the workers take
    dynamically, each running single-threaded torch ops.  Compared with torch's intra-op threads (a
    barrier per op, work split evenly in advance) this avoids hundreds of small barriers per chunk
    and keeps both cores busy when one of them is shared with another process.  Results do not depend
    on which worker runs a task (a task writes its lane's accumulators, lanes in a fixed order).  With
    n = 1 the team runs everything inline.  The large |V|×|V| products keep torch's intra-op threads.
    """

    def __init__(self, n: int) -> None:
        self.n = max(1, int(n))
        self._cond = threading.Condition()
        self._job: _Job | None = None
        self._gen = 0
        self._stop = False
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> _Team:
        if self.n > 1:
            self._threads = [threading.Thread(target=self._loop, args=(w,), daemon=True) for w in range(1, self.n)]
            for t in self._threads:
                t.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.n > 1:
            with self._cond:
                self._stop = True
                self._cond.notify_all()
            for t in self._threads:
                t.join()

    def _loop(self, w: int) -> None:
        seen = 0
        with torch.no_grad():  # grad mode is thread-local: new threads start with it on
            while True:
                with self._cond:
                    while not self._stop and self._gen == seen:
                        self._cond.wait()
                    if self._stop:
                        return
                    seen, job = self._gen, self._job
                self._work(job, w)

    def _work(self, job: _Job, w: int) -> None:
        while True:
            with self._cond:
                while (got := job.take(w)) is False:
                    self._cond.wait()
                if got is None:
                    return
            lane, k = got
            try:
                job.fn(lane, k)
            except BaseException as exc:  # re-raised in the calling thread
                with self._cond:
                    if job.error is None:
                        job.error = exc
            with self._cond:
                job.busy[lane] = False
                job.left -= 1
                self._cond.notify_all()

    def run(self, fn, lanes: list[list[int]]) -> None:
        """Call ``fn(lane, task)`` for every task of every lane (see :class:`_Job`); returns when all
        are done, re-raising the first error."""
        if self.n == 1 or sum(len(q) for q in lanes) <= 1:
            for u, q in enumerate(lanes):
                for k in q:
                    fn(u, k)
            return
        job = _Job(fn, lanes)
        prev = torch.get_num_threads()
        torch.set_num_threads(1)  # workers run single-threaded ops
        try:
            with self._cond:
                self._job = job
                self._gen += 1
                self._cond.notify_all()
            self._work(job, 0)
            with self._cond:
                while (job.left > 0 and job.error is None) or any(job.busy):
                    self._cond.wait()
        finally:
            torch.set_num_threads(prev)
        if job.error is not None:
            raise job.error


PAIR_BLOCK = 4096  # rows per block when packing / unpacking the pair-major products (cache-sized transposes)


def _blocks(team: _Team, N: int, fn, device: torch.device) -> None:
    """fn(r0, r1) over blocks of PAIR_BLOCK rows of 0..N−1, spread over the team's workers (one block
    on devices other than the CPU)."""
    if device.type != "cpu":
        fn(0, N)
        return
    bounds = [(r, min(N, r + PAIR_BLOCK)) for r in range(0, N, PAIR_BLOCK)]
    lanes = [list(range(w, len(bounds), team.n)) for w in range(team.n)]
    team.run(lambda lane, k: fn(*bounds[k]), lanes)


def _pair_columns(L: int) -> tuple[list[int], int]:
    """Column offset of each layer's n² = 4^{l−1} pair values in a pair-major row (largest layer first,
    every block of more than one value at a multiple of 4 so it can be moved as wide elements), and the
    row width (padded to a multiple of 4)."""
    offs, o = [0] * L, 0
    for l in range(L - 1, -1, -1):
        offs[l] = o
        o += 4**l
    return offs, (o if L == 1 else -(-o // 4) * 4)


class _Products:
    """The batch-independent |V|×|V| products of one optimiser step, in the layouts the chunk pass reads,
    with a hand-written backward (no autograd graph, every product written into reused buffers).

    * ``ZL`` (|V|, 2^L, |V|), token-major: ``ZL[x, S]`` = (V_S W_O)[x] for every S ⊆ {1..L} (S = ∅: W_O),
      so the 2^L − 1 rows a position needs are one contiguous read.  V_S W_O = V_i (V_{S∖i} W_O) with i
      the lowest layer of S.
    * ``K[l]`` (n, n, |V|, |V|), n = 2^{l−1}: K_{S,S'} = V_S W^(l) V_{S'}ᵀ (left products V_i K_{S∖i,∅},
      then K_{S,S'} = K_{S,S'∖i} V_iᵀ), and ``Kr`` the pair-major copy of all layers (|V|², width): row
      x·|V| + x' holds K_{S,S'}[x, x'] of layer l at column offs[l] + S·n + S' (:func:`_pair_columns`),
      packed block by block (cache-sized transposes, ~3× faster than one strided copy).

    One matmul per product (25 at L = 3, torch's intra-op threads); :meth:`backward` takes 2 per product
    (∂ of both factors).
    """

    def __init__(self, W_O: torch.Tensor, Ws: list[torch.Tensor], Vs: list[torch.Tensor], ws, team: _Team) -> None:
        V, L = W_O.shape[0], len(Ws)
        self.V, self.L, self.Vs, self.ws = V, L, Vs, ws
        dev, dt = W_O.device, W_O.dtype
        ZL = ws("prod.ZL", (V, 1 << L, V), dt, dev)
        ZL[:, 0] = W_O
        for S in range(1, 1 << L):
            i, P = _low(S)
            torch.mm(Vs[i], ZL[:, P], out=ZL[:, S])
        self.ZL = ZL
        self.K: list[torch.Tensor | None] = [None] * L
        for l in range(1, L):
            n = 1 << l
            K = ws(f"prod.K{l}", (n, n, V, V), dt, dev)
            K[0, 0] = Ws[l]
            for S in range(1, n):
                i, P = _low(S)
                torch.mm(Vs[i], K[P, 0], out=K[S, 0])
            for S in range(n):
                for S2 in range(1, n):
                    i, P = _low(S2)
                    torch.mm(K[S, P], Vs[i].t(), out=K[S, S2])
            self.K[l] = K
        offs, width = _pair_columns(L)
        self.Kr = ws("prod.Kr", (V * V, width), dt, dev)
        srcs = [None] * L
        srcs[0] = Ws[0].reshape(-1, 1)
        for l in range(1, L):
            srcs[l] = self.K[l].view(4**l, V * V)
        pad = torch.zeros(1, width - (4**L - 1) // 3, dtype=dt, device=dev)

        def pack(r0: int, r1: int) -> None:  # rows r0..r1 of Kr, contiguous writes
            parts = [srcs[l][r0:r1] if l == 0 else srcs[l][:, r0:r1].t() for l in range(L - 1, -1, -1)]
            torch.cat(parts + [pad.expand(r1 - r0, -1)], dim=1, out=self.Kr[r0:r1])

        _blocks(team, V * V, pack, dev)

    def backward(self, dW: torch.Tensor, dZ: torch.Tensor, dKr: torch.Tensor, team: _Team) -> dict[str, torch.Tensor]:
        """Gradients of W_O, W^(l), V^(l) (on-disk names) from ∂W_O (direct term, (|V|, |V|)), ∂Z_S
        (|V|, 2^L − 1, |V|) token-major, and pair-major ∂K (layout of ``Kr``); all three are consumed
        (modified in place) and ``Kr`` is overwritten (its memory holds ∂K_{S,S'}).  Returned tensors are
        scratch: copy them before the next step."""
        V, L, Vs, ZL = self.V, self.L, self.Vs, self.ZL
        dev, dt = ZL.device, ZL.dtype
        dVs = [self.ws(f"prod.dV{i}", (V, V), dt, dev, zero=True) for i in range(L)]
        dZL = [dW] + [dZ[:, S] for S in range((1 << L) - 1)]
        for S in range((1 << L) - 1, 0, -1):  # Z_S = V_i Z_P
            i, P = _low(S)
            dVs[i].addmm_(dZL[S], ZL[:, P].t())
            dZL[P].addmm_(Vs[i].t(), dZL[S])
        offs, _ = _pair_columns(L)
        out = {"W_O": dW, "W.1": dKr[:, offs[0]].view(V, V)}
        o_dK = [0, 0]
        for l in range(2, L):
            o_dK.append(o_dK[-1] + 4 ** (l - 1) * V * V)
        for l in range(1, L):
            n = 1 << l
            K = self.K[l]
            dK = self.Kr.view(-1)[o_dK[l] : o_dK[l] + n * n * V * V].view(n, n, V, V)  # Kr is dead: reuse it
            dst, src = dK.view(n * n, V * V), dKr[:, offs[l] : offs[l] + n * n]
            _blocks(team, V * V, lambda r0, r1, dst=dst, src=src: dst[:, r0:r1].copy_(src[r0:r1].t()), dev)
            for S in range(n):
                for S2 in range(n - 1, 0, -1):  # K_{S,S2} = K_{S,P} V_iᵀ
                    i, P = _low(S2)
                    dVs[i].addmm_(dK[S, S2].t(), K[S, P])
                    dK[S, P].addmm_(dK[S, S2], Vs[i])
            for S in range(n - 1, 0, -1):  # K_{S,∅} = V_i K_{P,∅}
                i, P = _low(S)
                dVs[i].addmm_(dK[S, 0], K[P, 0].t())
                dK[P, 0].addmm_(Vs[i].t(), dK[S, 0])
            out[f"W.{l + 1}"] = dK[0, 0]
        for i in range(L):
            out[f"V.{i + 1}"] = dVs[i]
        return out


@dataclass
class _PathInputs:
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
    def build(cls, Kr: torch.Tensor, ZL: torch.Tensor, Ps: list[torch.Tensor], T: int) -> _PathInputs:
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

    def __init__(self, inp: _PathInputs, get) -> None:
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

    ``x`` (c, T') token ids; tensors of :class:`_PathInputs`; scratch from ``ws`` under names prefixed
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

    def __init__(self, inp: _PathInputs, x: torch.Tensor, ws: Workspace, tag: str) -> None:
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


def _team_size(dev: torch.device) -> int:
    """Workers for the path implementation: torch's thread count on CPU, 1 elsewhere."""
    return torch.get_num_threads() if dev.type == "cpu" else 1


def _path_pass(
    inp: _PathInputs,
    x: torch.Tensor,
    ws: Workspace,
    team: _Team,
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
                inp, _fresh if (w == 0 and fresh) else (lambda name, *a, w=w, **k: ws.get(f"acc{w}.{name}", *a, **k))
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


class _PathsFunction(torch.autograd.Function):
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
        inp = _PathInputs.build(Kr, _token_major(W_O, Z), list(rest[L:]), x.shape[1])
        out = torch.empty(*x.shape, W_O.shape[0], dtype=W_O.dtype, device=W_O.device)
        with _Team(_team_size(W_O.device)) as team:
            _path_pass(inp, x, ws, team, logits=out)
        ctx.state = (inp, x, ws, [k.shape for k in rest[:L]], [p.shape[0] for p in rest[L:]])
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        inp, x, ws, kshapes, plens = ctx.state
        with _Team(_team_size(g.device)) as team:
            acc = _path_pass(inp, x, ws, team, g=g, fresh=True)
        V = inp.ZL.shape[0]
        dZ = acc.dZ.transpose(0, 1).reshape(-1, V)
        offs, _ = _pair_columns(len(kshapes))
        dKs = [acc.dKr[:, o : o + s[0]].t().reshape(s) for o, s in zip(offs, kshapes)]
        dPs = [F.pad(d, (0, n - d.shape[0])) for d, n in zip(acc.dP, plens)]
        return (None, None, acc.dW, dZ, *dKs, *dPs)


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
                    raise CompatibilityError(
                        f"weights lack '{name}'", f"load a file saved for an L={self.n_layers} AssocModel"
                    )
                continue
            v = torch.as_tensor(np.asarray(tensors[name]) if not torch.is_tensor(tensors[name]) else tensors[name])
            if tuple(v.shape) != tuple(p.shape):
                raise CompatibilityError(
                    f"'{name}' has shape {tuple(v.shape)}, model expects {tuple(p.shape)}",
                    "load weights saved for the same |V|, T and L",
                )
            p.copy_(v.to(p.dtype))

    # ------------------------------------------------------------------ forward
    def _check_inputs(self, inputs: torch.Tensor) -> torch.Tensor:
        x = torch.as_tensor(inputs)
        if x.dim() != 2 or x.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise InputError(
                f"inputs must be a (B, T) integer tensor, got {x.dtype} {tuple(x.shape)}", "pass token ids"
            )
        if x.shape[1] > self.seq_len or x.shape[1] < 1:
            raise InputError(
                f"sequence length {x.shape[1]} outside 1..{self.seq_len}",
                f"this model has T = {self.seq_len} positions",
            )
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
        25).  Used by the autograd path (``loss(...).backward()`` with ``impl="paths"``) and as the
        reference the hand-written :class:`_Products` is tested against; :meth:`accumulate_gradients`
        uses :class:`_Products`.
        """
        V = self.vocab_size

        def above(i: int, bits: int) -> list[int]:  # subsets of {i+1..bits−1} (bitmasks), increasing
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
            for i in range(l - 1, -1, -1):  # K_{S,S'} = K_{S,S'∖i} V_iᵀ, stacked over (S, S'∖i)
                pairs = [(S, R) for S in range(n) for R in above(i, l)]
                prod = torch.cat([K[p] for p in pairs], dim=0) @ self.V[i].T
                for (S, R), part in zip(pairs, prod.split(V, dim=0)):
                    K[(S, R | (1 << i))] = part
            out.append(torch.stack([K[(S, S2)] for S in range(n) for S2 in range(n)]).reshape(n * n, -1))
        Z = left_products(self.W_O, self.n_layers)
        out.append(torch.cat([Z[S] for S in range(1, 1 << self.n_layers)]))
        return out

    def _forward_paths(self, x: torch.Tensor) -> torch.Tensor:
        """Path expansion h_l = Σ_S A_S X V_S (see module docstring and :class:`_Chunk`)."""
        track = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        if track:
            products = self.path_products()
            return _PathsFunction.apply(x, self.workspace(), self.W_O, products[-1], *products[:-1], *self.P)
        out = torch.empty(*x.shape, self.vocab_size, dtype=self.W_O.dtype, device=self.W_O.device)
        with torch.no_grad(), _Team(_team_size(self.W_O.device)) as team:
            prods = self._cached_products(team)
            inp = _PathInputs.build(prods.Kr, prods.ZL, list(self.P), x.shape[1])
            _path_pass(inp, x, self.workspace(), team, logits=out)
        return out

    def _products(self, get, team: _Team) -> _Products:
        return _Products(self.W_O.detach(), [w.detach() for w in self.W], [v.detach() for v in self.V], get, team)

    def accumulate_gradients(self, tokens: torch.Tensor, *, chunk: int | None = None, impl: str | None = None) -> float:
        """Add ∇ of the mean cross-entropy over all positions of ``tokens`` (B, T'+1) to ``.grad``.

        The batch is processed in chunks of at most ``chunk`` sequences (None = all at once; the path
        implementation also bounds its chunks by :data:`CHUNK_BYTES`), each weighted by its share of the
        batch, so the result equals the unchunked gradient up to round-off.  With the path
        implementation the batch-independent products are computed once per call (:class:`_Products`),
        the chunks are differentiated by hand (:class:`_Chunk`, cross-entropy gradient formed in place)
        and the products' gradients back-propagated by hand once.  Returns the batch loss (a float;
        NaN/Inf are returned, not raised).  ``impl`` is resolved for the whole batch size.
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
                c = tokens[i : i + chunk]
                loss = self.loss(c, impl=impl)
                w = c.shape[0] / n
                (loss * w if w != 1.0 else loss).backward()
                total += loss.item() * w
            return total
        ws = self.workspace()
        T = tokens.shape[1] - 1
        x = self._check_inputs(tokens[:, :-1])
        with torch.no_grad(), _Team(_team_size(self.W_O.device)) as team:
            prods = self._products(ws.get, team)
            inp = _PathInputs.build(prods.Kr, prods.ZL, list(self.P), T)
            acc = _path_pass(inp, x, ws, team, targets=tokens[:, 1:].long(), scale=1.0 / (n * T), chunk=chunk)
            grads = prods.backward(acc.dW, acc.dZ, acc.dKr, team)
            for l in range(self.n_layers):
                grads[f"P.{l + 1}"] = F.pad(acc.dP[l], (0, self.seq_len - T))
            for name, p in self.named_weights():
                if p.grad is None:
                    p.grad = grads[name].clone()
                else:
                    p.grad += grads[name]
        return float(acc.loss) / (n * T)

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

    def _cached_products(self, team: _Team) -> _Products:
        """:class:`_Products` (no autograd), reused while no parameter changes (evaluation loops over
        many batches: intervention, held-out losses).  Keyed on each parameter's storage and in-place
        version counter, so any update (optimizer step, ``load_weights``, ``copy_``) invalidates it."""
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in self.parameters())
        hit = self.__dict__.get("_product_cache")
        if hit is not None and hit[0] == key:
            return hit[1]
        with torch.no_grad():
            prods = self._products(_fresh, team)
        prods.K = []  # only the backward needs them
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
        raise CompatibilityError(
            f"{path} holds '{meta.get('kind')}', not an AssocModel",
            "pass a model.safetensors or checkpoint written by train_assoc",
        )
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
