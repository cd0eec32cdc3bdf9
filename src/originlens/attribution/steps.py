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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..errors import ConfigError, NumericalError
from .decompose import COMPONENTS, ParamDict, PathwayGradients, trainable_parameters
from .stopgrad import Site

SiteSteps = dict[str, ParamDict]  # component -> parameter name -> Δ_c
# elements per block of the flat per-site update on a CPU (1 MB of float64: the block's moments, its
# components and its steps stay in a core's cache between the passes); on other devices one block
CPU_BLOCK = 1 << 17


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


@dataclass
class _Update:
    """One update's quantities shared by every site (:meth:`AdamAttributor._update`)."""

    beta1: float
    step_size: float
    denom: torch.Tensor  # √v̂ + ε (P,)
    real: torch.Tensor  # the real update (P,)
    checking: bool
    real_norm: torch.Tensor | None = None
    shared_sum: torch.Tensor | None = None  # Σ of the components identical at every site (P,)
    shared_views: dict[str, ParamDict] = field(default_factory=dict)  # "carried"/"decay" → name → Δ

    def add_shared(self, component: str, flat: torch.Tensor, views: ParamDict) -> None:
        self.shared_sum = flat.clone() if self.shared_sum is None else self.shared_sum.add_(flat)
        self.shared_views[component] = views


class AdamAttributor:
    """Per-(site, component) first moments across steps of a real ``torch.optim.Adam``/``AdamW``.

    Use ``steps = attributor.step(decompose(model, tokens, sites))`` in place of ``optimizer.step()``:
    it sets every parameter's ``.grad`` to ∇L of the decomposition, steps the optimizer and returns
    ``{site: {"direct"|"precached"|"shared"[|"carried"|"decay"]: {name: Δ_c}}}`` (each Δ_c a view of one
    flat buffer per site: do not modify it in place).  If you step the optimizer yourself (with
    gradient ∇L), call :meth:`attribute` right after instead.

    Layout: the moments of a site are one ``(3, P)`` buffer (P = the number of trainable parameters),
    the optimizer's moments are read as one flat vector per update, so an update costs a handful of
    kernels per site whatever the number of parameter tensors.  ``check_every`` = k: the Σ_c Δ_c check
    is computed on the device at every k-th update and read back once for all sites (the only host read
    of an update; 0 = never, like ``check=False``).  ``block``: elements per block of the per-site
    update (default: :data:`CPU_BLOCK` on a CPU, where the passes over a block then stay in cache; the
    whole buffer, one kernel per pass, elsewhere).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        model: nn.Module,
        *,
        tol: float = 1e-6,
        check: bool = True,
        check_every: int = 1,
        moment_dtype: torch.dtype | None = torch.float64,
        carry: bool = False,
        block: int | None = None,
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
        if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 0:
            raise ConfigError(f"check_every={check_every!r} must be an integer ≥ 0", "1 (every update) or e.g. 10")
        dtypes = {p.dtype for p in params}
        if moment_dtype is None and len(dtypes) > 1:
            raise ConfigError(
                f"moment_dtype=None keeps the parameters' dtype, but they have several {sorted(map(str, dtypes))}",
                "pass moment_dtype=torch.float64 (the default)",
            )
        if len({p.device for p in params}) > 1:
            raise ConfigError("the model's parameters are on several devices", "move the model to one device")
        self.optimizer, self.model = optimizer, model
        self.names, self.params = names, params
        self.tol, self.check = float(tol), bool(check) and check_every > 0
        self.check_every = int(check_every) if check else 0
        self.moment_dtype = moment_dtype
        self.dtype = moment_dtype or params[0].dtype
        self.shapes = [tuple(p.shape) for p in params]
        self.sizes = [p.numel() for p in params]
        self.size = sum(self.sizes)
        if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 1):
            raise ConfigError(f"block={block!r} must be a positive integer or None", "e.g. 131072, or None")
        on_cpu = params[0].device.type == "cpu"
        self.block = int(block) if block is not None else (CPU_BLOCK if on_cpu else max(1, self.size))
        self._moments: dict[Site, torch.Tensor] = {}  # site → (3, P): direct, precached, shared
        self.sites: list[Site] | None = None
        self.num_steps = max(taken) if taken else 0
        self.first_step = self.num_steps  # τ₀: the steps taken before this attributor saw one
        self.last_check: float = 0.0  # worst relative error of Σ_c Δ_c at the last checked step
        self._carried_share: torch.Tensor | float | None = None
        self._carried: torch.Tensor | None = None
        if self.num_steps > 0:  # carry=True: m(τ₀) of the restored optimizer, decaying as its own component
            self._carried = self._flat([optimizer.state[p]["exp_avg"] for p in params])

    # -- the flat layout ------------------------------------------------------------------------------
    def _flat(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """One contiguous (P,) vector in the moment dtype (a fresh tensor)."""
        return torch.cat([t.detach().reshape(-1) for t in tensors]).to(self.dtype)

    def _views(self, flat: torch.Tensor) -> ParamDict:
        """name → view of ``flat`` (P,) in the parameter's shape (no copy)."""
        return {n: t.view(s) for n, t, s in zip(self.names, flat.split(self.sizes), self.shapes)}

    @property
    def moments(self) -> dict[Site, dict[str, ParamDict]]:
        """site → component → name → m_c (views of the flat buffers)."""
        return {s: {c: self._views(m[j]) for j, c in enumerate(COMPONENTS)} for s, m in self._moments.items()}

    @property
    def carried(self) -> ParamDict | None:
        """name → the carried first moment β1ⁿ·m(τ₀) (views), or None without ``carry``."""
        return None if self._carried is None else self._views(self._carried)

    @property
    def carried_share(self) -> float | None:
        """‖Δ_carried‖ / ‖real update‖ at the last step (carry only; read from the device on access)."""
        if isinstance(self._carried_share, torch.Tensor):
            self._carried_share = float(self._carried_share)
        return self._carried_share

    def _checking(self, tau: int) -> bool:
        """Whether update τ is one whose Σ_c check is computed and read (every ``check_every``-th)."""
        return self.check_every > 0 and tau % self.check_every == 0

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
        tau = self.num_steps + 1
        upd = self._update(tau, params_before)
        out: dict[Site, SiteSteps] = {}
        errors = []
        full, full_flat = None, None
        for s in sites:
            pg = pathways[s]
            if pg.full is not full:  # ∇L is one dict for every site (decompose): flattened once
                full, full_flat = pg.full, self._flat([pg.full[n] for n in self.names])
            assert full_flat is not None
            steps_flat, err = self._site(s, pg, full_flat, upd)
            if err is not None:
                errors.append(err)
            steps: SiteSteps = {c: self._views(steps_flat[j]) for j, c in enumerate(COMPONENTS)}
            steps.update(upd.shared_views)
            out[s] = steps
        self.num_steps = tau
        if upd.checking:
            self._read_check(sites, errors, upd, tau)
        return out

    def _update(self, tau: int, params_before: Mapping[str, torch.Tensor] | None) -> _Update:
        """What update τ is for every site: Adam's denominator, the real update and the components
        identical at every site (carried, decay), all flat on the device."""
        group = self.optimizer.param_groups[0]
        lr, eps, wd = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
        beta1, beta2 = (float(b) for b in group["betas"])
        states = [self.optimizer.state.get(p, {}) for p in self.params]
        if any("exp_avg" not in st for st in states):
            raise ConfigError(
                "the optimizer has not stepped (no moments)", "call optimizer.step() first, or use step()"
            )
        checking = self._checking(tau)
        # one step count read (a CPU scalar on every device unless Adam is capturable or fused); all of them
        # at the check updates
        taus = {int(st["step"]) for st in (states if checking else states[:1])}
        if taus != {tau}:
            raise ConfigError(
                f"optimizer step count {sorted(taus)} but this attributor saw {self.num_steps} steps",
                "call attribute() exactly once after every optimizer step",
            )
        if self.decoupled and wd != 0.0 and params_before is None:
            raise ConfigError(
                "AdamW decay attribution needs the parameters before the step",
                "pass params_before= or use AdamAttributor.step()",
            )
        bc1, bc2 = 1.0 - beta1**tau, 1.0 - beta2**tau
        step_size = lr / bc1
        denom = self._flat([st["exp_avg_sq"] for st in states]).sqrt_().div_(bc2**0.5).add_(eps)
        real = self._flat([st["exp_avg"] for st in states]).mul_(step_size).div_(denom)
        upd = _Update(beta1=beta1, step_size=step_size, denom=denom, real=real, checking=checking)
        if self.decoupled:
            decay = (
                self._flat([params_before[n] for n in self.names]).mul_(lr * wd)
                if params_before is not None
                else torch.zeros_like(real)
            )
            real.add_(decay)
            upd.add_shared("decay", decay, self._views(decay))
        if checking or self._carried is not None:
            upd.real_norm = real.norm()
        if self._carried is not None:
            self._carried.mul_(beta1)  # no gradient joins the carried moment
            carried = self._carried.mul(step_size).div_(denom)
            upd.add_shared("carried", carried, self._views(carried))
            assert upd.real_norm is not None
            self._carried_share = carried.norm() / upd.real_norm.clamp_min(1e-300)
        upd.shared_views = {c: upd.shared_views[c] for c in ("carried", "decay") if c in upd.shared_views}
        return upd

    def _site(
        self, s: Site, pg: PathwayGradients, full_flat: torch.Tensor, upd: _Update
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Site s's moments advanced by its components, its steps Δ_c (3, P), and (at a check update) the
        norm of Σ_c Δ_c − the real update on the device."""
        g = torch.empty((3, self.size), dtype=self.dtype, device=upd.real.device)
        for j, part in enumerate((pg.direct, pg.precached)):  # cast into place, no copy between
            torch.cat([part[n].detach().reshape(-1) for n in self.names], out=g[j])
        g[2].copy_(full_flat)
        g[2].sub_(g[0]).sub_(g[1])  # G_sh ≡ ∇L − G_dir − G_pre
        mom = self._moments.get(s)
        if mom is None:
            mom = self._moments[s] = torch.zeros_like(g)
        steps_flat = torch.empty_like(g)
        sq = []
        for a in range(0, self.size, self.block):  # blocks that stay in cache on a CPU (one on a GPU)
            b = min(a + self.block, self.size)
            m = mom[:, a:b]
            m.lerp_(g[:, a:b], 1.0 - upd.beta1)
            torch.div(torch.mul(m, upd.step_size, out=steps_flat[:, a:b]), upd.denom[a:b], out=steps_flat[:, a:b])
            if upd.checking:
                total = steps_flat[:, a:b].sum(0)
                if upd.shared_sum is not None:
                    total.add_(upd.shared_sum[a:b])
                sq.append(total.sub_(upd.real[a:b]).pow(2).sum())
        return steps_flat, (torch.stack(sq).sum().sqrt() if upd.checking else None)

    def _read_check(self, sites: list[Site], errors: list[torch.Tensor], upd: _Update, tau: int) -> None:
        """The one host read of a check update: every site's error (and the carried share) at once."""
        assert upd.real_norm is not None
        parts = [*errors, upd.real_norm]
        if isinstance(self._carried_share, torch.Tensor):
            parts.append(self._carried_share)
        values = torch.stack(parts).tolist()
        norm = max(values[len(sites)], 1e-300)
        if self._carried is not None:
            self._carried_share = values[-1]
        rel = [e / norm for e in values[: len(sites)]]
        self.last_check = max(rel)
        for s, err in zip(sites, rel):
            if not err <= self.tol:
                raise NumericalError(
                    f"Σ_c Δ_c differs from the real Adam update at site {s} "
                    f"(relative error {err:.3g} > tol {self.tol:g}, step {tau})",
                    "pass the decomposition of the same batch the optimizer stepped on "
                    "(gradient = ∇L), every step, or raise tol for low precision",
                )

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
                carried[key[len("_carried.") :]] = t
                continue
            k, i, c, n = key.split(".", 3)
            if c not in COMPONENTS or n not in self.names:
                raise ConfigError(
                    f"unexpected AdamAttributor state entry {key!r}",
                    "load a state written by AdamAttributor.state_dict for this model",
                )
            moments.setdefault((int(k), int(i)), {}).setdefault(c, {})[n] = t
        if carried and set(carried) != set(self.names):
            raise ConfigError(
                "the carried first moment does not cover the model's parameters",
                "load a state written by AdamAttributor.state_dict for this model",
            )
        flat: dict[Site, torch.Tensor] = {}
        for s, comps in moments.items():
            if set(comps) != set(COMPONENTS) or any(set(d) != set(self.names) for d in comps.values()):
                raise ConfigError(
                    f"the moments of site {s} do not cover every component and parameter",
                    "load a state written by AdamAttributor.state_dict for this model",
                )
            flat[s] = torch.stack([self._flat([comps[c][n] for n in self.names]) for c in COMPONENTS])
        self._moments = flat
        self.sites = list(flat) or None
        self.num_steps = int(state["_num_steps"])
        self.first_step = int(state["_first_step"]) if "_first_step" in state else 0
        self._carried = self._flat([carried[n] for n in self.names]) if carried else None
