"""Stop-gradient at residual sites (the primitive behind the Prop. 3.1 decomposition of arXiv 2603.14087).

``sg(k, i)`` is a forward pass whose values are bit-identical to the ordinary one but in which no
gradient flows back through the residual stream r^k_i (all batch rows).  It is the rewrite

    H^k ← H^k + m_i ⊙ (sg(H^k) − H^k)          (m_i: one-hot mask of position i)

applied to the tensor that downstream computation consumes, through the model's residual hooks
(``model(tokens, hooks={"resid.k": fn})``, see :mod:`originlens.models.gpt`): k = 0 right after the
embedding sum, k ≥ 1 after block k's MLP residual add, k = L before the final LayerNorm.  The value is
unchanged because ``h.detach() − h`` is exactly 0 and ``h + 0 == h`` in floating point.

* :func:`stop_gradient_hooks` returns the hook dict for one call (``model(tokens, hooks=...)``).
* :func:`stop_gradient` is a context manager: every forward of ``model`` inside it (including calls
  made by ``model.loss``) gets the rewrite, merged after any hooks the caller passes itself.  It uses
  a forward pre-hook on the module, so no model source is edited and nothing global is changed.

Positions are absolute; a hook receives the positions its tensor covers (``site.positions``), so with a
KV cache or a chunked forward the mask is shifted, and a site outside the chunk is ignored.
Caveat: works with any module following the GPT hook protocol (``hook_names`` = ``resid.0..L`` and a
``hooks=`` forward keyword); other models raise ``ConfigError``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, cast

import torch
import torch.nn as nn

from ..errors import ConfigError
from ..sites import site_name

Site = tuple[int, int]


def normalise_sites(model: nn.Module, sites: Site | Iterable[Site], *, seq_len: int | None = None) -> list[Site]:
    """Validate ``(k, i)`` or a list of them against the model's layers (and ``seq_len`` if given)."""
    names = getattr(model, "hook_names", None)
    if not names:
        raise ConfigError(
            f"{type(model).__name__} exposes no residual hook sites",
            "use originlens.models.GPT (or a model with hook_names and a hooks= keyword)",
        )
    n_sites = len(names)
    if isinstance(sites, tuple) and len(sites) == 2 and all(isinstance(v, int) for v in sites):
        sites = [cast(Site, sites)]
    out: list[Site] = []
    for s in cast("Iterable[Site]", sites):  # a single (k, i) pair was wrapped above
        try:
            k, i = (int(v) for v in s)
        except (TypeError, ValueError):
            raise ConfigError(f"site {s!r} is not a (layer, position) pair", "pass sites as (k, i) tuples") from None
        if not 0 <= k < n_sites:
            raise ConfigError(
                f"site layer k={k} outside 0..{n_sites - 1}", "k counts blocks applied: 0 = embeddings, L = last block"
            )
        if i < 0 or (seq_len is not None and i >= seq_len):
            bound = f"0..{seq_len - 1}" if seq_len is not None else "non-negative positions"
            raise ConfigError(f"site position i={i} outside {bound}", "use a 0-based position inside the sequence")
        out.append((k, i))
    return out


def _sg_hook(positions: Sequence[int]) -> Callable[[torch.Tensor, Any], torch.Tensor | None]:
    wanted = sorted(set(positions))

    def hook(h: torch.Tensor, site: Any) -> torch.Tensor | None:
        span = getattr(site, "positions", slice(0, h.shape[1]))
        start = span.start or 0
        local = [p - start for p in wanted if 0 <= p - start < h.shape[1]]
        if not local:
            return None
        m = torch.zeros(1, h.shape[1], 1, dtype=h.dtype, device=h.device)
        m[:, local] = 1.0
        return h + m * (h.detach() - h)

    return hook


def stop_gradient_hooks(model: nn.Module, sites: Site | Iterable[Site]) -> dict[str, Callable]:
    """Hooks implementing sg at ``sites`` for one call: ``model(tokens, hooks=stop_gradient_hooks(...))``."""
    by_layer: dict[int, list[int]] = {}
    for k, i in normalise_sites(model, sites):
        by_layer.setdefault(k, []).append(i)
    return {site_name(k): _sg_hook(pos) for k, pos in by_layer.items()}


def _merge(user: Any, ours: dict[str, Callable]) -> dict[str, list[Callable]]:
    merged: dict[str, list[Callable]] = {}
    for name, fns in dict(user or {}).items():
        merged[name] = [fns] if callable(fns) else list(fns)
    for name, fn in ours.items():
        merged.setdefault(name, []).append(fn)  # ours last: it rewrites what downstream consumes
    return merged


@contextlib.contextmanager
def stop_gradient(
    model: nn.Module,
    sites: Site | Iterable[Site] | None = None,
    *,
    layer: int | None = None,
    position: int | None = None,
) -> Iterator[nn.Module]:
    """Context manager: forwards of ``model`` block the gradient at r^k_i, values unchanged.

    ``stop_gradient(model, layer=k, position=i)`` or ``stop_gradient(model, [(k, i), ...])``.
    """
    if sites is None:
        if layer is None or position is None:
            raise ConfigError(
                "stop_gradient needs sites=[(k, i), ...] or layer= and position=",
                "e.g. stop_gradient(model, layer=1, position=3)",
            )
        sites = [(layer, position)]
    elif layer is not None or position is not None:
        raise ConfigError(
            "pass either sites or layer/position to stop_gradient, not both", "drop one of the two spellings"
        )
    ours = stop_gradient_hooks(model, sites)

    def pre_hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        kwargs = dict(kwargs)
        kwargs["hooks"] = _merge(kwargs.get("hooks"), ours)
        return args, kwargs

    handle = model.register_forward_pre_hook(pre_hook, with_kwargs=True)
    try:
        yield model
    finally:
        handle.remove()
