"""The inputs of an SAE-feature run on a language model, resolved once for ``lm qscore``, ``lm steer``,
``lm lookahead`` and ``sae train``: the model and its tokenizer, the token windows, the SAE, the features.

* :class:`ModelSource` → :func:`load_model_and_codec`: an :class:`~originlens.lm.adapter.LMAdapter` (any
  checkpoint :func:`originlens.lm.loading.load_adapter` reads) on the requested device (or placed by a
  Hugging Face ``device_map``), and its tokenizer
  codec (``None`` when none is found next to the model and none was named: texts are then shown as ids);
* :class:`CorpusSource` → :func:`load_corpus`: token windows ``(N, T)`` without BOS (the runs prepend it)
  from an originlens corpus directory (its vocabulary must be the model's, proven by the tokenizer's
  vocabulary hash where there is one), an ``.npy`` of windows, or raw text (files, directories,
  ``hf:DATASET``) tokenised with the model's tokenizer and cut into ``window``-token windows;
* :func:`open_lm_run`: the locked run directory (``overwrite`` starts ``metrics.jsonl`` afresh);
* :func:`load_sae_at`: an SAELens-format SAE and the residual index of its site in this model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CompatibilityError, ConfigError, InputError
from ..progress import log
from ..runs import RunDir


@dataclass
class ModelSource:
    """A checkpoint path or ``hf:ID[@REVISION]``, an optional hub revision and tokenizer, a device, and the
    weights' dtype (None: float32 for Hugging Face models, as stored for native checkpoints; ``"auto"``:
    as stored; see :func:`originlens.lm.loading.load_adapter`), and how a Hugging Face model is wrapped
    (``backend``: ``"auto"``, ``"hf"`` or ``"generic"``, see :func:`~originlens.lm.loading.load_adapter`).
    ``device_map`` (Hugging Face models only, with ``device`` left at ``"cpu"``) is passed to
    ``from_pretrained``: e.g. ``"auto"`` spreads the layers over the available devices."""

    model: str
    revision: str | None = None
    tokenizer: str | None = None
    device: str = "cpu"
    dtype: str | None = None
    backend: str = "auto"
    device_map: str | None = None


@dataclass
class CorpusSource:
    """Where the token windows come from; ``window`` applies to raw text only; ``prepend_bos``: whether the
    runs prepend the model's BOS to every window."""

    corpus: str
    window: int = 64
    max_windows: int | None = None
    prepend_bos: bool = True


def load_model_and_codec(src: ModelSource) -> tuple[Any, Any]:
    """The adapter (on ``src.device``) and its tokenizer codec (None when none is found and none was given)."""
    from ..devices import resolve_device
    from ..lm.loading import load_adapter, load_tokenizer

    if src.device_map is not None and src.device != "cpu":
        raise ConfigError(
            f"--device-map {src.device_map} and --device {src.device} given together",
            "give one: --device-map places the model's layers itself",
        )
    device = resolve_device(src.device)  # before loading anything: CUDA missing is one line
    codec = None
    try:
        codec = load_tokenizer(src.model, src.tokenizer, revision=src.revision)
    except (InputError, ConfigError):
        if src.tokenizer is not None:
            raise
        log("note: no tokenizer found next to the model; texts will not be decoded (pass --tokenizer)")
    adapter = load_adapter(
        src.model,
        revision=src.revision,
        tokenizer=codec,
        dtype=src.dtype,
        backend=src.backend,
        device_map=src.device_map,
        find_tokenizer=False,  # looked for above
    )
    if device.type != "cpu" and src.device_map is None:
        module = getattr(adapter, "module", None)
        if module is None:
            raise ConfigError(f"cannot move a {type(adapter).__name__} to {src.device}", "use --device cpu")
        module.to(device)
    return adapter, codec


def model_dtype(adapter: Any) -> str | None:
    """The dtype of the adapter's weights (e.g. ``"bfloat16"``), None when it has no torch module."""
    module = getattr(adapter, "module", None)
    p = next(iter(module.parameters()), None) if module is not None else None
    return None if p is None else str(p.dtype).replace("torch.", "")


def _vocab_strings(codec: Any) -> list[str] | None:
    from ..lm.compare_statistics import tokenizer_vocab

    for obj in (codec, getattr(codec, "inner", None)):
        if obj is None:
            continue
        try:
            return tokenizer_vocab(obj)
        except ConfigError:
            continue
    return None


def load_corpus(src: CorpusSource, adapter: Any, codec: Any) -> tuple[np.ndarray, str]:
    """Token windows ``(N, T)`` (without BOS) and a one-line description of their source."""
    from ..data import TokenStore, TokenWindows, is_corpus_dir, iter_documents
    from ..storage import vocab_hash

    path = src.corpus
    V = int(adapter.vocab_size)
    if is_corpus_dir(path):
        store = TokenStore.open(path)
        if store.vocab_size > V:
            raise CompatibilityError(
                f"corpus {path} has a vocabulary of {store.vocab_size} tokens but the model has {V}",
                "tokenize the corpus with the model's tokenizer",
            )
        vocab = _vocab_strings(codec) if codec is not None else None
        if vocab is not None and vocab_hash(vocab, len(vocab)) != store.vocab_hash:
            raise CompatibilityError(
                f"corpus {path} was tokenized with another vocabulary than the model's tokenizer",
                "pass the raw text as --corpus (tokenised with the model's "
                "tokenizer) or the corpus the model was trained on",
            )
        if vocab is None and store.vocab_size != V:
            raise CompatibilityError(
                f"corpus {path} has {store.vocab_size} tokens, the model {V}, and no tokenizer proves they agree",
                "pass --tokenizer, or a corpus in the model's vocabulary",
            )
        tokens = np.asarray(store.tokens)
        desc = f"corpus directory {path}"
    elif Path(path).suffix.lower() == ".npy" and Path(path).is_file():
        tokens = np.asarray(TokenWindows.load(path).tokens)
        desc = f"token array {path}"
    else:
        if codec is None:
            raise InputError("raw text needs the model's tokenizer", "pass --tokenizer, or a corpus directory")
        W = src.window
        if W < 2:
            raise ConfigError(f"--window must be ≥ 2, got {W}", "e.g. --window 64")
        rows: list[list[int]] = []
        for text in iter_documents([s for s in path.split(",") if s.strip()]):
            ids = codec.encode(text)
            rows += [ids[i : i + W] for i in range(0, len(ids) - W + 1, W)]
            if src.max_windows is not None and len(rows) >= src.max_windows:
                break
        if not rows:
            raise InputError(f"no document of {path} has {W} tokens", "use a smaller --window")
        tokens = np.asarray(rows, dtype=np.int64)
        desc = f"text {path} tokenised with {getattr(codec, 'source', '') or 'the model tokenizer'}, windows of {W}"
    if src.max_windows is not None:
        tokens = tokens[: src.max_windows]
    if tokens.size and int(tokens.max()) >= V:
        raise CompatibilityError(
            f"the corpus has token id {int(tokens.max())} but the model's vocabulary is [0, {V})",
            "tokenize the corpus with the model's tokenizer",
        )
    return tokens, f"{desc} ({tokens.shape[0]} windows of {tokens.shape[1]} tokens)"


def open_lm_run(out: str | Path, overwrite: bool) -> RunDir:
    """The run directory of an ``lm``/``sae`` run, locked for this process; ``overwrite`` starts its
    append-only records (``metrics.jsonl``) afresh, without it earlier results are refused."""
    from ..runs import hold_lock

    p = Path(out)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"--out {p} is a file", "choose a directory for --out")
    hold_lock(p)
    if (p / "results.json").exists() and not overwrite:
        raise ConfigError(f"{p} already holds results", "pass --overwrite or choose another --out")
    if overwrite:
        (p / "metrics.jsonl").unlink(missing_ok=True)
    return RunDir(p)


def load_sae_at(path: str | Path, adapter: Any, device: str = "cpu") -> tuple[Any, int]:
    """The SAE of ``path`` (SAELens format) on ``device`` and the residual index ``k`` of its site in
    ``adapter`` (its hook and width must match the model)."""
    from ..devices import resolve_device
    from ..sae import read_sae, sae_site

    sae = read_sae(path, device=resolve_device(device))
    return sae, sae_site(sae, adapter)


def select_features(spec: list[int] | None, sae: Any, limit: int | None = None) -> list[int]:
    """Feature ids (``None``: all of the SAE), checked against its width, the first ``limit`` of them."""
    feats = list(range(sae.d_sae)) if spec is None else list(spec)
    bad = [f for f in feats if not 0 <= f < sae.d_sae]
    if bad:
        raise ConfigError(f"feature ids {bad[:5]} outside 0..{sae.d_sae - 1}", "pick features of this SAE")
    return feats[:limit] if limit is not None else feats


def decode_ids(codec: Any, ids: Any) -> str:
    """Text of token ids, or the ids themselves when there is no tokenizer."""
    if codec is None:
        return " ".join(str(int(i)) for i in ids)
    return str(codec.decode([int(i) for i in ids]))
