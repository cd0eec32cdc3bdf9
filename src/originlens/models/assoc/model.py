"""The one-hot attention-only transformer (:class:`AssocModel`, arXiv 2601.19208 Def. 3.1) with its three
implementations, the dense reference logits and loading.  Part of :mod:`originlens.models.assoc`."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...errors import CompatibilityError, ConfigError, InputError
from .config import CHECKPOINT_KIND, IMPLS, MODEL_KIND, AssocConfig, weight_names
from .cost import path_cost
from .ops import causal_softmax, diag_matrix
from .paths import PathInputs, PathsFunction, Products, path_pass, team_size
from .workers import Team, Workspace, fresh_pass, subnormals_flushed


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
            a = causal_softmax(s)
            h = h + a @ (h @ self.V[l])
        return h @ self.W_O

    def _forward_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Layer 1 by gathers, deeper layers dense."""
        T = x.shape[1]
        W0 = self.W[0]
        s = W0[x[:, :, None], x[:, None, :]] + self._dm(0, T)
        a = causal_softmax(s)
        h = a @ F.embedding(x, self.V[0])
        h = h + F.one_hot(x, self.vocab_size).to(h.dtype)
        for l in range(1, self.n_layers):
            s = (h @ self.W[l]) @ h.transpose(1, 2) + self._dm(l, T)
            a = causal_softmax(s)
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
        reference the hand-written :class:`Products` is tested against; :meth:`accumulate_gradients`
        uses :class:`Products`.
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
            return PathsFunction.apply(x, self.workspace(), self.W_O, products[-1], *products[:-1], *self.P)
        out = torch.empty(*x.shape, self.vocab_size, dtype=self.W_O.dtype, device=self.W_O.device)
        with torch.no_grad(), Team(team_size(self.W_O.device)) as team:
            prods = self._cached_products(team)
            inp = PathInputs.build(prods.Kr, prods.ZL, list(self.P), x.shape[1])
            path_pass(inp, x, self.workspace(), team, logits=out)
        return out

    def _products(self, get, team: Team) -> Products:
        return Products(self.W_O.detach(), [w.detach() for w in self.W], [v.detach() for v in self.V], get, team)

    def accumulate_gradients(self, tokens: torch.Tensor, *, chunk: int | None = None, impl: str | None = None) -> float:
        """Add ∇ of the mean cross-entropy over all positions of ``tokens`` (B, T'+1) to ``.grad``.

        The batch is processed in chunks of at most ``chunk`` sequences (None = all at once; the path
        implementation also bounds its chunks by :data:`CHUNK_BYTES`), each weighted by its share of the
        batch, so the result equals the unchunked gradient up to round-off.  With the path
        implementation the batch-independent products are computed once per call (:class:`Products`),
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
            with subnormals_flushed():  # the calling thread only (see that function)
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
        with torch.no_grad(), Team(team_size(self.W_O.device)) as team:
            prods = self._products(ws.get, team)
            inp = PathInputs.build(prods.Kr, prods.ZL, list(self.P), T)
            acc = path_pass(inp, x, ws, team, targets=tokens[:, 1:].long(), scale=1.0 / (n * T), chunk=chunk)
            assert acc is not None  # no logits given: gradients are returned
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

    def _cached_products(self, team: Team) -> Products:
        """:class:`Products` (no autograd), reused while no parameter changes (evaluation loops over
        many batches: intervention, held-out losses).  Keyed on each parameter's storage and in-place
        version counter, so any update (optimizer step, ``load_weights``, ``copy_``) invalidates it."""
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in self.parameters())
        hit = self.__dict__.get("_product_cache")
        if hit is not None and hit[0] == key:
            return hit[1]
        self.__dict__.pop("_product_cache", None)  # stale: free it before building the next (≈ 40 |V|² numbers)
        with torch.no_grad():
            prods = self._products(fresh_pass, team)
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
    from ...storage import load_tensors

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
