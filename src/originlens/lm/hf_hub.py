"""Loading Hugging Face models: the optional ``transformers`` import, local directories (always offline)
and hub ids with ``revision=`` (:func:`load_hf_model`), the hub's errors turned into one
:class:`~originlens.errors.InputError` that says how to use a local directory, and the commit a revision
resolved to.  ``trust_remote_code`` is always passed, False unless the caller asks; pickled
``pytorch_model.bin`` weights are refused unless allowed.  :mod:`.hf` wraps the loaded model."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..errors import CompatibilityError, ConfigError, InputError
from .hf_families import family_of

INSTALL_FIX = "pip install 'originlens[hf]' (installs transformers)"
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def require_transformers() -> Any:
    """The ``transformers`` module, or :class:`CompatibilityError` saying how to install it."""
    try:
        import transformers
    except ImportError:
        raise CompatibilityError(
            "Hugging Face models need the optional dependency 'transformers', which is not installed", INSTALL_FIX
        ) from None
    return transformers


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' progress bars and info/warning logs for the duration of a load/save."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    level = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def is_hf_dir(path: str | os.PathLike) -> bool:
    """A directory with a ``config.json`` and model weights (safetensors or a PyTorch ``.bin``)."""
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file() and any((p / w).is_file() for w in WEIGHT_FILES)


def hub_offline() -> bool:
    """True when HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set (hub ids then read the cache only)."""
    return any(
        os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _chain_names(exc: BaseException) -> set[str]:
    names: set[str] = set()
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        names.update(c.__name__ for c in type(e).__mro__)
        e = e.__cause__ or e.__context__
    return names


def hub_error(exc: BaseException, repo_id: str, revision: str | None) -> InputError:
    """Translate a hub failure of ``from_pretrained`` into a one-line :class:`InputError`."""
    names = _chain_names(exc)
    what = f"{repo_id!r}" + (f" at revision {revision!r}" if revision else "")
    local = (
        f"download it where the hub is reachable (`hf download {repo_id}"
        + (f" --revision {revision}" if revision else "")
        + " --local-dir DIR`) and pass the local "
        "directory DIR instead of the hub id"
    )
    if "RevisionNotFoundError" in names:
        return InputError(
            f"hub model {repo_id!r} has no revision {revision!r}",
            "check the revision (branch, tag or commit), e.g. Pythia's step1000",
        )
    if "RepositoryNotFoundError" in names or "GatedRepoError" in names:
        return InputError(
            f"hub model {repo_id!r} was not found (or is gated/private)",
            "check the model id, or log in if the model is gated",
        )
    if "LocalEntryNotFoundError" in names or "OfflineModeIsEnabled" in names or "ConnectError" in names:
        return InputError(
            f"could not load hub model {what}: the Hugging Face hub could not be reached "
            "(offline or no network) and the files are not in the local cache",
            local,
        )
    msg = " ".join(str(exc).split())[:200]
    return InputError(f"could not load hub model {what} ({msg})", local)


def resolve_hf_source(path_or_id: str | os.PathLike) -> tuple[str, bool]:
    """``(source, is_local)``: an existing Hugging Face directory, or a hub id (validated)."""
    p = Path(path_or_id)
    if p.exists():
        if not p.is_dir():
            raise InputError(
                f"{p} is a file, not a Hugging Face model directory",
                "pass the directory holding config.json and the weights",
            )
        if not (p / "config.json").is_file():
            raise InputError(
                f"{p} has no config.json: not a Hugging Face model directory",
                "pass the directory written by save_pretrained (config.json + weights)",
            )
        if not any((p / w).is_file() for w in WEIGHT_FILES):
            raise InputError(
                f"{p} has no model weights ({', '.join(WEIGHT_FILES)})", "pass a complete Hugging Face model directory"
            )
        return str(p), True
    s = str(path_or_id)
    if s.startswith((".", "/", "~")) or s.count("/") > 1 or not _HUB_ID.match(s):
        raise InputError(
            f"{s} is neither an existing directory nor a Hugging Face hub id",
            "pass a local model directory or a hub id such as EleutherAI/pythia-70m",
        )
    return s, False


def load_hf_model(
    path_or_id: str | os.PathLike,
    revision: str | None = None,
    *,
    dtype: torch.dtype | str | None = torch.float32,
    local_files_only: bool | None = None,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    device: str | torch.device | None = None,
    allow_pickled_weights: bool = False,
    any_architecture: bool = False,
    device_map: str | dict[str, Any] | None = None,
) -> Any:
    """The ``transformers`` causal LM of a local directory or hub id (eval mode).

        ``dtype=None`` keeps the stored dtype (``"auto"``); the default converts to float32.  A local
        directory is always read with ``local_files_only=True``; for a hub id the default follows
        ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``.  ``trust_remote_code`` is always passed explicitly
    (default False: a directory whose ``auto_map`` needs its own code is refused, never prompted for).
        A local directory is read with ``use_safetensors=True``: one holding only pickled PyTorch weights
        (``pytorch_model.bin``) is refused with an :class:`InputError` before anything is unpickled, unless
        ``allow_pickled_weights=True`` (then ``transformers`` reads them with ``torch.load(weights_only=True)``).
        Architectures outside the hand-written families (:mod:`.hf_families`) are refused before any weight
        is read, unless ``any_architecture`` (the generic backend, :mod:`.generic`).  ``device_map`` is
        passed to ``from_pretrained`` (``"auto"`` needs ``accelerate``); it excludes ``device``.
    """
    if device_map is not None and device is not None:
        raise ConfigError(
            f"device_map={device_map!r} and device={str(device)!r} given together",
            "give one: device_map places the weights itself",
        )
    tf = require_transformers()
    source, local = resolve_hf_source(path_or_id)
    if (
        local
        and not allow_pickled_weights
        and not any((Path(source) / w).is_file() for w in WEIGHT_FILES if ".safetensors" in w)
    ):
        pickled = [w for w in WEIGHT_FILES if ".safetensors" not in w and (Path(source) / w).is_file()]
        raise InputError(
            f"{source} holds only pickled PyTorch weights ({', '.join(pickled)}), which originlens does not unpickle",
            "convert them to safetensors once, in a trusted environment (transformers: "
            "AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True)), "
            "or pass allow_pickled_weights=True if you trust the file",
        )
    if local and revision is not None:
        raise ConfigError(
            f"revision={revision!r} given for the local directory {source}",
            "revisions only apply to hub ids; pass the directory of that revision",
        )
    lfo = True if local else (hub_offline() if local_files_only is None else bool(local_files_only))
    kw: dict[str, Any] = {"local_files_only": lfo}
    if revision is not None:
        kw["revision"] = revision
    # always explicit: ``None`` would let transformers *ask* on stdin and run the code on "y"
    kw["trust_remote_code"] = bool(trust_remote_code)
    with quiet_transformers():
        try:
            config = tf.AutoConfig.from_pretrained(source, **kw)
        except (OSError, ValueError) as exc:
            if not trust_remote_code and "trust_remote_code" in str(exc):
                raise InputError(
                    f"{source} defines its own model code (config.json 'auto_map'), which originlens "
                    "never runs unless asked",
                    "use a model of a built-in transformers architecture, or, if you trust the code, "
                    "load it from Python with load_hf and its trust_remote_code argument set",
                ) from None
            if local:
                raise InputError(
                    f"{source}/config.json could not be read ({' '.join(str(exc).split())[:200]})",
                    "pass a directory written by save_pretrained",
                ) from None
            raise hub_error(exc, source, revision) from None
        if not any_architecture:
            family_of(getattr(config, "model_type", ""))  # fail before downloading weights
        mkw = dict(kw)
        mkw["dtype"] = "auto" if dtype is None else dtype
        if local and not allow_pickled_weights:
            mkw["use_safetensors"] = True  # never fall back to a pickled pytorch_model.bin
        if attn_implementation is not None:
            mkw["attn_implementation"] = attn_implementation
        if device_map is not None:
            mkw["device_map"] = device_map
        if device_map is not None:
            import importlib.util

            if importlib.util.find_spec("accelerate") is None:  # transformers says so only in a ValueError
                raise CompatibilityError(
                    f"loading {source} with device_map={device_map!r} needs the accelerate package",
                    "pip install accelerate, or drop the device map",
                )
        try:
            model = tf.AutoModelForCausalLM.from_pretrained(source, config=config, **mkw)
        except ImportError as exc:  # device_map without accelerate
            raise CompatibilityError(
                f"loading {source} with device_map={device_map!r} failed: {' '.join(str(exc).split())[:200]}",
                "pip install accelerate, or drop the device map",
            ) from None
        except (OSError, ValueError) as exc:
            if local:
                raise InputError(
                    f"the weights in {source} could not be loaded ({' '.join(str(exc).split())[:200]})",
                    "pass a complete directory written by save_pretrained",
                ) from None
            raise hub_error(exc, source, revision) from None
    if device is not None:
        model = model.to(device)
    return model.eval()


def resolved_commit(repo_id: str, revision: str | None) -> str | None:
    """The hub commit that ``revision`` (a branch, tag or commit; default ``main``) of ``repo_id`` resolved
    to, read from the local cache after a load (``…/snapshots/<commit>/config.json``); None if unknown."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    path = try_to_load_from_cache(repo_id, "config.json", revision=revision or "main")
    if not isinstance(path, str):
        return None
    snap = Path(path).parent
    return snap.name if snap.parent.name == "snapshots" else None
