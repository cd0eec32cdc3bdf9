"""Build a corpus directory (token windows + vocabulary + tokenizer + manifest) from text sources.

:func:`build_corpus` streams the sources twice: pass 1 trains the tokenizer (word counts or BPE merges;
skipped for a pretrained tokenizer), pass 2 encodes every document and cuts windows of T+1 tokens,
which are appended to a raw file on disk; memory stays bounded by one document plus the tokenizer.

Window modes:

* ``"first"`` (paper §5.1.1): one window per document, its first T+1 tokens; documents with fewer
  tokens are skipped (``too_short``).
* ``"split"``: every document is cut into its own consecutive non-overlapping windows (no window spans two
  documents, so each has one source, e.g. one domain of a mixed corpus); each document's incomplete tail
  is discarded, documents shorter than T+1 are skipped.
* ``"pack"``: documents are concatenated, each followed by the tokenizer's end-of-text id (word
  tokenizer: a reserved ``<eot>`` token, which counts towards ``vocab_size``; BPE: ``</s>``, already
  there when texts are wrapped; pretrained: ``<|endoftext|>``/``</s>``/``<eos>`` if it has one, else
  nothing), and cut into non-overlapping windows; the incomplete tail is discarded.

OOV policy: ``"drop"`` (paper) discards every document that contains an out-of-vocabulary token
*anywhere* (the whole document is checked, not only its first window; a document that is both OOV and
too short counts as ``oov``); ``"unk"`` maps such tokens to ``<unk>``. For BPE/pretrained tokenizers
"out of vocabulary" means the model's unknown id was produced.

For ``"first"`` and ``"split"`` the directory also holds ``window_documents.npy``: the index of each window's
source document in reading order (0-based, counting dropped documents), so a window can be traced to its
document's provenance (:attr:`~originlens.data.store.TokenStore.window_documents`).

The output directory is built under a temporary name and renamed into place only on success
(:func:`originlens.outputs.atomic_directory`), so a failed build leaves nothing at ``out``. An existing
``out`` is replaced only if it is an originlens corpus directory (and ``overwrite`` is true).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, InputError, OriginlensError
from ..outputs import atomic_directory, check_output_directory
from ..progress import log, progress
from ..runs import git_commit, package_versions
from ..storage import FORMAT_VERSION, atomic_write_json, sha256_file, vocab_hash
from . import readers, storyworld
from .store import (
    CORPUS_KIND,
    MANIFEST,
    OUTPUT,
    TOKENIZER_DIR,
    TOKENS,
    VOCAB,
    WINDOW_DOCUMENTS,
    TokenStore,
    is_corpus_dir,
    smallest_uint,
)
from .tokenizers import EOT, OOV_MODES, BPETokenizer, Tokenizer, WordTokenizer, count_tokens, load_tokenizer

DEFAULT_STORIES = 2000
WINDOW_MODES = ("first", "pack", "split")
_FLUSH = 4096  # windows per write


def _check_args(vocab_size, seq_len, windows, oov, max_windows, storyworld_stories) -> None:
    if windows not in WINDOW_MODES:
        raise ConfigError(f"unknown window mode {windows!r}", "use 'first', 'pack' or 'split'")
    if oov not in OOV_MODES:
        raise ConfigError(f"unknown OOV policy {oov!r}", "use 'drop' or 'unk'")
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ConfigError(f"seq_len must be a positive integer, got {seq_len!r}", "pass --seq-len >= 1")
    if not isinstance(vocab_size, int) or vocab_size < 2:
        raise ConfigError(f"vocab_size must be an integer >= 2, got {vocab_size!r}", "pass --vocab-size >= 2")
    if max_windows is not None and (not isinstance(max_windows, int) or max_windows < 1):
        raise ConfigError(
            f"max_windows must be a positive integer, got {max_windows!r}", "pass --max-windows >= 1 or leave it out"
        )
    if storyworld_stories is not None and storyworld_stories < 1:
        raise ConfigError(f"the storyworld needs at least 1 story, got {storyworld_stories}", "pass --stories >= 1")


def _check_out(out: Path, overwrite: bool) -> None:
    if not out.exists():
        return
    if out.is_file():
        raise ConfigError(f"--out {out} is an existing file", "choose a directory path for --out")
    if not any(out.iterdir()):
        return
    if is_corpus_dir(out) and not overwrite:  # anything else: check_output_directory says what it holds
        raise ConfigError(f"corpus directory {out} already exists", "pass --overwrite or choose another --out")


class _Windows:
    """Appends (k, T+1) blocks of ids in a fixed dtype to a raw file; writes the .npy at the end."""

    def __init__(self, raw: Path, width: int, dtype: np.dtype) -> None:
        self.raw, self.width, self.dtype = raw, width, dtype.newbyteorder("<")
        self.f = open(raw, "wb")  # noqa: SIM115 (closed by close(), the writer outlives this call)
        self.buf: list[list[int]] = []
        self.n = 0

    def add(self, window: Sequence[int]) -> None:
        self.buf.append(list(window))
        self.n += 1
        if len(self.buf) >= _FLUSH:
            self.flush()

    def flush(self) -> None:
        if self.buf:
            self.f.write(np.asarray(self.buf, dtype=self.dtype).tobytes())
            self.buf = []

    def finish(self, npy: Path) -> None:
        self.flush()
        self.f.close()
        header = {
            "descr": np.lib.format.dtype_to_descr(self.dtype),
            "fortran_order": False,
            "shape": (self.n, self.width),
        }
        with open(npy, "wb") as out, open(self.raw, "rb") as src:
            np.lib.format.write_array_header_1_0(out, header)
            shutil.copyfileobj(src, out, 1 << 20)
        self.raw.unlink()

    def close(self) -> None:
        if not self.f.closed:
            self.f.close()


def _documents(sources, stories, **kw) -> Iterator[str]:
    return iter(stories) if stories is not None else readers.iter_documents(sources, **kw)


def build_corpus(
    sources: Sequence[str | Path] | str | Path | None,
    out: str | Path,
    *,
    tokenizer: str | Path = "words",
    vocab_size: int = 1000,
    seq_len: int = 64,
    windows: str = "first",
    oov: str = "drop",
    max_windows: int | None = None,
    text_field: str | None = None,
    seed: int = 0,
    storyworld_stories: int | None = None,
    split_mode: str = "auto",
    errors: str = "strict",
    wrap: bool = True,
    overwrite: bool = True,
) -> TokenStore:
    """Tokenise ``sources`` (``None``/empty: the storyworld) into ``out`` and return the opened store.

    ``vocab_size`` is |V| including special tokens (``<unk>`` with ``oov="unk"``, ``<eot>`` for words in
    pack mode; the 4 BPE specials); a corpus with fewer distinct tokens gets a smaller vocabulary (the
    manifest records the actual size). ``seed`` only seeds the storyworld. Windows keep source order.
    Returns a :class:`TokenStore` with ``tokens`` of shape (N, seq_len + 1).
    """
    _check_args(vocab_size, seq_len, windows, oov, max_windows, storyworld_stories)
    out = Path(out)
    _check_out(out, overwrite)
    if isinstance(sources, (str, Path)):
        sources = [sources]
    inputs = [s for s in (sources or []) if Path(str(s)).exists()]
    check_output_directory(out, output=OUTPUT, inputs=inputs)
    t0 = time.perf_counter()
    stories = None
    if not sources:
        n_st = storyworld_stories if storyworld_stories is not None else DEFAULT_STORIES
        stories = storyworld.generate_stories(n_st, seed)
        fingerprint = [
            {
                "path": "storyworld",
                "stories": n_st,
                "seed": seed,
                "generator_version": storyworld.GENERATOR_VERSION,
                "bytes": None,
                "sha256": None,
            }
        ]
    else:
        if storyworld_stories is not None:
            raise ConfigError(
                "storyworld_stories only applies when no source is given", "drop --stories or the sources"
            )
        sources = [str(s) if isinstance(s, Path) else s for s in sources]
        fingerprint = readers.source_fingerprint(sources)
    read_kw = {"text_field": text_field, "split_mode": split_mode, "errors": errors}

    # pass 1: train / count
    n_docs_pass1 = None
    specials = [EOT] if windows == "pack" else []
    tok: Tokenizer
    if tokenizer in ("words", "bpe"):
        counted = [0]

        def docs1() -> Iterator[str]:
            for d in progress(
                _documents(sources, stories, **read_kw),
                desc="pass 1/2: training tokenizer",
                unit="doc",
                total=len(stories) if stories is not None else None,
            ):
                counted[0] += 1
                yield d

        if tokenizer == "words":
            tok = WordTokenizer.from_counts(count_tokens(docs1()), vocab_size, oov=oov, specials=specials)
        else:
            tok = BPETokenizer.train(docs1(), vocab_size, wrap=wrap)
        n_docs_pass1 = counted[0]
        if tok.vocab_size < vocab_size:
            log(
                f"note: the corpus has only {tok.vocab_size} distinct tokens; |V| = {tok.vocab_size} "
                f"(asked for {vocab_size})"
            )
    else:
        tok = load_tokenizer(tokenizer)
        if oov == "unk" and tok.unk_id is None:
            log("note: this tokenizer has no unknown-token id; --oov unk has no effect")
    V = tok.vocab_size
    dtype = smallest_uint(V)
    T1 = seq_len + 1

    # pass 2: encode and cut windows
    counts: dict[str, Any] = {
        "documents_read": 0,
        "documents_kept": 0,
        "documents_dropped": {"oov": 0, "too_short": 0},
        "tokens_read": 0,
        "oov_tokens": 0,
        "tokens_in_windows": 0,
        "tokens_discarded_tail": 0,
        "windows": 0,
        "longest_document": 0,
        "longest_in_vocab_document": 0,
        "stopped_at_max_windows": False,
    }
    if windows == "first":
        del counts["tokens_discarded_tail"]
    elif windows == "pack":
        del counts["documents_dropped"]["too_short"]
    drop = counts["documents_dropped"]
    eot = tok.eot_id if windows == "pack" else None
    encode = getattr(tok, "encode_with_oov", None) or (lambda text: (tok.encode(text), 0))

    try:
        with atomic_directory(out, overwrite=True, output=OUTPUT, inputs=inputs) as tmp:
            w = _Windows(tmp / "tokens.raw", T1, dtype)
            try:
                pending: list[int] = []
                window_docs: list[int] = []
                for doc in progress(
                    _documents(sources, stories, **read_kw), desc="pass 2/2: encoding", unit="doc", total=n_docs_pass1
                ):
                    counts["documents_read"] += 1
                    ids, n_oov = encode(doc)
                    counts["tokens_read"] += len(ids)
                    counts["oov_tokens"] += n_oov
                    counts["longest_document"] = max(counts["longest_document"], len(ids))
                    if n_oov and oov == "drop":
                        drop["oov"] += 1
                        continue
                    counts["longest_in_vocab_document"] = max(counts["longest_in_vocab_document"], len(ids))
                    doc_index = counts["documents_read"] - 1
                    if windows in ("first", "split"):
                        if len(ids) < T1:
                            drop["too_short"] += 1
                            continue
                        counts["documents_kept"] += 1
                        stops = [0] if windows == "first" else range(0, len(ids) - T1 + 1, T1)
                        for k in stops:
                            if max_windows and w.n >= max_windows:
                                break
                            w.add(ids[k : k + T1])
                            window_docs.append(doc_index)
                        if windows == "split":
                            counts["tokens_discarded_tail"] += len(ids) % T1
                    else:
                        counts["documents_kept"] += 1
                        pending.extend(ids)
                        if eot is not None and (not ids or ids[-1] != eot):
                            pending.append(eot)
                        k = 0
                        while len(pending) - k >= T1 and not (max_windows and w.n >= max_windows):
                            w.add(pending[k : k + T1])
                            k += T1
                        del pending[:k]
                    if max_windows and w.n >= max_windows:
                        counts["stopped_at_max_windows"] = True
                        break
                if windows == "pack":
                    counts["tokens_discarded_tail"] = len(pending)
                counts["windows"] = w.n
                counts["tokens_in_windows"] = w.n * T1
                if w.n == 0:
                    raise _no_windows(counts, seq_len, windows)
                w.finish(tmp / TOKENS)
                if windows != "pack":
                    np.save(tmp / WINDOW_DOCUMENTS, np.asarray(window_docs, dtype=np.uint32))
            finally:
                w.close()
            tok.save(tmp / TOKENIZER_DIR)
            atomic_write_json(tmp / VOCAB, tok.vocab)
            manifest = {
                "format_version": FORMAT_VERSION,
                "kind": CORPUS_KIND,
                "sources": fingerprint,
                "tokenizer": tok.settings(),
                "vocab_size": V,
                "seq_len": seq_len,
                "windows": windows,
                "oov": oov,
                "max_windows": max_windows,
                "text_field": text_field,
                "split_mode": split_mode,
                "encoding_errors": errors,
                "seed": seed,
                "dtype": str(dtype),
                "shape": [w.n, T1],
                "unk_id": tok.unk_id,
                "eot_id": eot,
                "counts": counts,
                "vocab_hash": vocab_hash(tok.vocab, V),
                "tokens_sha256": sha256_file(tmp / TOKENS),
                "build_seconds": round(time.perf_counter() - t0, 3),
                "environment": {"versions": package_versions(), "git_commit": git_commit()},
            }
            atomic_write_json(tmp / MANIFEST, manifest)
    except OriginlensError:
        raise
    except MemoryError:
        raise OriginlensError(
            "out of memory while building the corpus", "use --max-windows, a smaller --vocab-size, or fewer sources"
        ) from None
    return TokenStore.open(out)


def _no_windows(counts: dict[str, Any], seq_len: int, windows: str) -> InputError:
    n = counts["documents_read"]
    if counts["documents_dropped"].get("oov", 0) == n:
        return InputError(
            f"all {n} documents contain out-of-vocabulary tokens, so no window was kept",
            "pass --oov unk or a larger --vocab-size",
        )
    if windows == "pack":
        kept = counts["tokens_discarded_tail"]
        return InputError(
            f"corpus has only {kept} usable tokens, fewer than one window of T+1 = {seq_len + 1}",
            f"lower --seq-len (at most {max(kept - 1, 1)}) or add text",
        )
    longest = counts["longest_in_vocab_document"]
    n_oov = counts["documents_dropped"].get("oov", 0)
    which = "document" if not n_oov else f"document without out-of-vocabulary tokens ({n_oov} dropped)"
    return InputError(
        f"corpus has no window of length T+1 = {seq_len + 1} (longest {which} has {longest} tokens)",
        f"lower --seq-len (at most {max(longest - 1, 1)}) or use --windows pack" + (" or --oov unk" if n_oov else ""),
    )


def storyworld_store(
    out: str | Path, *, n: int = DEFAULT_STORIES, seed: int = 0, vocab_size: int = 500, seq_len: int = 64, **kw: Any
) -> TokenStore:
    """Build the storyworld corpus (word tokenizer, first windows) into ``out``."""
    return build_corpus(None, out, storyworld_stories=n, seed=seed, vocab_size=vocab_size, seq_len=seq_len, **kw)
