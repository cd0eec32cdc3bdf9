"""Pretrained language models: llama2.c checkpoints (model, tokenizer, generation)."""
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
from .loading import MODEL_FORMATS, ModelFormat, detect_format, load_model

__all__ = [
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
