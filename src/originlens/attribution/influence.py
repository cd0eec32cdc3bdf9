"""Influence of pathway step components on a probed feature (arXiv 2603.14087, influence).

Mismatch of probe p = (w, site (k, i)) on the current batch, against the final parameters θ*:

    R(θ) = f · mean_b ( ⟨w, r^k_{b,i}(θ)⟩ − ⟨w, r^k_{b,i}(θ*)⟩ )²      f = 1 (default; the paper's and the authors' code) or ½ (``half=True``)
    I_c  = ⟨Δ_c, ∇R(θ)⟩                                                 influence of component c

Sign: the update is θ ← θ − Σ_c Δ_c, so to first order R drops by I_c; **positive influence moves the
feature toward its final value**.  f = 1 is the reference code's convention (values 2× those of
``half=True``).

Fast path: ``∇R = J_{k,i}ᵀ u`` with ``u_b = f·(2/n)(⟨w, r_b⟩ − ⟨w, r*_b⟩) w``, hence
``I_c = ⟨u, J_{k,i} Δ_c⟩``: one forward-mode JVP of θ ↦ r^k_i(θ) along each Δ_c (:mod:`.jvp`) serves
every probe and every feature-type subset at that site.  :func:`influence_table` does the rest on the
device: per site one product of the JVPs (C, B, d) with all probe directions (P, d), the subsets as masks
(P, S, B), and one transfer of every site's sums, counts and risks per call; the result is one columnar
:class:`InfluenceTable` (:func:`influences` gives its rows as :class:`Influence` objects).  Measured
(``benchmarks/RESULTS.md``): the hand-written JVPs take ≈ 0.6× the time of ``torch.func``'s on an
Othello-sized model; both beat one ∇R backward per risk from about 2 risks per site.

Always through the **non-myopic** graph (∇R is the true derivative of the representation, also for
myopically trained models), with eager attention (SDPA has no forward-mode AD; values differ by rounding).
Type-restricted risks use the rows whose feature type equals τ; an empty subset is reported as missing
(``value=None``), never NaN.  The ``"full"`` component is Σ_c I_c.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
import torch
import torch.nn as nn

from ..errors import ConfigError, InputError
from .decompose import ParamDict
from .jvp import grouped_jvps, manual_supported, site_jvp
from .stopgrad import Site, normalise_sites


@dataclass(eq=False)
class Probe:
    """A linear probe direction ``w`` (d,) at residual site (layer k, position i)."""

    name: str
    layer: int
    position: int
    direction: torch.Tensor

    @property
    def site(self) -> Site:
        return (int(self.layer), int(self.position))


@dataclass
class Influence:
    """One influence value.  ``feature_type`` None = all rows; ``value``/``risk`` None = empty subset."""

    probe: str
    layer: int
    position: int
    feature_type: int | None
    component: str
    value: float | None  # I_c = ⟨Δ_c, ∇R⟩ (positive: moves the feature toward its final value)
    risk: float | None  # R(θ) on the subset
    n_rows: int
    factor: float  # f: 1.0 (paper, default) or 0.5 (half=True)


def _check_probes(model: nn.Module, tokens: torch.Tensor, probes: Sequence[Probe]) -> None:
    if len({p.name for p in probes}) != len(probes):
        raise ConfigError("probe names are not unique", "give every probe its own name")
    d = cast(Any, model).config.d_model if hasattr(model, "config") else None
    for p in probes:
        normalise_sites(model, [p.site], seq_len=tokens.shape[1])
        if p.direction.dim() != 1 or (d is not None and p.direction.shape[0] != d):
            raise InputError(
                f"probe {p.name!r} direction has shape {tuple(p.direction.shape)}, expected ({d},)",
                "pass the probe's coefficient row (intercept dropped)",
            )


def projections(model: nn.Module, tokens: torch.Tensor, probes: Sequence[Probe]) -> dict[str, torch.Tensor]:
    """``⟨w_p, r^k_{b,i}⟩`` (B,) per probe from one no-grad, non-myopic forward."""
    _check_probes(model, tokens, probes)
    with torch.no_grad():
        _, res = model(tokens, return_residuals=True, myopic=False)
    by_site: dict[Site, list[Probe]] = {}
    for p in probes:
        by_site.setdefault(p.site, []).append(p)
    out: dict[str, torch.Tensor] = {}
    for (k, i), site_probes in by_site.items():  # one product per site, whatever its number of probes
        W = torch.stack([p.direction for p in site_probes]).to(res[0])
        out.update(zip((p.name for p in site_probes), (res[k][:, i] @ W.t()).t()))
    return {p.name: out[p.name] for p in probes}


def reference_projections(
    final_model: nn.Module, tokens: torch.Tensor, probes: Sequence[Probe]
) -> dict[str, torch.Tensor]:
    """``⟨w_p, r^k_{b,i}(θ*)⟩`` (B,) per probe: no-grad forward of the final model on this batch."""
    return projections(final_model, tokens, probes)


def mismatch(
    model: nn.Module,
    tokens: torch.Tensor,
    probe: Probe,
    reference: torch.Tensor,
    *,
    half: bool = False,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """R(θ) as a differentiable scalar (non-myopic graph); ``rows`` (B,) bool restricts the mean."""
    _, res = model(tokens, return_residuals=True, myopic=False)
    diff = res[probe.layer][:, probe.position] @ probe.direction.to(res[0].dtype) - reference
    if rows is not None:
        diff = diff[rows]
        if diff.numel() == 0:
            raise InputError("the row subset is empty: R is undefined", "skip empty feature-type subsets")
    return (0.5 if half else 1.0) * diff.pow(2).mean()


# ----------------------------------------------------------------------------------------------------
# influences


@dataclass(frozen=True)
class InfluenceTable:
    """Influences of one batch as columns (one row per probe × row subset × component, ``"full"`` last).

    ``probe`` (names), ``component`` (names): lists; ``layer``, ``position``, ``n_rows``: int arrays;
    ``feature_type``: int array, −1 = all rows; ``value``, ``risk``: float64 arrays, NaN where the subset
    is empty.  :meth:`influences` gives the same rows as :class:`Influence` objects."""

    probe: list[str]
    layer: np.ndarray
    position: np.ndarray
    feature_type: np.ndarray
    component: list[str]
    value: np.ndarray
    risk: np.ndarray
    n_rows: np.ndarray
    factor: float

    def __len__(self) -> int:
        return len(self.probe)

    def influences(self) -> list[Influence]:
        """The rows as :class:`Influence` objects (``feature_type`` None = all rows, None for NaN)."""
        out = []
        for j in range(len(self)):
            v, r, tau = float(self.value[j]), float(self.risk[j]), int(self.feature_type[j])
            out.append(
                Influence(
                    probe=self.probe[j],
                    layer=int(self.layer[j]),
                    position=int(self.position[j]),
                    feature_type=None if tau < 0 else tau,
                    component=self.component[j],
                    value=None if math.isnan(v) else v,
                    risk=None if math.isnan(r) else r,
                    n_rows=int(self.n_rows[j]),
                    factor=self.factor,
                )
            )
        return out


def influences(
    model: nn.Module,
    tokens: torch.Tensor,
    steps: Mapping[Site, Mapping[str, ParamDict]],
    probes: Sequence[Probe],
    references: Mapping[str, torch.Tensor],
    *,
    types: Mapping[str, torch.Tensor] | None = None,
    type_values: Sequence[int] | None = None,
    half: bool = False,
    jvp: Literal["auto", "manual", "forward", "double_backward"] = "auto",
) -> list[Influence]:
    """Influences ``I_c = ⟨Δ_c, ∇R_p⟩`` of every step component at every probe (and type subset), as
    :class:`Influence` objects: :func:`influence_table` (same arguments) row by row."""
    table = influence_table(
        model, tokens, steps, probes, references, types=types, type_values=type_values, half=half, jvp=jvp
    )
    return table.influences()


def influence_table(
    model: nn.Module,
    tokens: torch.Tensor,
    steps: Mapping[Site, Mapping[str, ParamDict]],
    probes: Sequence[Probe],
    references: Mapping[str, torch.Tensor],
    *,
    types: Mapping[str, torch.Tensor] | None = None,
    type_values: Sequence[int] | None = None,
    drop_absent: bool | None = None,
    half: bool = False,
    jvp: Literal["auto", "manual", "forward", "double_backward"] = "auto",
) -> InfluenceTable:
    """Influences ``I_c = ⟨Δ_c, ∇R_p⟩`` of every step component at every probe (and type subset).

    tokens (B, T); ``steps[(k, i)][c][name]`` = Δ_c (from :func:`sgd_steps` / ``AdamAttributor``) for
    each probe's site; ``references[probe.name]`` (B,) = ⟨w, r(θ*)⟩ on this batch
    (:func:`reference_projections`); ``types[probe.name]`` (B,) integer feature types at the probe's
    (position, feature); ``type_values`` = types to report (default: those present, found by one host
    read); a type absent from a probe's rows is reported missing (``drop_absent=False``, the default with
    ``type_values``) or left out (``drop_absent=True``, the default without: give ``type_values`` a
    superset known on the host and ``drop_absent=True`` to skip that read).  Rows per probe: all rows,
    then each type; per subset the components in ``steps``' order, then ``"full"`` (= Σ_c I_c).

    Batched on the device: per site, the JVPs of its components (C, B, d) meet all its probes' directions
    (P, d) in one product, the feature-type subsets are masks (P, S, B), and the sums, counts and risks of
    every site leave the device in one transfer per call."""
    _check_probes(model, tokens, probes)
    by_site = _probes_by_site(probes, steps, references, types, tokens.shape[0])
    typed = {p.name for p in probes if types is not None and p.name in types}  # probes with feature types
    with torch.no_grad():
        _, res = model(tokens, return_residuals=True, myopic=False)
    dev = res[0].device
    values_of: list[int] = []
    if typed:
        assert types is not None
        all_types = torch.stack([types[p.name].reshape(-1) for p in probes if p.name in typed]).to(dev)
        values_of = (
            [int(v) for v in type_values]
            if type_values is not None
            else [int(v) for v in torch.unique(all_types).tolist()]  # the one host read before the products
        )
    if jvp in ("auto", "manual") and manual_supported(model):  # one primal per position, tangents stacked
        jvps = grouped_jvps(model, tokens, {s: [steps[s][c] for c in steps[s]] for s in by_site})
    else:
        jvps = {s: site_jvp(model, tokens, s, [steps[s][c] for c in steps[s]], jvp=jvp) for s in by_site}
    type_vec = torch.tensor(values_of, dtype=torch.long, device=dev)
    blocks = [
        _site_sums(jvps[site], res[site[0]][:, site[1]], site_probes, references, types, typed, type_vec)
        for site, site_probes in by_site.items()
    ]
    host = torch.cat(blocks).cpu().numpy()  # the one transfer of the results
    keep_absent = type_values is not None if drop_absent is None else not drop_absent
    return _table(by_site, steps, host, values_of, typed, keep_absent, 0.5 if half else 1.0)


def _probes_by_site(
    probes: Sequence[Probe],
    steps: Mapping[Site, Mapping[str, ParamDict]],
    references: Mapping[str, torch.Tensor],
    types: Mapping[str, torch.Tensor] | None,
    B: int,
) -> dict[Site, list[Probe]]:
    """The probes grouped by site, each checked: its site has steps, its reference and types are (B,)."""
    by_site: dict[Site, list[Probe]] = {}
    for p in probes:
        if p.site not in steps:
            raise ConfigError(
                f"no component steps for probe {p.name!r} at site {p.site}", "decompose and attribute that site"
            )
        ref = references.get(p.name)
        if ref is None or ref.shape != (B,):
            raise InputError(
                f"reference projections for probe {p.name!r} missing or not of shape ({B},)",
                "compute them with reference_projections(final_model, tokens, probes)",
            )
        if types is not None and p.name in types and types[p.name].reshape(-1).shape != (B,):
            raise InputError(
                f"types for probe {p.name!r} have shape {tuple(types[p.name].shape)}, expected ({B},)",
                "pass one feature type per batch row",
            )
        by_site.setdefault(p.site, []).append(p)
    return by_site


def _site_sums(
    jv: torch.Tensor,
    resid: torch.Tensor,
    site_probes: list[Probe],
    references: Mapping[str, torch.Tensor],
    types: Mapping[str, torch.Tensor] | None,
    typed: set[str],
    type_vec: torch.Tensor,
) -> torch.Tensor:
    """One site on the device: its JVPs (C, B, d) against all its probes' directions in one product, the
    type subsets as masks (P, S, B); returns sums (P, S, C), counts (P, S) and squared distances (P, S),
    flattened into one float64 vector."""
    dev, B = resid.device, resid.shape[0]
    W = torch.stack([p.direction for p in site_probes]).to(dev)  # (P, d)
    current = resid @ W.to(resid.dtype).t()  # (B, P)
    ref = torch.stack([references[p.name] for p in site_probes], 1).to(dev, jv.dtype)  # (B, P)
    diff = current - ref
    moved = jv @ W.to(jv.dtype).t()  # (C, B, P)
    masks = torch.ones(len(site_probes), 1 + len(type_vec), B, dtype=diff.dtype, device=dev)
    rows = [j for j, p in enumerate(site_probes) if p.name in typed]
    masks[[j for j in range(len(site_probes)) if j not in rows], 1:] = 0
    if rows and len(type_vec):
        assert types is not None
        ty = torch.stack([types[site_probes[j].name].reshape(-1) for j in rows]).to(dev)  # (P_typed, B)
        masks[rows, 1:] = (ty[:, None, :] == type_vec[None, :, None]).to(diff.dtype)
    sums = torch.einsum("psb,cbp->psc", masks, moved * diff)  # Σ_rows d·(J Δ_c)·w
    counts = masks.sum(-1)  # (P, S)
    sq = torch.einsum("psb,bp->ps", masks, diff.pow(2))
    return torch.cat([sums.reshape(-1), counts.reshape(-1), sq.reshape(-1)]).double()


def _table(
    by_site: Mapping[Site, list[Probe]],
    steps: Mapping[Site, Mapping[str, ParamDict]],
    host: np.ndarray,
    values_of: list[int],
    typed: set[str],
    explicit: bool,
    f: float,
) -> InfluenceTable:
    """The columns from the device's flat result (per site: sums (P, S, C), counts (P, S), sq (P, S))."""
    cols: dict[str, list] = {k: [] for k in ("probe", "layer", "position", "type", "component", "value", "risk", "n")}
    at = 0
    subsets = [-1, *values_of]
    for site, site_probes in by_site.items():
        comps = list(steps[site])
        P, S, C = len(site_probes), len(subsets), len(comps)
        sums = host[at : at + P * S * C].reshape(P, S, C)
        counts = host[at + P * S * C : at + P * S * (C + 1)].reshape(P, S)
        sq = host[at + P * S * (C + 1) : at + P * S * (C + 2)].reshape(P, S)
        at += P * S * (C + 2)
        for j, p in enumerate(site_probes):
            for si, tau in enumerate(subsets):
                n = int(round(counts[j, si]))
                if si > 0 and (p.name not in typed or (n == 0 and not explicit)):
                    continue  # a type absent from this probe's rows is not reported unless asked for
                if n == 0:
                    vals, risk = [math.nan] * C, math.nan
                else:
                    vals = [f * 2.0 / n * float(v) for v in sums[j, si]]
                    risk = f * float(sq[j, si]) / n
                total = 0.0
                for v in vals:
                    total += v
                for c, v in [*zip(comps, vals), ("full", total)]:
                    cols["probe"].append(p.name)
                    cols["layer"].append(p.layer)
                    cols["position"].append(p.position)
                    cols["type"].append(tau)
                    cols["component"].append(c)
                    cols["value"].append(v)
                    cols["risk"].append(risk)
                    cols["n"].append(n)
    return InfluenceTable(
        probe=cols["probe"],
        layer=np.asarray(cols["layer"], dtype=np.int64),
        position=np.asarray(cols["position"], dtype=np.int64),
        feature_type=np.asarray(cols["type"], dtype=np.int64),
        component=cols["component"],
        value=np.asarray(cols["value"], dtype=np.float64),
        risk=np.asarray(cols["risk"], dtype=np.float64),
        n_rows=np.asarray(cols["n"], dtype=np.int64),
        factor=f,
    )
