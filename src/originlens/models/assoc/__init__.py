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

  1. the batch-independent products (:class:`Products`: 25 |V|³ matmuls at L = 3, one per product,
     torch's intra-op threads), written into reused buffers in the layouts the pass reads: the 2^L − 1
     rows V_S W_O of a token side by side (token-major), and all K_{S,S'} = V_S W V_{S'}ᵀ of all layers
     for a token pair in one 96-byte row (pair-major, L = 3);
  2. the pass over the batch (:func:`path_pass`) in chunks of a few sequences (:class:`_Chunk`):
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

Threads: on CPU the chunks run on ``torch.get_num_threads()`` worker threads (:class:`Team`) with
single-threaded ops, chunk k in lane k mod n, a worker taking the next chunk of any lane that is not
running (so a core shared with another process does not hold the other back), lanes summed in a
fixed order: deterministic for a given thread count; different thread counts differ by round-off.
The |V|³ products use torch's intra-op threads, except those whose entries may be subnormal.

Subnormal floats: from zero init the weights grow like powers of t = sη and the early products fall
below float32's normal range, which x86 cores handle 10–15× slower; the path implementation flushes
subnormals to zero in every thread it computes in (:func:`~.workers.subnormals_flushed`; values below
1.2e-38, far under any weight's round-off), the other implementations in the calling thread.

Saved weights use the paper's 1-based layer numbers: keys ``W_O``, ``W.1``…``W.L``, ``V.l``, ``P.l``
(:meth:`AssocModel.weights` / :meth:`AssocModel.load_weights`); the torch ``state_dict`` keeps
``nn.ParameterList``'s 0-based keys and is not the on-disk format.
"""

from __future__ import annotations

from .config import CHECKPOINT_KIND, IMPLS, MODEL_KIND, AssocConfig, weight_names
from .cost import BMM_PENALTY, ELEMENT_COST, path_cost
from .model import AssocModel, dense_logits, load_assoc
from .ops import diag_matrix
from .workers import CHUNK_BYTES, PAIR_BLOCK, ROW_POSITIONS, ROWS_BYTES, Workspace

__all__ = [
    "BMM_PENALTY",
    "CHECKPOINT_KIND",
    "CHUNK_BYTES",
    "ELEMENT_COST",
    "IMPLS",
    "MODEL_KIND",
    "PAIR_BLOCK",
    "ROWS_BYTES",
    "ROW_POSITIONS",
    "AssocConfig",
    "AssocModel",
    "Workspace",
    "dense_logits",
    "diag_matrix",
    "load_assoc",
    "path_cost",
    "weight_names",
]
