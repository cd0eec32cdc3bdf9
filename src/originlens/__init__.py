"""originlens: where do transformer features come from?

Implements the corpus-statistic leading terms of arXiv 2601.19208 and the gradient pathways of
arXiv 2603.14087.  The public API below is imported lazily (``import originlens`` stays cheap and
does not import torch until a model is used).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = {
    # errors and configuration
    "OriginlensError": "originlens.errors",
    "from_mapping": "originlens.config",
    "load_config": "originlens.config",
    # data
    "build_corpus": "originlens.data",
    "TokenStore": "originlens.data",
    "load_token_array": "originlens.data",
    "TokenWindows": "originlens.data",
    "iter_documents": "originlens.data",
    "WordTokenizer": "originlens.data",
    "generate_stories": "originlens.data",
    "PLANTED": "originlens.data",
    # statistics
    "corpus_statistics": "originlens.stats",
    "CorpusStatistics": "originlens.stats",
    "top_associations": "originlens.stats",
    "save_statistics": "originlens.stats",
    "load_statistics": "originlens.stats",
    # theory (leading terms)
    "predicted_weights": "originlens.theory",
    "compare_to_theory": "originlens.theory",
    "validity_window": "originlens.theory",
    "LeadingTermModel": "originlens.theory",
    "cosine": "originlens.theory",
    # models
    "GPT": "originlens.models",
    "GPTConfig": "originlens.models",
    "position_losses": "originlens.models.gpt",
    "AssocModel": "originlens.models",
    "AssocConfig": "originlens.models",
    "load_assoc": "originlens.models",
    # training
    "train_assoc": "originlens.train",
    "AssocTrainConfig": "originlens.train",
    "NTPConfig": "originlens.train",
    "Trainer": "originlens.train",
    "run_grid": "originlens.train",
    # experiments (config → run directory → results file → report)
    "ToyGridConfig": "originlens.experiments",
    "run_toy_grid": "originlens.experiments",
    "load_results": "originlens.experiments",
    "ModelSource": "originlens.experiments.lm_inputs",
    "CorpusSource": "originlens.experiments.lm_inputs",
    "QScoreRunConfig": "originlens.experiments.qscore_run",
    "run_qscore": "originlens.experiments.qscore_run",
    "merge_qscore_runs": "originlens.experiments.qscore_run",
    "SteerRunConfig": "originlens.experiments.steer_run",
    "run_steer": "originlens.experiments.steer_run",
    "LookaheadRunConfig": "originlens.experiments.lookahead_run",
    "run_lookahead": "originlens.experiments.lookahead_run",
    "CompareRunConfig": "originlens.experiments.compare_run",
    "run_compare": "originlens.experiments.compare_run",
    "SAERunConfig": "originlens.experiments.sae_run",
    "run_sae_train": "originlens.experiments.sae_run",
    # tasks
    "get_task": "originlens.tasks",
    "generate_games": "originlens.tasks",
    "replay": "originlens.tasks",
    # probes
    "fit_probes": "originlens.probes",
    "ProbeSet": "originlens.probes",
    # attribution (gradient pathways)
    "stop_gradient": "originlens.attribution",
    "decompose": "originlens.attribution",
    "PathwayGradients": "originlens.attribution",
    "AdamAttributor": "originlens.attribution",
    "influence_table": "originlens.attribution",
    "influences": "originlens.attribution",
    "Probe": "originlens.attribution",
    "reference_projections": "originlens.attribution",
    "sgd_steps": "originlens.attribution",
    "attribute_run": "originlens.attribution",
    "attribute_segments": "originlens.attribution",
    # pretrained LMs
    "load_llama2c": "originlens.lm",
    "Llama2cTokenizer": "originlens.lm",
    "generate": "originlens.lm",
    "LMAdapter": "originlens.lm",
    "load_adapter": "originlens.lm",
    "load_tokenizer": "originlens.lm",
    "export_to_hf": "originlens.lm",
    "gpt_from_hf": "originlens.lm",
    "qscore": "originlens.lm",
    "cov_cosine": "originlens.lm",
    "CheckpointGrid": "originlens.lm",
    "compare_checkpoints": "originlens.lm",
    "steer": "originlens.lm",
    "lookahead": "originlens.lm",
    # sparse autoencoders
    "SAE": "originlens.sae",
    "read_sae": "originlens.sae",
    "write_sae": "originlens.sae",
    "train_sae": "originlens.sae",
    # reports
    "Report": "originlens.report",
    "combine_reports": "originlens.report",
    # multi-process
    "distributed_corpus_statistics": "originlens.distributed",
}

__all__ = sorted(_API) + ["__version__"]


def __getattr__(name: str) -> Any:
    mod = _API.get(name)
    if mod is None:
        raise AttributeError(f"module 'originlens' has no attribute '{name}'")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
