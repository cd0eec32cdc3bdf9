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
from .loading import MODEL_FORMATS, ModelFormat, detect_format, load_model

__all__ = [
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
