"""Residual-stream site names, the one copy of them: ``resid.k`` ↔ SAELens / TransformerLens hook names.

Site ``resid.k`` (k = 0..L) is the residual stream entering block k+1: ``resid.0`` is the embedding
output, ``resid.L`` the output of the last block (before the final norm).  In hook-name form that is
``blocks.{k}.hook_resid_pre`` for k < L, equivalently ``blocks.{k-1}.hook_resid_post`` for k ≥ 1; SAEs in
SAELens' format name their site this way (``blocks.3.hook_resid_post`` = ``resid.4``).

Every module that names, parses or converts a residual site imports it from here (models, attribution,
the LM adapters, SAEs), so the spelling is defined once.
"""

from __future__ import annotations

import re

from .errors import ConfigError

__all__ = ["hook_name_from_site", "parse_site", "site_from_hook_name", "site_name"]


def site_name(k: int) -> str:
    """``"resid.{k}"``."""
    return f"resid.{k}"


def parse_site(name: str, n_layers: int) -> int:
    """Residual index k of ``"resid.k"`` or a TransformerLens name ``blocks.l.hook_resid_{pre,post}``,
    checked against a model of ``n_layers`` blocks (0 ≤ k ≤ L)."""
    m = re.fullmatch(r"resid\.(\d+)", name)
    k = int(m.group(1)) if m else site_from_hook_name(name)
    if not 0 <= k <= n_layers:
        raise ConfigError(
            f"residual site {name!r} is out of range for a {n_layers}-layer model", f"use resid.0 .. resid.{n_layers}"
        )
    return k


def site_from_hook_name(name: str) -> int:
    """``blocks.{l}.hook_resid_pre`` → l, ``blocks.{l}.hook_resid_post`` → l+1 (SAELens hook names)."""
    m = re.fullmatch(r"blocks\.(\d+)\.hook_resid_(pre|post)", name)
    if not m:
        raise ConfigError(
            f"unknown residual site {name!r}",
            "use resid.K (K = 0..L) or blocks.L.hook_resid_pre / blocks.L.hook_resid_post",
        )
    return int(m.group(1)) + (1 if m.group(2) == "post" else 0)


def hook_name_from_site(k: int) -> str:
    """Inverse of :func:`site_from_hook_name` (``resid.0`` → ``blocks.0.hook_resid_pre``, ``resid.k`` →
    ``blocks.{k-1}.hook_resid_post`` for k ≥ 1: the form SAELens' SAEs on a block's output use)."""
    return "blocks.0.hook_resid_pre" if k == 0 else f"blocks.{k - 1}.hook_resid_post"
