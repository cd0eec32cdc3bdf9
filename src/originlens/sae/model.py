"""Sparse autoencoders on a residual stream: :class:`SAEConfig` and the :class:`SAE` module.

Three architectures, with SAELens' conventions (so weights move between the two unchanged):

* ``standard``: ``a = ReLU((x − b_dec·[apply_b_dec_to_input]) W_enc + b_enc)``;
* ``jumprelu`` (Gemma Scope): ``a = ReLU(h) · 1[h > threshold]`` with ``h`` the pre-activation above;
* ``topk``: the k largest pre-activations per row pass through ReLU, the rest are zero.

Decoding is ``x̂ = a W_dec + b_dec``.  Shapes: ``W_enc (d_in, d_sae)``, ``b_enc (d_sae)``,
``W_dec (d_sae, d_in)``, ``b_dec (d_in)``, ``threshold (d_sae)``.

``normalize_activations`` follows SAELens: ``"none"`` and ``"expected_average_only_in"`` are the identity
at run time (SAELens folds the dataset scaling factor into the weights when it loads a release; a
checkpoint that still needs it cannot be used faithfully and :mod:`.format` warns), ``"constant_norm_rescale"``
scales every input to norm √d_in and undoes it after decoding, ``"layer_norm"`` standardises the input and
undoes it after decoding.  :meth:`SAE.encode_with_state` returns that per-input state so that decoder
contributions (:meth:`SAE.feature_contribution`) are mapped back to the model's space exactly.

The SAE's residual site is ``hook_name`` (SAELens/TransformerLens spelling, e.g.
``blocks.3.hook_resid_post`` = our ``resid.4``); :func:`sae_site` checks it and the width against a model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from ..errors import CompatibilityError, ConfigError

ARCHITECTURES = ("standard", "jumprelu", "topk")
NORMALIZATIONS = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}


def dtype_name(dtype: torch.dtype | str) -> str:
    """``"float32"`` for ``torch.float32`` / ``"torch.float32"`` / ``"float32"``."""
    s = str(dtype).replace("torch.", "")
    if s not in DTYPES:
        raise ConfigError(f"unsupported SAE dtype {dtype!r}", f"use one of: {', '.join(DTYPES)}")
    return s


def hook_layer_of(hook_name: str) -> int | None:
    """SAELens' ``hook_layer``: the block index in ``blocks.L.<hook>`` (None for other names)."""
    m = re.match(r"blocks\.(\d+)\.", hook_name or "")
    return int(m.group(1)) if m else None


@dataclass
class SAEConfig:
    """What a SAELens ``cfg.json`` says about an SAE (the fields originlens uses; the rest in ``extra``)."""

    d_in: int
    d_sae: int
    architecture: str = "standard"
    k: int | None = None  # topk only
    hook_name: str = "blocks.0.hook_resid_post"
    model_name: str | None = None
    dtype: str = "float32"
    device: str = "cpu"
    apply_b_dec_to_input: bool = True
    normalize_activations: str = "none"
    prepend_bos: bool = True
    context_size: int | None = None
    dataset_path: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # other keys of cfg.json, kept on rewrite

    def __post_init__(self) -> None:
        for name in ("d_in", "d_sae"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"SAE {name} must be a positive integer, got {v!r}", f"fix {name} in cfg.json")
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(
                f"unsupported SAE architecture {self.architecture!r}",
                f"originlens runs {', '.join(ARCHITECTURES)} SAEs",
            )
        if self.architecture == "topk":
            if isinstance(self.k, bool) or not isinstance(self.k, int) or not 1 <= self.k <= self.d_sae:
                raise ConfigError(
                    f"a topk SAE needs an integer k in 1..d_sae={self.d_sae}, got {self.k!r}",
                    "set k in cfg.json (or --k)",
                )
        if self.normalize_activations is None:
            self.normalize_activations = "none"
        if self.normalize_activations not in NORMALIZATIONS:
            raise ConfigError(
                f"unsupported normalize_activations {self.normalize_activations!r}",
                f"use one of: {', '.join(NORMALIZATIONS)}",
            )
        self.dtype = dtype_name(self.dtype)

    @property
    def hook_layer(self) -> int | None:
        return hook_layer_of(self.hook_name)


@dataclass
class NormState:
    """Per-input state of the activation normalisation: model space = normalised · scale + shift."""

    scale: Tensor | float = 1.0
    shift: Tensor | float = 0.0


class SAE(nn.Module):
    """A sparse autoencoder (see the module docstring).  Parameters use SAELens' names and shapes."""

    def __init__(self, cfg: SAEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        dt = DTYPES[cfg.dtype]
        d, m = cfg.d_in, cfg.d_sae
        self.W_enc = nn.Parameter(torch.zeros(d, m, dtype=dt))
        self.b_enc = nn.Parameter(torch.zeros(m, dtype=dt))
        self.W_dec = nn.Parameter(torch.zeros(m, d, dtype=dt))
        self.b_dec = nn.Parameter(torch.zeros(d, dtype=dt))
        self.threshold: nn.Parameter | None
        if cfg.architecture == "jumprelu":
            self.threshold = nn.Parameter(torch.zeros(m, dtype=dt))
        else:
            self.threshold = None

    # -- sizes ----------------------------------------------------------------------------------------
    @property
    def d_in(self) -> int:
        return self.cfg.d_in

    @property
    def d_sae(self) -> int:
        return self.cfg.d_sae

    @property
    def dtype(self) -> torch.dtype:
        return self.W_enc.dtype

    # -- normalisation --------------------------------------------------------------------------------
    def _normalise(self, x: Tensor) -> tuple[Tensor, NormState]:
        mode = self.cfg.normalize_activations
        if mode == "constant_norm_rescale":
            coeff = (self.d_in**0.5) / x.norm(dim=-1, keepdim=True)
            return x * coeff, NormState(scale=1.0 / coeff)
        if mode == "layer_norm":
            mu = x.mean(dim=-1, keepdim=True)
            xc = x - mu
            std = xc.std(dim=-1, keepdim=True)
            return xc / (std + 1e-5), NormState(scale=std, shift=mu)
        return x, NormState()

    # -- encode / decode ------------------------------------------------------------------------------
    def hidden_pre(self, x: Tensor) -> tuple[Tensor, NormState]:
        """Pre-activations ``(..., d_sae)`` of inputs ``(..., d_in)`` and the normalisation state."""
        x = x.to(self.dtype)
        xn, state = self._normalise(x)
        if self.cfg.apply_b_dec_to_input:
            xn = xn - self.b_dec
        return xn @ self.W_enc + self.b_enc, state

    def activation(self, pre: Tensor) -> Tensor:
        """The architecture's nonlinearity applied to pre-activations ``(..., d_sae)``."""
        arch = self.cfg.architecture
        if arch == "standard":
            return torch.relu(pre)
        if arch == "jumprelu":
            assert self.threshold is not None  # jumprelu SAEs have one
            return torch.relu(pre) * (pre > self.threshold).to(pre.dtype)
        assert self.cfg.k is not None  # SAEConfig requires k for topk
        top = torch.topk(pre, self.cfg.k, dim=-1)
        return torch.zeros_like(pre).scatter(-1, top.indices, torch.relu(top.values))

    def encode_with_state(self, x: Tensor) -> tuple[Tensor, NormState]:
        """Latent activations ``(..., d_sae)`` and the normalisation state needed to decode them."""
        pre, state = self.hidden_pre(x)
        return self.activation(pre), state

    def encode(self, x: Tensor) -> Tensor:
        """``(..., d_in)`` → latent activations ``(..., d_sae)``."""
        return self.encode_with_state(x)[0]

    def encode_subset(self, x: Tensor, features: Tensor) -> Tensor:
        """Activations ``(..., len(features))`` of the latents ``features`` only (equal to
        ``encode(x)[..., features]``; cheaper for standard and jumprelu, whose latents are independent)."""
        if self.cfg.architecture == "topk":
            return self.encode(x)[..., features]
        x = x.to(self.dtype)
        xn, _ = self._normalise(x)
        if self.cfg.apply_b_dec_to_input:
            xn = xn - self.b_dec
        pre = xn @ self.W_enc[:, features] + self.b_enc[features]
        if self.cfg.architecture == "standard":
            return torch.relu(pre)
        assert self.threshold is not None  # jumprelu SAEs have one
        return torch.relu(pre) * (pre > self.threshold[features]).to(pre.dtype)

    def decode(self, acts: Tensor, state: NormState | None = None) -> Tensor:
        """``(..., d_sae)`` → reconstruction ``(..., d_in)`` (in model space when ``state`` is given)."""
        y = acts.to(self.dtype) @ self.W_dec + self.b_dec
        if state is not None:
            y = y * state.scale + state.shift
        return y

    def forward(self, x: Tensor) -> Tensor:
        """Reconstruction ``x̂`` of ``x`` ``(..., d_in)``."""
        acts, state = self.encode_with_state(x)
        return self.decode(acts, state)

    def feature_contribution(self, acts_f: Tensor, features: Tensor | int, state: NormState | None = None) -> Tensor:
        """Decoder contribution ``a_f · W_dec[f]`` in model space: ``acts_f (n,)``, ``features (n,)`` or
        an int → ``(n, d_in)``.  ``state`` rows must match (from :meth:`encode_with_state`)."""
        rows = self.W_dec[features]
        if rows.dim() == 1:
            rows = rows.expand(acts_f.shape[0], -1)
        out = acts_f.to(self.dtype)[:, None] * rows
        if state is not None and not isinstance(state.scale, float):
            out = out * state.scale
        return out

    # -- weight transformations (used by training) ---------------------------------------------------
    @torch.no_grad()
    def fold_input_scale(self, s: float) -> None:
        """An SAE trained on ``s·x`` becomes one that reads and writes ``x`` (same latent activations;
        requires ``normalize_activations`` none)."""
        self.W_enc.mul_(s)
        self.W_dec.div_(s)
        self.b_dec.div_(s)

    @torch.no_grad()
    def fold_decoder_norm(self) -> None:
        """Rescale so that every decoder row has unit norm; latent activations (and jumprelu thresholds)
        scale by the old norms and the reconstruction is unchanged.  Exact for standard and jumprelu;
        for topk only when all rows share one norm (else the top-k selection could change)."""
        n = self.W_dec.norm(dim=-1).clamp_min(torch.finfo(self.dtype).tiny)
        self.W_dec.div_(n[:, None])
        self.W_enc.mul_(n[None, :])
        self.b_enc.mul_(n)
        if self.threshold is not None:
            self.threshold.mul_(n)

    def extra_repr(self) -> str:
        c = self.cfg
        return f"{c.architecture}, d_in={c.d_in}, d_sae={c.d_sae}, hook={c.hook_name}" + (
            f", k={c.k}" if c.architecture == "topk" else ""
        )


def sae_site(sae: SAE, adapter: Any, site: int | str | None = None) -> int:
    """Residual index k (``resid.k``) where ``sae`` reads ``adapter``'s stream, checked for width and hook.

    ``site`` (optional) must agree with the SAE's ``hook_name``; mismatches raise
    :class:`CompatibilityError` (an SAE read at another site measures nothing meaningful).
    """
    from ..sites import parse_site, site_from_hook_name

    try:
        k_sae = site_from_hook_name(sae.cfg.hook_name)
    except ConfigError:
        raise CompatibilityError(
            f"the SAE reads hook {sae.cfg.hook_name!r}, not a residual stream",
            "use an SAE trained on blocks.L.hook_resid_pre / hook_resid_post",
        ) from None
    if not 0 <= k_sae <= adapter.n_layers:
        raise CompatibilityError(
            f"the SAE reads {sae.cfg.hook_name} but the model has {adapter.n_layers} layers",
            "use an SAE trained for this model",
        )
    if site is not None:
        k = parse_site(site, adapter.n_layers) if isinstance(site, str) else adapter.check_site(site)
        if k != k_sae:
            raise CompatibilityError(
                f"site resid.{k} requested but the SAE was trained on {sae.cfg.hook_name} (= resid.{k_sae})",
                "drop --site or pass the SAE's own site",
            )
    if sae.cfg.d_in != adapter.d_model:
        raise CompatibilityError(
            f"the SAE has d_in={sae.cfg.d_in} but the model's residual width is {adapter.d_model}",
            "use an SAE trained on this model",
        )
    return k_sae
