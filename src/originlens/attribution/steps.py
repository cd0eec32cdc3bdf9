"""Optimizer-aware step attribution: pathway gradients → shares of the parameter step (arXiv 2603.14087).

The update is written ``θ ← θ − Σ_c Δ_c``; Δ_c is component c's share of the descent step.

* SGD (:func:`sgd_steps`): ``Δ_c = lr · G_c``.
* Adam (:class:`AdamAttributor`): one first-moment buffer per (site, component), all starting at 0,
  updated like the optimizer's own (``m_c ← β1 m_c + (1 − β1) G_c``), and the optimizer's **real**
  second moment after the step ``v' = β2 v + (1 − β2) g²``:

      Δ_c = lr · (m_c / (1 − β1^τ)) / (sqrt(v') / sqrt(1 − β2^τ) + ε)        (τ = 1-based step)

  Because the m_c are linear in G_c and Σ_c G_c = ∇L = g, Σ_c m_c = m and Σ_c Δ_c is the real Adam
  update; this is asserted at every step and site (relative tolerance ``tol``, default 1e-6) against
  the update recomputed from the optimizer's own buffers.  AdamW's decoupled decay
  ``lr · weight_decay · θ_before`` is a fourth component ``"decay"`` (identical at every site).

Precision: the per-component moments (and the returned Δ_c) are kept in ``moment_dtype`` (default
float64) and G_sh is re-derived there as ∇L − G_dir − G_pre: components can be much larger than their
sum, so float32 moments would miss the real update by ~1e-6 relative at the first steps (measured
3.5e-6 at τ = 1 on a float32 model); with float64 moments the float32 check holds at ~1e-7.

Requirements (else ``ConfigError``): ``torch.optim.Adam``/``AdamW``, one parameter group holding exactly
the model's trainable parameters, no amsgrad, no maximize, and ``weight_decay == 0`` unless it is
decoupled.  The attributor must see **every** optimizer step from the first one (the moments
accumulate); it refuses an optimizer that already has a step count it did not observe — unless
``carry=True``.
Memory: one parameter-sized buffer per site and component.

Starting mid-training (``carry=True``): an optimizer restored from a checkpoint after τ₀ steps already
holds a first moment m(τ₀) that no decomposition saw.  It becomes a fifth component, ``"carried"``,
identical at every site: ``m_carried ← β1 m_carried`` (no gradient joins it), so after n more steps it
is β1ⁿ·m(τ₀) and

    Δ_direct + Δ_precached + Δ_shared + Δ_carried = the real Adam update

exactly as before, at every step.  The component moments start at 0 at τ₀; after a burn-in of n steps
the carried share of the update is ≈ β1ⁿ (0.9⁵⁰ ≈ 0.5 %), which :attr:`carried_share` reports (its
parameter-norm share of the update at the last step).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn as nn

from ..errors import ConfigError, NumericalError
from .decompose import COMPONENTS, ParamDict, PathwayGradients, trainable_parameters
from .stopgrad import Site

SiteSteps = dict[str, ParamDict]  # component -> parameter name -> Δ_c


def _norm(tensors) -> float:
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in tensors))


def sgd_steps(pathways: Mapping[Site, PathwayGradients], lr: float) -> dict[Site, SiteSteps]:
    """``Δ_c = lr · G_c`` for c in (direct, precached, shared) at every site (plain SGD, no momentum)."""
    lr = float(lr)
    return {
        s: {c: {n: lr * g for n, g in comp.items()} for c, comp in pg.components().items()}
        for s, pg in pathways.items()
    }


def step_sum(steps: SiteSteps) -> ParamDict:
    """Σ_c Δ_c (parameter name → tensor)."""
    comps = list(steps.values())
    out = {n: t.clone() for n, t in comps[0].items()}
    for comp in comps[1:]:
        for n in out:
            out[n] += comp[n]
    return out


def _components_in(pg: PathwayGradients, names: list[str], dtype: Mapping[str, torch.dtype]) -> dict[str, ParamDict]:
    """G_dir, G_pre and G_sh ≡ ∇L − G_dir − G_pre in ``dtype`` (so that Σ_c G_c = ∇L to its rounding)."""
    out: dict[str, ParamDict] = {"direct": {}, "precached": {}, "shared": {}}
    for n in names:
        d = pg.direct[n].detach().to(dtype[n])
        p = pg.precached[n].detach().to(dtype[n])
        out["direct"][n], out["precached"][n] = d, p
        out["shared"][n] = pg.full[n].detach().to(dtype[n]) - d - p
    return out


class AdamAttributor:
    """Per-(site, component) first moments across steps of a real ``torch.optim.Adam``/``AdamW``.

    Use ``steps = attributor.step(decompose(model, tokens, sites))`` in place of ``optimizer.step()``:
    it sets every parameter's ``.grad`` to ∇L of the decomposition, steps the optimizer and returns
    ``{site: {"direct"|"precached"|"shared"[|"decay"]: {name: Δ_c}}}``.  If you step the optimizer
    yourself (with gradient ∇L), call :meth:`attribute` right after instead.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        model: nn.Module,
        *,
        tol: float = 1e-6,
        check: bool = True,
        moment_dtype: torch.dtype | None = torch.float64,
        carry: bool = False,
    ) -> None:
        if not isinstance(optimizer, torch.optim.Adam):
            raise ConfigError(
                f"AdamAttributor needs torch.optim.Adam or AdamW, got {type(optimizer).__name__}",
                "use sgd_steps for plain SGD, or train with Adam/AdamW",
            )
        if len(optimizer.param_groups) != 1:
            raise ConfigError(
                f"optimizer has {len(optimizer.param_groups)} parameter groups",
                "use a single parameter group (one lr/betas/eps for all parameters)",
            )
        group = optimizer.param_groups[0]
        if group.get("amsgrad") or group.get("maximize"):
            raise ConfigError(
                "amsgrad/maximize Adam variants are not attributable", "use amsgrad=False, maximize=False"
            )
        self.decoupled = isinstance(optimizer, torch.optim.AdamW) or bool(group.get("decoupled_weight_decay"))
        if float(group["weight_decay"]) != 0.0 and not self.decoupled:
            raise ConfigError(
                "Adam with (L2) weight_decay changes the gradient and breaks Σ_c G_c = ∇L",
                "use weight_decay=0, or AdamW (decoupled decay becomes a 'decay' component)",
            )
        names, params = trainable_parameters(model)
        by_id = {id(p): n for n, p in zip(names, params)}
        opt_ids = [id(p) for p in group["params"]]
        if sorted(opt_ids) != sorted(by_id) or len(opt_ids) != len(by_id):
            raise ConfigError(
                "the optimizer's parameters are not exactly the model's trainable parameters",
                "build the optimizer from model.parameters()",
            )
        taken = {int(optimizer.state.get(p, {}).get("step", 0)) for p in group["params"]}
        if any(taken) and not carry:
            raise ConfigError(
                "the optimizer has already taken steps; the per-component moments would miss them",
                "create the AdamAttributor before the first optimizer step, or pass carry=True to carry the "
                "optimizer's first moment as its own component",
            )
        if len(taken) > 1:
            raise ConfigError(
                f"the optimizer's parameters have taken different numbers of steps {sorted(taken)}",
                "restore the optimizer from one checkpoint",
            )
        if not (tol > 0):
            raise ConfigError(f"tol={tol!r} must be positive", "e.g. tol=1e-6")
        self.optimizer, self.model = optimizer, model
        self.names, self.params = names, params
        self.tol, self.check = float(tol), bool(check)
        self.moment_dtype = moment_dtype
        self.moments: dict[Site, dict[str, ParamDict]] = {}
        self.sites: list[Site] | None = None
        self.num_steps = max(taken) if taken else 0
        self.first_step = self.num_steps  # τ₀: the steps taken before this attributor saw one
        self.last_check: float = 0.0  # worst relative error of Σ_c Δ_c at the last step
        self.carried_share: float | None = None  # ‖Δ_carried‖ / ‖real update‖ at the last step (carry only)
        self.carried: ParamDict | None = None
        if self.num_steps > 0:  # carry=True: m(τ₀) of the restored optimizer, decaying as its own component
            self.carried = {
                n: optimizer.state[p]["exp_avg"].detach().to(moment_dtype or p.dtype).clone()
                for n, p in zip(names, params)
            }

    # -- stepping -------------------------------------------------------------------------------------
    def step(self, pathways: Mapping[Site, PathwayGradients]) -> dict[Site, SiteSteps]:
        """Set ``.grad = ∇L``, run ``optimizer.step()`` and return the attributed component steps."""
        full = next(iter(pathways.values())).full
        before = {n: p.detach().clone() for n, p in zip(self.names, self.params)} if self.decoupled else None
        for n, p in zip(self.names, self.params):
            p.grad = full[n].detach().clone().to(p.dtype)
        self.optimizer.step()
        return self.attribute(pathways, params_before=before)

    def attribute(
        self, pathways: Mapping[Site, PathwayGradients], *, params_before: Mapping[str, torch.Tensor] | None = None
    ) -> dict[Site, SiteSteps]:
        """Attribute the optimizer step just taken (with gradient ∇L) to the pathway components.

        ``params_before`` (name → θ before the step) is needed for AdamW's decay component.
        """
        sites = list(pathways)
        if not sites:
            raise ConfigError("no sites to attribute", "decompose at least one site")
        if self.sites is None:
            self.sites = sites
        elif set(sites) != set(self.sites):
            raise ConfigError(
                "the sites differ from the previous steps' (moments must accumulate every step)",
                "decompose the same sites at every step",
            )
        group = self.optimizer.param_groups[0]
        lr, eps, wd = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
        beta1, beta2 = (float(b) for b in group["betas"])
        states = [self.optimizer.state.get(p, {}) for p in self.params]
        if any("exp_avg" not in st for st in states):
            raise ConfigError(
                "the optimizer has not stepped (no moments)", "call optimizer.step() first, or use step()"
            )
        taus = {int(st["step"]) for st in states}
        if taus != {self.num_steps + 1}:
            raise ConfigError(
                f"optimizer step count {sorted(taus)} but this attributor saw {self.num_steps} steps",
                "call attribute() exactly once after every optimizer step",
            )
        tau = self.num_steps + 1
        if self.decoupled and wd != 0.0 and params_before is None:
            raise ConfigError(
                "AdamW decay attribution needs the parameters before the step",
                "pass params_before= or use AdamAttributor.step()",
            )
        bc1, bc2 = 1.0 - beta1**tau, 1.0 - beta2**tau
        step_size = lr / bc1
        md = {n: self.moment_dtype or p.dtype for n, p in zip(self.names, self.params)}
        denom = {n: (st["exp_avg_sq"].to(md[n]).sqrt() / bc2**0.5).add_(eps) for n, st in zip(self.names, states)}
        real = {n: step_size * st["exp_avg"].to(md[n]) / denom[n] for n, st in zip(self.names, states)}
        decay = None
        if self.decoupled:
            decay = {
                n: (lr * wd)
                * (params_before[n].to(md[n]) if params_before is not None else torch.zeros_like(p, dtype=md[n]))
                for n, p in zip(self.names, self.params)
            }
            real = {n: real[n] + decay[n] for n in self.names}
        real_norm = _norm(real.values())
        carried = None
        if self.carried is not None:
            for n in self.names:
                self.carried[n].mul_(beta1)  # no gradient joins the carried moment
            carried = {n: step_size * self.carried[n] / denom[n] for n in self.names}
            self.carried_share = _norm(carried.values()) / max(real_norm, 1e-300)
        out: dict[Site, SiteSteps] = {}
        worst = 0.0
        for s in sites:
            comps = _components_in(pathways[s], self.names, md)
            mom = self.moments.setdefault(
                s,
                {c: {n: torch.zeros_like(p, dtype=md[n]) for n, p in zip(self.names, self.params)} for c in COMPONENTS},
            )
            steps: SiteSteps = {}
            for c in COMPONENTS:
                for n in self.names:
                    mom[c][n].lerp_(comps[c][n], 1.0 - beta1)
                steps[c] = {n: step_size * mom[c][n] / denom[n] for n in self.names}
            if carried is not None:
                steps["carried"] = carried
            if decay is not None:
                steps["decay"] = decay
            if self.check:
                total = step_sum(steps)
                err = _norm(total[n] - real[n] for n in self.names) / max(real_norm, 1e-300)
                worst = max(worst, err)
                if err > self.tol:
                    raise NumericalError(
                        f"Σ_c Δ_c differs from the real Adam update at site {s} "
                        f"(relative error {err:.3g} > tol {self.tol:g}, step {tau})",
                        "pass the decomposition of the same batch the optimizer stepped on "
                        "(gradient = ∇L), every step, or raise tol for low precision",
                    )
            out[s] = steps
        self.num_steps = tau
        self.last_check = worst
        return out

    # -- persistence ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Flat tensors ``"k.i.component.param"`` plus ``"_num_steps"`` (storable with ``save_tensors``)."""
        out = {"_num_steps": torch.tensor(self.num_steps), "_first_step": torch.tensor(self.first_step)}
        for n, t in (self.carried or {}).items():
            out[f"_carried.{n}"] = t
        for (k, i), comps in self.moments.items():
            for c, d in comps.items():
                for n, t in d.items():
                    out[f"{k}.{i}.{c}.{n}"] = t
        return out

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Restore moments written by :meth:`state_dict` (the optimizer state must be restored as well)."""
        moments: dict[Site, dict[str, ParamDict]] = {}
        carried: ParamDict = {}
        for key, t in state.items():
            if key in ("_num_steps", "_first_step"):
                continue
            if key.startswith("_carried."):
                carried[key[len("_carried.") :]] = t.clone()
                continue
            k, i, c, n = key.split(".", 3)
            if c not in COMPONENTS or n not in self.names:
                raise ConfigError(
                    f"unexpected AdamAttributor state entry {key!r}",
                    "load a state written by AdamAttributor.state_dict for this model",
                )
            moments.setdefault((int(k), int(i)), {}).setdefault(c, {})[n] = t.clone()
        if carried and set(carried) != set(self.names):
            raise ConfigError(
                "the carried first moment does not cover the model's parameters",
                "load a state written by AdamAttributor.state_dict for this model",
            )
        self.moments = moments
        self.sites = list(moments) or None
        self.num_steps = int(state["_num_steps"])
        self.first_step = int(state["_first_step"]) if "_first_step" in state else 0
        self.carried = carried or None
