"""Corpus pipeline: read text, tokenise, cut windows of T+1 tokens, store them with a manifest.

* :mod:`.readers`: streaming documents from text / JSON / JSONL / Parquet / directories / ``hf:NAME``;
* :mod:`.tokenizers`: the papers' word tokenizer, corpus-trained BPE, pretrained ``tokenizer.json``;
* :mod:`.build` and :mod:`.store`: :func:`build_corpus` writes a corpus directory, :class:`TokenStore`
  opens one;
* :mod:`.windows`: :class:`TokenWindows`, validated windows of a corpus directory or a bare ``.npy``
  (ids, vocabulary, its size and hash, manifest), the one way training windows are read;
* :mod:`.storyworld`: generated stories with planted statistics (the default corpus).
"""

from .build import DEFAULT_STORIES, build_corpus, storyworld_store
from .readers import iter_documents, source_fingerprint
from .store import TokenStore, is_corpus_dir, smallest_uint
from .storyworld import PLANTED, Planted, generate_annotated_stories, generate_stories, storyworld_corpus
from .tokenizers import (
    BPETokenizer,
    PretrainedTokenizer,
    TextTokenizer,
    Tokenizer,
    WordTokenizer,
    load_saved,
    load_tokenizer,
    pre_tokenize,
)
from .windows import TokenWindows, load_token_array

__all__ = [
    "DEFAULT_STORIES",
    "PLANTED",
    "BPETokenizer",
    "Planted",
    "PretrainedTokenizer",
    "TextTokenizer",
    "TokenStore",
    "TokenWindows",
    "Tokenizer",
    "WordTokenizer",
    "build_corpus",
    "generate_annotated_stories",
    "generate_stories",
    "is_corpus_dir",
    "iter_documents",
    "load_saved",
    "load_token_array",
    "load_tokenizer",
    "pre_tokenize",
    "smallest_uint",
    "source_fingerprint",
    "storyworld_corpus",
    "storyworld_store",
]
