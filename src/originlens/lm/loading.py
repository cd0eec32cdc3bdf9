"""Model checkpoints and their tokenizers of any supported format, behind three calls.

* :func:`load_model` (path or ``hf:ID[@REV]``) → the native model object;
* :func:`load_adapter` → an :class:`~originlens.lm.adapter.LMAdapter` (``Llama2cAdapter``,
  ``GPTAdapter``, ``HFAdapter`` or, for other Hugging Face architectures, ``GenericHFAdapter``);
* :func:`load_tokenizer` → a :class:`TextCodec` (``encode`` plain text, ``decode`` ids).

:data:`MODEL_FORMATS` is a registry of :class:`ModelFormat` entries (recognise a path, load the model,
wrap it as an adapter, find its tokenizer); :func:`detect_format` picks the entry:

* ``llama2c``: a llama2.c version-0 ``.bin`` (tokenizer: ``--tokenizer``, else ``tok{V}.bin`` or
  ``tokenizer.bin`` next to it);
* ``originlens-gpt``: a ``.safetensors`` written by ``GPT.save`` (metadata ``kind="gpt"``, e.g. a run's
  ``model.safetensors``) or a trainer checkpoint (``kind="ntp-checkpoint"``, tensors ``model.*`` and
  ``gpt_config`` metadata); tokenizer: a saved tokenizer, ``tokenizer.json`` or ``vocab.json`` (word
  list) next to the file or its run directory, else the corpus named by the run's configuration;
* ``hf``: a Hugging Face directory (``config.json`` + weights); tokenizer: its ``tokenizer.json``, else
  ``AutoTokenizer`` on the directory.  ``hf:ID[@REVISION]`` loads from the hub (optional extra).

Caveats: an explicit ``tokenizer`` may be a llama2.c ``.bin``, a ``tokenizer.json``, a saved originlens
tokenizer directory or a corpus directory, whatever the model format; a tokenizer with more ids than the
model is refused, and when the model file records the vocabulary hash of its training data (``ntp train``
writes it) the tokenizer's token strings must have that hash; otherwise only the size is checked.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import CompatibilityError, ConfigError, InputError, OriginlensError
from .adapter import LMAdapter
from .codecs import TextCodec, auto_tokenizer_codec, check_vocab, llama2c_codec, originlens_codec, tokenizer_json_codec
from .llama2c import (
    HEADER_INTS,
    Llama2cConfig,
    expected_llama2c_bytes,
    load_llama2c,
    read_llama2c_header,
)

HF_PREFIX = "hf:"
BACKENDS = ("auto", "hf", "generic")  # how Hugging Face models are wrapped (load_adapter)
GPT_KINDS = ("gpt", "ntp-checkpoint")


# --------------------------------------------------------------------------------------------------
# Tokenizers seen by the lm tools (the codecs themselves: .codecs)
# --------------------------------------------------------------------------------------------------


def open_tokenizer(path: str | os.PathLike, *, vocab_size: int | None = None) -> TextCodec:
    """A tokenizer from a path of any kind — llama2.c ``.bin``, ``tokenizer.json`` (or a directory with
    one), a saved originlens tokenizer directory, a corpus directory — or a hub spec ``hf:ID[@REV]`` (its
    ``tokenizer.json``; offline from the local cache when ``HF_HUB_OFFLINE`` is set)."""
    from ..data.store import TokenStore, is_corpus_dir
    from ..data.tokenizers import SAVED_NAME, load_saved

    if isinstance(path, str) and path.startswith(HF_PREFIX):
        return _hub_tokenizer(*parse_hub_spec(path))
    p = Path(path)
    if not p.exists():
        raise InputError(f"tokenizer {p} does not exist", "check the --tokenizer path")
    if p.is_dir():
        if (p / SAVED_NAME).is_file():
            return originlens_codec(load_saved(p), str(p))
        if is_corpus_dir(p):
            return originlens_codec(TokenStore.open(p).tokenizer(), str(p))
        if (p / "tokenizer.json").is_file():
            return tokenizer_json_codec(p / "tokenizer.json")
        if (p / "tokenizer_config.json").is_file():
            return auto_tokenizer_codec(p)
        raise InputError(
            f"no tokenizer found in directory {p}",
            "pass a tokenizer.json, a llama2.c tokenizer .bin, or a corpus/tokenizer directory",
        )
    if p.name == SAVED_NAME:
        return originlens_codec(load_saved(p.parent), str(p.parent))
    if p.suffix == ".json":
        return tokenizer_json_codec(p)
    return llama2c_codec(p, vocab_size)


# --------------------------------------------------------------------------------------------------
# Formats
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFormat:
    """One checkpoint format: how to recognise it, load the model, wrap it, and find its tokenizer.

    ``load_tokenizer(model_path, tokenizer_path_or_None)`` returns a :class:`TextCodec`.
    """

    name: str
    description: str
    detect: Callable[[Path], bool]
    load: Callable[[Path], Any]
    load_tokenizer: Callable[[Path, Path | None], TextCodec]
    adapter: Callable[[Any], LMAdapter]


# -- llama2.c ---------------------------------------------------------------------------------------


def _looks_like_llama2c(path: Path) -> bool:
    """A ``.bin`` file, or any file whose 7-int header predicts its exact size."""
    if not path.is_file():
        return False
    if path.suffix == ".bin":
        return True
    try:
        with open(path, "rb") as f:
            raw = f.read(4 * HEADER_INTS)
        if len(raw) < 4 * HEADER_INTS:
            return False
        d, h, nl, nh, nkv, v, s = (int(x) for x in np.frombuffer(raw, "<i4"))
        cfg = Llama2cConfig(d, h, nl, nh, nkv, abs(v), s, shared_classifier=v > 0)
        cfg.validate()
        return expected_llama2c_bytes(cfg) == path.stat().st_size
    except (OSError, InputError, OverflowError, ValueError):
        return False


def _llama2c_tokenizer(model_path: Path, tokenizer: Path | None) -> TextCodec:
    vocab = read_llama2c_header(model_path).vocab_size
    if tokenizer is not None:
        return open_tokenizer(tokenizer, vocab_size=vocab)
    for name in (f"tok{vocab}.bin", "tokenizer.bin"):
        cand = model_path.parent / name
        if cand.is_file():
            return llama2c_codec(cand, vocab)
    raise InputError(
        "a llama2.c checkpoint needs its tokenizer",
        f"pass --tokenizer PATH (e.g. tok512.bin next to stories260K.bin); tok{vocab}.bin or "
        f"tokenizer.bin next to {model_path.name} is found automatically",
    )


def _llama2c_adapter(model: Any) -> LMAdapter:
    from .native import Llama2cAdapter

    return Llama2cAdapter(model)


# -- our GPT ----------------------------------------------------------------------------------------


def safetensors_metadata(path: Path) -> dict[str, str] | None:
    """The string metadata of a safetensors file (header only), ``None`` when unreadable."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            return dict(f.metadata() or {})
    except Exception:  # safetensors raises its own error types
        return None


def _looks_like_gpt(path: Path) -> bool:
    if not (path.is_file() and path.suffix == ".safetensors"):
        return False
    meta = safetensors_metadata(path)
    return meta is not None and meta.get("kind") in GPT_KINDS


def load_gpt_checkpoint(path: str | os.PathLike) -> Any:
    """A :class:`~originlens.models.gpt.GPT` from ``GPT.save`` output or a trainer checkpoint (eval mode)."""
    from ..models.gpt import GPT, GPTConfig
    from ..storage import load_tensors

    p = Path(path)
    meta = safetensors_metadata(p) or {}
    model: Any  # a GPT that also carries the checkpoint's vocab_hash (set below)
    if meta.get("kind") == "gpt":
        model = GPT.load(p).eval()
    else:
        arrays, meta = load_tensors(p, kind="ntp-checkpoint")
        if "gpt_config" not in meta:
            raise CompatibilityError(f"{p} has no gpt_config in its metadata", "pass a checkpoint written by ntp train")
        config = GPTConfig.from_dict(json.loads(meta["gpt_config"]))
        state = {k[len("model.") :]: torch.from_numpy(v.copy()) for k, v in arrays.items() if k.startswith("model.")}
        model = GPT.from_state_dict(state, config).eval()
    vh = meta.get("vocab_hash")  # checked against tokenizers (check_vocab); "null" = none recorded
    model.vocab_hash = None if vh in (None, "null", "") else str(vh).strip('"')
    return model


def _gpt_corpus(path: Path) -> Path | None:
    """The corpus directory named by a checkpoint's metadata or its run's config.json."""
    meta = safetensors_metadata(path) or {}
    sources = []
    if "ntp_config" in meta:
        try:
            sources.append(json.loads(meta["ntp_config"]))
        except ValueError:
            pass
    for run in (path.parent, path.parent.parent):
        cfg = run / "config.json"
        if cfg.is_file():
            try:
                sources.append(json.loads(cfg.read_text(encoding="utf-8")))
            except (OSError, ValueError):
                pass
    for s in sources:
        corpus = s.get("corpus") if isinstance(s, dict) else None
        if corpus and Path(corpus).is_dir():
            return Path(corpus)
    return None


def _gpt_tokenizer(model_path: Path, tokenizer: Path | None) -> TextCodec:
    from ..data.store import is_corpus_dir
    from ..data.tokenizers import SAVED_NAME, WordTokenizer, load_saved
    from ..storage import read_json

    if tokenizer is not None:
        return open_tokenizer(tokenizer)
    dirs = [model_path.parent] + ([model_path.parent.parent] if model_path.parent.name == "checkpoints" else [])
    for d in dirs:
        for cand in (d, d / "tokenizer"):
            if (cand / SAVED_NAME).is_file():
                return originlens_codec(load_saved(cand), str(cand))
        if (d / "tokenizer.json").is_file():
            return tokenizer_json_codec(d / "tokenizer.json")
        if (d / "vocab.json").is_file():
            vocab = read_json(d / "vocab.json")
            if isinstance(vocab, list) and all(isinstance(t, str) for t in vocab):
                return originlens_codec(WordTokenizer(vocab), str(d / "vocab.json"))
    corpus = _gpt_corpus(model_path)
    if corpus is not None and is_corpus_dir(corpus):
        return open_tokenizer(corpus)
    raise InputError(
        f"no tokenizer found for GPT checkpoint {model_path}",
        "pass --tokenizer (the corpus directory the model was trained on, a tokenizer.json "
        "or a saved tokenizer directory)",
    )


def _gpt_adapter(model: Any) -> LMAdapter:
    from .native import GPTAdapter

    adapter = GPTAdapter(model)
    adapter.vocab_hash = getattr(model, "vocab_hash", None)  # type: ignore[attr-defined]
    return adapter


# -- Hugging Face -----------------------------------------------------------------------------------


def _looks_like_hf(path: Path) -> bool:
    from .hf_hub import is_hf_dir

    return is_hf_dir(path)


def _load_hf_dir(path: Path) -> Any:
    from .hf_hub import load_hf_model

    return load_hf_model(path)


def _hf_config_ids(directory: Path) -> tuple[int | None, int | None]:
    try:
        cfg = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, None
    ids = []
    for key in ("bos_token_id", "eos_token_id"):
        v = cfg.get(key)
        ids.append(v[0] if isinstance(v, list) and v else v if isinstance(v, int) else None)
    return ids[0], ids[1]


def _hf_tokenizer(model_path: Path, tokenizer: Path | None) -> TextCodec:
    if tokenizer is not None:
        return open_tokenizer(tokenizer)
    bos, eos = _hf_config_ids(model_path)
    if (model_path / "tokenizer.json").is_file():
        return tokenizer_json_codec(model_path / "tokenizer.json", bos_id=bos, eos_id=eos)
    if (model_path / "tokenizer_config.json").is_file():
        return auto_tokenizer_codec(model_path)
    raise InputError(
        f"Hugging Face directory {model_path} has no tokenizer (tokenizer.json)",
        "pass --tokenizer (a tokenizer.json, or the llama2.c tokenizer .bin for an exported llama2.c model)",
    )


def _hf_adapter(model: Any) -> LMAdapter:
    from .hf import HFAdapter

    return HFAdapter(model)


MODEL_FORMATS: list[ModelFormat] = [
    ModelFormat(
        "llama2c",
        "llama2.c version-0 checkpoint (.bin, 7-int32 header + float32 weights)",
        _looks_like_llama2c,
        load_llama2c,
        _llama2c_tokenizer,
        _llama2c_adapter,
    ),
    ModelFormat(
        "originlens-gpt",
        "originlens GPT weights (.safetensors from GPT.save or an ntp-train checkpoint)",
        _looks_like_gpt,
        load_gpt_checkpoint,
        _gpt_tokenizer,
        _gpt_adapter,
    ),
    ModelFormat(
        "hf",
        "Hugging Face model directory (config.json + weights; GPT-2, GPT-NeoX/Pythia, Llama, Gemma-2, "
        "other causal LMs with nnsight), or hf:ID[@REVISION] for the hub",
        _looks_like_hf,
        _load_hf_dir,
        _hf_tokenizer,
        _hf_adapter,
    ),
]


# --------------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------------


def parse_hub_spec(spec: str, revision: str | None = None) -> tuple[str, str | None]:
    """``"hf:ID[@REV]"`` → ``(ID, REV)``; ``revision`` may give REV instead (not both, unless equal)."""
    body = spec[len(HF_PREFIX) :] if spec.startswith(HF_PREFIX) else spec
    repo, _, rev = body.partition("@")
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?", repo):
        raise ConfigError(f"{spec!r} is not a hub spec", "use hf:OWNER/NAME or hf:OWNER/NAME@REVISION")
    if rev and revision is not None and rev != revision:
        raise ConfigError(
            f"two revisions given: {rev!r} in {spec!r} and revision={revision!r}", "give the revision once"
        )
    return repo, (rev or revision)


def detect_format(path: str | os.PathLike) -> ModelFormat:
    """The registered format of ``path``; :class:`InputError` listing the supported ones otherwise."""
    path = Path(path)
    if not path.exists():
        hint = f"; for the Hugging Face hub use hf:{path}" if re.fullmatch(r"[\w.-]+/[\w.-]+", str(path)) else ""
        raise InputError(f"model path {path} does not exist", f"check the --model path{hint}")
    for fmt in MODEL_FORMATS:
        if fmt.detect(path):
            return fmt
    supported = "; ".join(f"{f.name}: {f.description}" for f in MODEL_FORMATS)
    raise InputError(f"unrecognised model format at {path}", f"supported formats are {supported}")


def _local(spec: str | os.PathLike, revision: str | None) -> Path:
    if revision is not None:
        raise ConfigError(
            f"revision={revision!r} given for the local path {spec}", "revisions only apply to hub specs hf:ID@REVISION"
        )
    return Path(spec)


def load_model(path: str | os.PathLike, *, revision: str | None = None) -> Any:
    """The native model of a checkpoint of any registered format, or of ``hf:ID[@REV]``."""
    if isinstance(path, str) and path.startswith(HF_PREFIX):
        from .hf_hub import load_hf_model

        return load_hf_model(*parse_hub_spec(path, revision))
    p = _local(path, revision)
    return detect_format(p).load(p)


def load_tokenizer(
    spec: str | os.PathLike, tokenizer: str | os.PathLike | None = None, *, revision: str | None = None
) -> TextCodec:
    """The :class:`TextCodec` of a model (path or ``hf:ID[@REV]``), or of the explicit ``tokenizer``."""
    if isinstance(spec, str) and spec.startswith(HF_PREFIX):
        if tokenizer is not None:
            return open_tokenizer(tokenizer)
        return _hub_tokenizer(*parse_hub_spec(spec, revision))
    p = _local(spec, revision)
    return detect_format(p).load_tokenizer(p, None if tokenizer is None else Path(tokenizer))


def _hub_tokenizer(repo: str, revision: str | None) -> TextCodec:
    from .hf_hub import hub_error, hub_offline, require_transformers

    require_transformers()
    from huggingface_hub import hf_hub_download

    try:
        f = hf_hub_download(repo, "tokenizer.json", revision=revision, local_files_only=hub_offline())
    except (OSError, ValueError) as exc:
        raise hub_error(exc, repo, revision) from None
    return tokenizer_json_codec(f)


def load_adapter(
    spec: str | os.PathLike | LMAdapter,
    *,
    revision: str | None = None,
    tokenizer: str | os.PathLike | TextCodec | None = None,
    dtype: Any = None,
    backend: str = "auto",
    device_map: str | dict[str, Any] | None = None,
    find_tokenizer: bool = True,
) -> LMAdapter:
    """An :class:`~originlens.lm.adapter.LMAdapter` for a model path or ``hf:ID[@REVISION]``.

    llama2.c ``.bin`` → ``Llama2cAdapter``; GPT ``.safetensors`` → ``GPTAdapter``; Hugging Face
    directory or hub spec → ``HFAdapter`` or ``GenericHFAdapter`` by ``backend`` (:data:`BACKENDS`):
    ``"auto"`` the hand-written adapter for its families (:mod:`.hf_families`) and the generic one
    (:mod:`.generic`, needs nnsight) for any other architecture, ``"hf"`` only the hand-written one,
    ``"generic"`` always the generic one; native checkpoints ignore it.  An adapter is returned as is.  With ``tokenizer`` (a path or
    a :class:`TextCodec`), the codec is loaded (see :func:`load_tokenizer`), checked against the model's vocabulary size and stored as ``adapter.tokenizer``; its BOS
    becomes the adapter's ``bos_id`` when the model has none.  ``dtype`` (a name or ``torch.dtype``;
    :func:`originlens.devices.resolve_dtype`): the weights' dtype — Hugging Face models are loaded in it
    (default float32, ``"auto"`` the stored dtype), native checkpoints cast after loading (default and
    ``"auto"``: as stored).  ``device_map`` (Hugging Face models only; e.g. ``"auto"``, which needs
    ``accelerate``, or ``{"": "cpu"}``) is passed to ``from_pretrained``; the adapter feeds its inputs to
    the device of the input embedding.

    Without ``tokenizer``, the one found next to the model (as :func:`load_tokenizer` finds it; from the
    hub for ``hf:`` specs) is attached when there is one that fits the model; ``adapter.tokenizer`` is None
    otherwise (``find_tokenizer=False``: none is looked for).
    """
    from ..devices import resolve_dtype

    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}", f"use one of: {', '.join(BACKENDS)}")
    if device_map is not None and (isinstance(spec, LMAdapter) or not _is_hf_spec(spec, revision)):
        raise ConfigError(
            f"device_map applies to Hugging Face models only, not to {getattr(spec, 'family', None) or spec}",
            "drop --device-map (use --device)",
        )
    dt = resolve_dtype(dtype) if dtype is not None else None
    hf_dtype = torch.float32 if dtype is None else dt  # None: "auto", the stored dtype
    if isinstance(spec, LMAdapter):
        adapter = spec
    elif isinstance(spec, str) and spec.startswith(HF_PREFIX):
        repo, rev = parse_hub_spec(spec, revision)
        adapter = _hf_backend_adapter(repo, rev, hf_dtype, backend, device_map)
    else:
        p = _local(spec, revision)
        fmt = detect_format(p)
        if fmt.name == "hf":
            adapter = _hf_backend_adapter(p, None, hf_dtype, backend, device_map)
        else:
            adapter = fmt.adapter(fmt.load(p))
            if dt is not None:
                adapter.module.to(dt)  # type: ignore[attr-defined]
    if tokenizer is not None:
        codec = (
            tokenizer
            if isinstance(tokenizer, TextCodec)
            else (
                load_tokenizer(spec, tokenizer, revision=revision)
                if not isinstance(spec, LMAdapter)
                else open_tokenizer(tokenizer)
            )
        )
        check_vocab(adapter, codec)
        if adapter.bos_id is None and codec.bos_id is not None:
            adapter.bos_id = codec.bos_id
        adapter.tokenizer = codec  # type: ignore[attr-defined]
    elif not isinstance(spec, LMAdapter):
        adapter.tokenizer = _found_tokenizer(adapter, spec, revision) if find_tokenizer else None  # type: ignore[attr-defined]
    return adapter


def _is_hf_spec(spec: str | os.PathLike, revision: str | None) -> bool:
    if isinstance(spec, str) and spec.startswith(HF_PREFIX):
        return True
    return detect_format(_local(spec, revision)).name == "hf"


def _found_tokenizer(adapter: LMAdapter, spec: str | os.PathLike, revision: str | None) -> TextCodec | None:
    """The tokenizer next to the model when there is one that fits it (attached like an explicit one)."""
    try:
        codec = load_tokenizer(spec, revision=revision)
        check_vocab(adapter, codec)
    except OriginlensError:
        return None
    if adapter.bos_id is None and codec.bos_id is not None:
        adapter.bos_id = codec.bos_id
    return codec


def _hf_backend_adapter(
    source: str | os.PathLike, revision: str | None, dtype: Any, backend: str, device_map: Any = None
) -> LMAdapter:
    """A Hugging Face model behind the adapter that ``backend`` selects (see :func:`load_adapter`)."""
    from .generic import INSTALL, GenericHFAdapter, has_nnsight, require_nnsight
    from .hf import HFAdapter
    from .hf_families import FAMILIES
    from .hf_hub import load_hf_model, resolve_hf_source, resolved_commit

    if backend == "generic":
        require_nnsight()  # before reading any weight
    generic_ok = backend == "generic" or (backend == "auto" and has_nnsight())
    try:
        model = load_hf_model(source, revision, dtype=dtype, any_architecture=generic_ok, device_map=device_map)
    except CompatibilityError as exc:
        if backend == "auto":  # an architecture outside the table, and nnsight is missing
            raise CompatibilityError(exc.what, f"{exc.fix}; or, for any architecture, {INSTALL}") from None
        raise
    use_generic = backend == "generic" or (backend == "auto" and model.config.model_type not in FAMILIES)
    hub = isinstance(source, str) and not resolve_hf_source(source)[1]
    src = str(source) + (f"@{revision}" if revision else "") if hub else None
    adapter: LMAdapter = GenericHFAdapter(model, source=src) if use_generic else HFAdapter(model, source=src)
    if hub:
        adapter.commit = resolved_commit(str(source), revision)  # type: ignore[attr-defined]
    return adapter
