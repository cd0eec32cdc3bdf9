"""A steering run (arXiv 2603.14087 §9): text sampled while c·W_dec[f] is added to the residual stream at
the SAE's site, for each feature and coefficient, beside an unsteered baseline with the same seed
(``originlens lm steer``; :func:`originlens.lm.steering.steer` does the sampling).

``run_steer(SteerRunConfig(ModelSource(M), SAE_DIR, features=[3, 17]), OUT)`` writes ``OUT/config.json``,
``environment.json``, ``metrics.jsonl`` (one record per condition: punctuation, digit and distinct-token
fractions), ``results.json`` (every sample, its ids and statistics) and ``report.html``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, InputError
from .lm_inputs import ModelSource, load_model_and_codec, load_sae_at, open_lm_run, select_features


@dataclass
class SteerRunConfig:
    """Features to steer with (at least one), coefficients c, and the sampling settings."""

    model: ModelSource
    sae: str
    features: list[int] | None
    coefficients: list[float] = field(default_factory=lambda: [1.0, 100.0])
    samples: int = 64
    max_new_tokens: int = 20
    temperature: float = 1.0
    prompt: str = ""  # text after BOS ("" : BOS only)
    seed: int = 42
    show: int = 5  # samples per condition shown in the report

    def __post_init__(self) -> None:
        if self.features is None:
            raise ConfigError("--features all is not allowed for steering", "pick a few features, e.g. --features 3,17")


@dataclass
class SteerRun:
    path: Path
    samples: list[Any]  # originlens.lm.steering.SteeredSamples, the baseline first
    report: Path


def run_steer(cfg: SteerRunConfig, out: str | Path, *, overwrite: bool = False) -> SteerRun:
    """Sample every condition, write the run directory, return the samples (see the module docstring)."""
    from ..distributed import single_process

    single_process("lm steer")
    from ..lm.steering import steer
    from ..storage import atomic_write_json

    run = open_lm_run(out, overwrite)
    adapter, codec = load_model_and_codec(cfg.model)
    sae, k = load_sae_at(cfg.sae, adapter, cfg.model.device)
    feats = select_features(cfg.features, sae)
    prompt_ids = None
    if cfg.prompt:
        if codec is None:
            raise InputError("a text prompt needs the model's tokenizer", "pass --tokenizer")
        prompt_ids = ([adapter.bos_id] if adapter.bos_id is not None else []) + codec.encode(cfg.prompt)
    info = {
        "model": cfg.model.model,
        "sae": str(cfg.sae),
        "hook_name": sae.cfg.hook_name,
        "site": f"resid.{k}",
        "features": feats,
        "coefficients": cfg.coefficients,
        "samples": cfg.samples,
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "seed": cfg.seed,
        "prompt": cfg.prompt,
        "coefficient_applied": "once per forward, at all positions",
    }
    run.write_config(info)
    run.write_environment(seeds={"sampling": cfg.seed})
    res = steer(
        adapter,
        sae,
        feats,
        cfg.coefficients,
        prompt_ids=prompt_ids,
        tokenizer=codec,
        n_samples=cfg.samples,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        seed=cfg.seed,
    )
    for s in res:
        run.log_metrics(
            {
                "feature": s.feature,
                "coefficient": s.coefficient,
                **{kk: v for kk, v in s.stats.items() if kk != "promoted"},
            }
        )
    atomic_write_json(run.file("results.json"), {"info": info, "samples": [s.__dict__ for s in res]})
    html = _report(run, cfg, info, res)
    return SteerRun(path=run.path, samples=list(res), report=Path(html))


def _report(run: Any, cfg: SteerRunConfig, info: dict[str, Any], res: list[Any]) -> Any:
    from ..report.html import Report, setup_matplotlib

    plt = setup_matplotlib()
    rep = Report("Steering with SAE decoder directions")
    rep.section("Settings")
    rep.table(["setting", "value"], [[kk, v] for kk, v in info.items()])
    rep.section("Completion statistics")
    rows = []
    for s in res:
        promoted = ", ".join(
            repr(p["text"] if p["text"] is not None else p["id"]) for p in s.stats.get("promoted", [])[:5]
        )
        rows.append(
            [
                "baseline" if s.feature < 0 else s.feature,
                s.coefficient,
                s.stats.get("punct_frac", math.nan),
                s.stats.get("digit_frac", math.nan),
                s.stats["distinct_frac"],
                promoted,
            ]
        )
    rep.table(
        ["feature", "c", "punctuation", "digits", "distinct", "most promoted vs baseline"],
        rows,
        caption="fractions of generated tokens; promoted = largest count ratio against the unsteered samples",
    )
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(res)), 3))
    labels = ["base" if s.feature < 0 else f"#{s.feature}\nc={s.coefficient:g}" for s in res]
    xs = np.arange(len(res))
    ax.bar(xs - 0.2, [s.stats.get("punct_frac", 0) for s in res], 0.4, label="punctuation")
    ax.bar(xs + 0.2, [s.stats["distinct_frac"] for s in res], 0.4, label="distinct")
    ax.set_xticks(xs, labels, fontsize=7)
    ax.legend(fontsize=7)
    rep.figure(
        fig,
        "Steering samples: fraction of punctuation-only tokens and of distinct tokens per condition.",
        name="steering-stats.png",
    )
    rep.section("Samples")
    for s in res:
        if s.texts:
            title = "baseline (c = 0)" if s.feature < 0 else f"feature {s.feature}, c = {s.coefficient:g}"
            rep.code(title + "\n" + "\n".join(f"- {t!r}" for t in s.texts[: cfg.show]))
    return rep.write(run.path)
