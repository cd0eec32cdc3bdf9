"""Language models under analysis: the adapter protocol, llama2.c checkpoints (model, tokenizer,
generation) and adapters for our own GPT."""
from .adapter import LMAdapter, TokenStates, hook_name_from_site, parse_site, site_from_hook_name
from .llama2c import (
    BOS_ID,
    EOS_ID,
    KVCache,
    Llama2cConfig,
    Llama2cModel,
    Llama2cTokenizer,
    generate,
    generate_tokens,
    load_llama2c,
    read_llama2c_header,
)
from .native import GPTAdapter, Llama2cAdapter
from .export import export_to_hf, gpt_to_hf, llama2c_to_hf
from .hf import HFAdapter, load_hf, load_hf_model
from .loading import (MODEL_FORMATS, ModelFormat, TextCodec, detect_format, load_adapter, load_model,
                      load_tokenizer, open_tokenizer, parse_hub_spec)
from .qscore import FeatureQ, QScoreConfig, QScoreResult, SiteStreams, ablation_kl, find_top_contexts, qscore
from .steering import (LookaheadConfig, LookaheadResult, completion_stats, generate_steered, lookahead, steer,
                       subspace_alignment)
from .checkpoints import (CheckpointGrid, CheckpointSpec, checkpoints_in_dir, log_spaced_steps, parse_spec,
                          pythia_revisions, weights_hash)
from .compare import (CompareConfig, ComparisonResult, checkpoint_cosines, compare_checkpoints, cov_cosine,
                      write_comparison)
from .tl import TLAdapter

__all__ = [
    "HFAdapter", "load_hf", "load_hf_model", "TLAdapter", "gpt_to_hf", "llama2c_to_hf", "export_to_hf",
    "load_adapter", "load_tokenizer", "open_tokenizer", "TextCodec", "parse_hub_spec",
    "qscore", "QScoreConfig", "QScoreResult", "FeatureQ", "find_top_contexts", "ablation_kl", "SiteStreams", "steer",
    "generate_steered", "completion_stats", "lookahead", "LookaheadConfig", "LookaheadResult",
    "subspace_alignment",
    "CheckpointGrid", "CheckpointSpec", "checkpoints_in_dir", "log_spaced_steps", "parse_spec",
    "pythia_revisions", "weights_hash", "CompareConfig", "ComparisonResult", "checkpoint_cosines",
    "compare_checkpoints", "cov_cosine", "write_comparison",
    "LMAdapter",
    "TokenStates",
    "GPTAdapter",
    "Llama2cAdapter",
    "hook_name_from_site",
    "parse_site",
    "site_from_hook_name",
    "MODEL_FORMATS",
    "ModelFormat",
    "detect_format",
    "load_model",
    "BOS_ID",
    "EOS_ID",
    "KVCache",
    "Llama2cConfig",
    "Llama2cModel",
    "Llama2cTokenizer",
    "generate",
    "generate_tokens",
    "load_llama2c",
    "read_llama2c_header",
]
