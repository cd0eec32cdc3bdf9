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

__all__ = [
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
