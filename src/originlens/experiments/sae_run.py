"""An SAE training run on a language model's residual stream (``originlens sae train``): the model and
corpus resolved as for the Q(w) runs (:mod:`.lm_inputs`), then :func:`originlens.sae.train.train_sae_run`,
which writes ``OUT/sae/`` (SAELens format), ``results.json``, ``metrics.jsonl`` and ``report.html``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .lm_inputs import CorpusSource, ModelSource, load_corpus, load_model_and_codec, open_lm_run


@dataclass
class SAERunConfig:
    """Model, corpus, the residual site (``resid.K`` or a SAELens hook name) and the SAE's training
    settings (:class:`originlens.sae.train.SAETrainConfig`; default: its defaults)."""

    model: ModelSource
    corpus: CorpusSource
    site: str
    train: Any = field(default=None)  # SAETrainConfig
    max_tokens: int | None = 200_000
    model_name: str | None = None  # cfg.json's model_name (default: the model path)


@dataclass
class SAERun:
    path: Path
    sae_dir: Path
    result: Any  # originlens.sae.train.SAETrainResult


def run_sae_train(cfg: SAERunConfig, out: str | Path, *, overwrite: bool = False) -> SAERun:
    """Collect activations at the site, train the SAE, write the run directory."""
    from ..distributed import single_process

    single_process("sae train")
    from ..sae.train import SAETrainConfig, train_sae_run

    run = open_lm_run(out, overwrite)
    adapter, codec = load_model_and_codec(cfg.model)
    adapter.check_site(cfg.site)  # before the corpus is read
    tokens, desc = load_corpus(cfg.corpus, adapter, codec)
    result, sae_dir = train_sae_run(
        adapter,
        tokens,
        cfg.site,  # a hook name is kept as the SAE's hook_name
        cfg.train if cfg.train is not None else SAETrainConfig(),
        run.path,
        prepend_bos=cfg.corpus.prepend_bos,
        max_tokens=cfg.max_tokens,
        model_name=cfg.model_name or str(cfg.model.model),
        dataset_path=cfg.corpus.corpus,
        extra_config={"corpus": desc, "model": cfg.model.model},
    )
    return SAERun(path=run.path, sae_dir=Path(sae_dir), result=result)
