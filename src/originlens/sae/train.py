"""Train a small sparse autoencoder on a residual site of any language-model adapter.

:func:`train_sae_on_activations` fits an :class:`~.model.SAE` to an activation matrix ``(n, d)``;
:func:`train_sae` first collects the activations of an :class:`~originlens.lm.adapter.LMAdapter` over a
token array at one residual site; :func:`train_sae_run` does both and writes a run directory::

    RUN/config.json, environment.json, metrics.jsonl   (see originlens.runs)
    RUN/sae/                                           the SAE in SAELens format (cfg.json + safetensors)
    RUN/results.json                                   final held-out metrics
    RUN/report.html, report.md, figures/               training curves

Objectives: ``standard`` = ReLU with ``‖x − x̂‖² + λ Σ_f a_f`` (decoder rows kept at unit norm, so the L1
term equals SAELens' decoder-norm-scaled penalty; λ warms up linearly), ``topk`` = ``‖x − x̂‖²`` with the
k largest latents.  Optimiser Adam.  Decoder-norm constraint: the gradient component along each decoder
row is removed before every step and the rows are renormalised after it.  Inputs are rescaled so that
``E‖x‖² = d_in`` during training (so λ transfers between models); the scale is folded back into the
weights at the end, so the saved SAE reads raw activations with ``normalize_activations = "none"``.
``b_dec`` starts at the mean activation, ``W_enc = W_decᵀ``.

Caveats: no dead-latent resampling and no TopK auxiliary loss (dead latents are reported); the whole
activation matrix is held in memory (fine for the small models this package trains); not resumable.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError, NumericalError
from ..progress import progress
from .model import SAE, SAEConfig


@dataclass
class SAETrainConfig:
    """Hyper-parameters of SAE training."""

    architecture: str = "standard"  # "standard" (ReLU + L1) | "topk"
    d_sae: int | None = None  # default: expansion · d_in
    expansion: int = 4
    l1_coefficient: float = 5.0  # standard only; on inputs scaled to E‖x‖² = d_in
    l1_warmup_frac: float = 0.05
    k: int = 8  # topk only
    lr: float = 1e-3
    steps: int = 2000
    batch_size: int = 256
    seed: int = 0
    normalize_inputs: bool = True
    b_dec_init: str = "mean"  # "mean" | "zeros"
    eval_frac: float = 0.1
    log_every: int = 50
    dtype: str = "float32"

    def validate(self) -> None:
        if self.architecture not in ("standard", "topk"):
            raise ConfigError(f"cannot train architecture {self.architecture!r}", "use standard or topk")
        for name in ("steps", "batch_size", "expansion", "log_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}", f"set {name} ≥ 1")
        if self.d_sae is not None and (not isinstance(self.d_sae, int) or self.d_sae < 1):
            raise ConfigError(f"d_sae must be a positive integer, got {self.d_sae!r}", "e.g. --d-sae 256")
        if not self.lr > 0 or self.l1_coefficient < 0:
            raise ConfigError("lr must be > 0 and l1_coefficient ≥ 0", "fix --lr / --l1")
        if not 0 <= self.eval_frac < 1:
            raise ConfigError(f"eval_frac must be in [0, 1), got {self.eval_frac}", "e.g. 0.1")
        if self.b_dec_init not in ("mean", "zeros"):
            raise ConfigError(f"unknown b_dec_init {self.b_dec_init!r}", "use mean or zeros")


@dataclass
class SAETrainResult:
    """The trained SAE, its training history and held-out metrics."""

    sae: SAE
    history: list[dict[str, float]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


def reconstruction_metrics(sae: SAE, x: Tensor, batch_size: int = 4096) -> dict[str, float]:
    """Held-out metrics of ``sae`` on activations ``x (n, d)``: ``mse`` (mean ‖x − x̂‖²), ``fvu`` (fraction
    of variance unexplained), ``l0`` (mean active latents), ``dead_frac`` (latents never active)."""
    sse, l0, n = 0.0, 0.0, x.shape[0]
    alive = torch.zeros(sae.d_sae, dtype=torch.bool, device=x.device)
    with torch.no_grad():
        mu = x.double().mean(0)
        var = float(((x.double() - mu) ** 2).sum())
        for s in range(0, n, batch_size):
            xb = x[s : s + batch_size].to(sae.dtype)
            a, st = sae.encode_with_state(xb)
            sse += float(((sae.decode(a, st) - xb).double() ** 2).sum())
            active = a > 0
            l0 += float(active.sum())
            alive |= active.any(0)
    return {"mse": sse / n, "fvu": sse / max(var, 1e-30), "l0": l0 / n, "dead_frac": float((~alive).float().mean())}


def init_sae(cfg: SAEConfig, x: Tensor, *, b_dec_init: str = "mean", generator: torch.Generator | None = None) -> SAE:
    """A fresh SAE: random unit decoder rows, ``W_enc = W_decᵀ``, ``b_enc = 0``, ``b_dec`` = mean or 0."""
    sae = SAE(cfg).to(x.device)
    with torch.no_grad():
        w = torch.randn(cfg.d_sae, cfg.d_in, generator=generator, dtype=torch.float64).to(sae.dtype)
        w /= w.norm(dim=-1, keepdim=True)
        sae.W_dec.copy_(w)
        sae.W_enc.copy_(w.T)
        if b_dec_init == "mean":
            sae.b_dec.copy_(x.mean(0).to(sae.dtype))
    return sae


def train_sae_on_activations(
    x: Tensor,
    config: SAETrainConfig,
    *,
    hook_name: str = "blocks.0.hook_resid_post",
    model_name: str | None = None,
    log_fn: Any = None,
    **cfg_fields: Any,
) -> SAETrainResult:
    """Fit an SAE to activations ``x (n, d_in)``; ``cfg_fields`` go to :class:`SAEConfig` (prepend_bos, ...).

    ``log_fn(record)`` is called with every logged training record.
    """
    config.validate()
    if x.dim() != 2 or x.shape[0] < 2:
        raise ConfigError(f"need an (n ≥ 2, d) activation matrix, got {tuple(x.shape)}", "use more tokens")
    gen = torch.Generator().manual_seed(config.seed)
    n, d = x.shape
    dt = getattr(torch, config.dtype)
    x = x.detach().to(dt)
    perm = torch.randperm(n, generator=gen).to(x.device)
    n_eval = int(round(config.eval_frac * n)) if config.eval_frac > 0 else 0
    x_eval, x_train = x[perm[:n_eval]], x[perm[n_eval:]]
    if x_train.shape[0] < 1:
        raise ConfigError("no training activations left after the evaluation split", "use more tokens")
    d_sae = config.d_sae or config.expansion * d
    scale = 1.0
    if config.normalize_inputs:
        ms = float((x_train.double() ** 2).sum(-1).mean())
        if not ms > 0:
            raise NumericalError("the activations are all zero", "check the model and the residual site")
        scale = math.sqrt(d / ms)
    xs = x_train * scale
    cfg = SAEConfig(
        d_in=d,
        d_sae=d_sae,
        architecture=config.architecture,
        k=config.k if config.architecture == "topk" else None,
        hook_name=hook_name,
        model_name=model_name,
        dtype=config.dtype,
        device=str(x.device),
        apply_b_dec_to_input=True,
        **cfg_fields,
    )
    sae = init_sae(cfg, xs, b_dec_init=config.b_dec_init, generator=gen)
    opt = torch.optim.Adam(sae.parameters(), lr=config.lr)
    history: list[dict[str, float]] = []
    order = torch.randperm(xs.shape[0], generator=gen).to(x.device)
    pos = 0
    warm = max(1, int(config.l1_warmup_frac * config.steps))
    alive = torch.zeros(d_sae, dtype=torch.bool, device=x.device)
    t0 = time.perf_counter()
    bar = progress(range(1, config.steps + 1), desc=f"SAE ({config.architecture})", unit="step")
    for step in bar:
        if pos + config.batch_size > order.shape[0]:
            order = torch.randperm(xs.shape[0], generator=gen).to(x.device)
            pos = 0
        xb = xs[order[pos : pos + config.batch_size]]
        pos += config.batch_size
        acts, st = sae.encode_with_state(xb)
        recon = sae.decode(acts, st)
        mse = ((recon - xb) ** 2).sum(-1).mean()
        loss = mse
        l1 = acts.sum(-1).mean()
        lam = 0.0
        if config.architecture == "standard":
            lam = config.l1_coefficient * min(1.0, step / warm)
            loss = mse + lam * l1
        if not torch.isfinite(loss):
            raise NumericalError(f"SAE loss became {float(loss)} at step {step}", "lower --lr or --l1")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            w, g = sae.W_dec, sae.W_dec.grad
            assert g is not None  # W_dec is in every loss, so backward() set its gradient
            g -= (g * w).sum(-1, keepdim=True) * w
        opt.step()
        with torch.no_grad():
            sae.W_dec.div_(sae.W_dec.norm(dim=-1, keepdim=True).clamp_min(1e-12))
        alive |= (acts > 0).any(0)
        if step % config.log_every == 0 or step == config.steps:
            with torch.no_grad():
                var = float(((xb - xb.mean(0)) ** 2).sum(-1).mean())
                rec = {
                    "step": step,
                    "loss": float(loss),
                    "mse": float(mse),
                    "fvu": float(mse) / max(var, 1e-30),
                    "l0": float((acts > 0).float().sum(-1).mean()),
                    "l1": float(l1),
                    "l1_coefficient": lam,
                    "dead_frac_window": float((~alive).float().mean()),
                    "seconds": time.perf_counter() - t0,
                }
            alive.zero_()
            history.append(rec)
            if log_fn is not None:
                log_fn(rec)
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(fvu=f"{rec['fvu']:.3f}", l0=f"{rec['l0']:.1f}")
    sae.requires_grad_(False)
    sae.fold_input_scale(scale)
    sae.fold_decoder_norm()
    metrics = reconstruction_metrics(sae, x_eval if n_eval else x_train)
    metrics.update(
        {
            "input_scale": scale,
            "n_train": int(x_train.shape[0]),
            "n_eval": int(n_eval),
            "seconds": time.perf_counter() - t0,
        }
    )
    return SAETrainResult(sae=sae, history=history, metrics=metrics)


def _hook_name(site: int | str, k: int) -> str:
    """The SAELens hook name of residual site k: ``site`` itself when it is a hook name of that site."""
    from ..sites import hook_name_from_site, site_from_hook_name

    if isinstance(site, str) and site.startswith("blocks."):
        try:
            if site_from_hook_name(site) == k:
                return site
        except ConfigError:
            pass
    return hook_name_from_site(k)


def train_sae(
    adapter: Any,
    tokens: Any,
    site: int | str,
    config: SAETrainConfig,
    *,
    prepend_bos: bool = True,
    max_tokens: int | None = None,
    lm_batch_size: int = 32,
    model_name: str | None = None,
    dataset_path: str | None = None,
    log_fn: Any = None,
) -> SAETrainResult:
    """Collect activations of ``adapter`` at ``site`` over ``tokens`` ``(N, T)`` and train an SAE on them.

    The BOS position is excluded.  ``site``: ``resid.k``, ``blocks.L.hook_resid_{pre,post}`` or an int k; a
    hook name is kept as the SAE's ``hook_name`` (``blocks.1.hook_resid_pre`` stays so, though it is the
    site of ``blocks.0.hook_resid_post``), other spellings get the ``hook_resid_post`` form.
    """
    from .activations import as_sequences, collect_activations

    k = adapter.check_site(site)
    seqs = as_sequences(tokens, adapter, prepend_bos=prepend_bos)
    skip = prepend_bos and adapter.bos_id is not None
    x = collect_activations(adapter, seqs, k, batch_size=lm_batch_size, max_tokens=max_tokens, skip_first=skip)
    return train_sae_on_activations(
        x,
        config,
        hook_name=_hook_name(site, k),
        model_name=model_name,
        log_fn=log_fn,
        prepend_bos=bool(skip),
        context_size=int(seqs.shape[1]),
        dataset_path=dataset_path,
    )


def write_training_report(
    run_path: str | Path, result: SAETrainResult, config: SAETrainConfig, info: dict[str, Any]
) -> Path:
    """``report.html`` of a training run: settings, held-out metrics, training curves."""
    from ..report.html import Report, setup_matplotlib

    plt = setup_matplotlib()
    r = Report("SAE training")
    r.section("Settings")
    r.table(["setting", "value"], [[k, v] for k, v in {**info, **asdict(config)}.items()])
    r.section("Held-out metrics")
    r.table(
        ["metric", "value"],
        [[k, v] for k, v in result.metrics.items()],
        caption="fvu: fraction of variance unexplained; l0: mean number of active latents",
    )
    if result.history:
        h = result.history
        fig, axes = plt.subplots(1, 3, figsize=(10, 3))
        steps = [e["step"] for e in h]
        for ax, key in zip(axes, ("fvu", "l0", "dead_frac_window")):
            ax.plot(steps, [e[key] for e in h])
            ax.set_xlabel("step")
            ax.set_title(key)
        r.figure(
            fig,
            "Training curves: reconstruction error (fvu), active latents (L0) and the fraction of "
            "latents inactive within each logging window.",
        )
    return r.write(run_path)


def train_sae_run(
    adapter: Any,
    tokens: Any,
    site: int | str,
    config: SAETrainConfig,
    out: str | Path,
    *,
    prepend_bos: bool = True,
    max_tokens: int | None = None,
    lm_batch_size: int = 32,
    model_name: str | None = None,
    dataset_path: str | None = None,
    extra_config: dict[str, Any] | None = None,
) -> tuple[SAETrainResult, Path]:
    """:func:`train_sae` writing a run directory (layout in the module docstring); returns (result, RUN/sae)."""
    from ..runs import RunDir
    from ..storage import atomic_write_json
    from .format import write_sae

    config.validate()
    from ..runs import hold_lock

    hold_lock(out)  # one writer per run directory
    run = RunDir(out)
    k = adapter.check_site(site)
    info = {
        "site": f"resid.{k}",
        "model_name": model_name,
        "dataset_path": dataset_path,
        "prepend_bos": prepend_bos,
        "max_tokens": max_tokens,
        **(extra_config or {}),
    }
    run.write_config({"train": asdict(config), **info})
    run.write_environment(seeds={"sae": config.seed})
    result = train_sae(
        adapter,
        tokens,
        site,
        config,
        prepend_bos=prepend_bos,
        max_tokens=max_tokens,
        lm_batch_size=lm_batch_size,
        model_name=model_name,
        dataset_path=dataset_path,
        log_fn=run.log_metrics,
    )
    sae_dir = write_sae(result.sae, run.file("sae"))
    atomic_write_json(
        run.file("results.json"),
        {
            "metrics": result.metrics,
            "site": f"resid.{k}",
            "hook_name": result.sae.cfg.hook_name,
            "d_in": result.sae.d_in,
            "d_sae": result.sae.d_sae,
            "architecture": result.sae.cfg.architecture,
            "sae_dir": str(sae_dir),
        },
    )
    write_training_report(run.path, result, config, info)
    return result, sae_dir
