"""Language models under analysis: the adapter protocol, llama2.c checkpoints (model, tokenizer,
generation) and adapters for our own GPT, Hugging Face models (hand-written families, or any causal LM
through nnsight) and TransformerLens."""

from ..sites import hook_name_from_site, parse_site, site_from_hook_name
from .adapter import LMAdapter, TokenStates
from .checkpoints import (
    CheckpointGrid,
    CheckpointSpec,
    checkpoints_in_dir,
    log_spaced_steps,
    parse_spec,
    pythia_revisions,
    weights_hash,
)
from .codecs import TextCodec
from .compare import (
    CompareConfig,
    ComparisonResult,
    checkpoint_cosines,
    compare_checkpoints,
    cov_cosine,
)
from .compare_report import write_comparison
from .export import export_to_hf, gpt_to_hf, llama2c_to_hf
from .generic import GenericHFAdapter, load_generic
from .gpt2_import import gpt_from_hf
from .hf import HFAdapter, load_hf
from .hf_hub import load_hf_model
from .llama2c import KVCache, Llama2cConfig, Llama2cModel, generate, generate_tokens, load_llama2c, read_llama2c_header
from .llama2c_tokenizer import BOS_ID, EOS_ID, Llama2cTokenizer
from .loading import (
    MODEL_FORMATS,
    ModelFormat,
    detect_format,
    load_adapter,
    load_model,
    load_tokenizer,
    open_tokenizer,
    parse_hub_spec,
)
from .native import GPTAdapter, Llama2cAdapter
from .qscore import qscore
from .qscore_ablation import ablation_kl
from .qscore_config import FeatureQ, QScoreConfig, QScoreResult, SiteStreams
from .qscore_contexts import find_top_contexts
from .steering import (
    LookaheadConfig,
    LookaheadResult,
    completion_stats,
    generate_steered,
    lookahead,
    steer,
    subspace_alignment,
)
from .tl import TLAdapter

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "MODEL_FORMATS",
    "CheckpointGrid",
    "CheckpointSpec",
    "CompareConfig",
    "ComparisonResult",
    "FeatureQ",
    "GPTAdapter",
    "GenericHFAdapter",
    "HFAdapter",
    "KVCache",
    "LMAdapter",
    "Llama2cAdapter",
    "Llama2cConfig",
    "Llama2cModel",
    "Llama2cTokenizer",
    "LookaheadConfig",
    "LookaheadResult",
    "ModelFormat",
    "QScoreConfig",
    "QScoreResult",
    "SiteStreams",
    "TLAdapter",
    "TextCodec",
    "TokenStates",
    "ablation_kl",
    "checkpoint_cosines",
    "checkpoints_in_dir",
    "compare_checkpoints",
    "completion_stats",
    "cov_cosine",
    "detect_format",
    "export_to_hf",
    "find_top_contexts",
    "generate",
    "generate_steered",
    "generate_tokens",
    "gpt_from_hf",
    "gpt_to_hf",
    "hook_name_from_site",
    "llama2c_to_hf",
    "load_adapter",
    "load_generic",
    "load_hf",
    "load_hf_model",
    "load_llama2c",
    "load_model",
    "load_tokenizer",
    "log_spaced_steps",
    "lookahead",
    "open_tokenizer",
    "parse_hub_spec",
    "parse_site",
    "parse_spec",
    "pythia_revisions",
    "qscore",
    "read_llama2c_header",
    "site_from_hook_name",
    "steer",
    "subspace_alignment",
    "weights_hash",
    "write_comparison",
]
