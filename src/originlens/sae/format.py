"""SAELens' on-disk format: a directory with ``cfg.json`` and ``sae_weights.safetensors``.

Weights (safetensors, names and shapes as SAELens): ``W_enc (d_in, d_sae)``, ``b_enc (d_sae)``,
``W_dec (d_sae, d_in)``, ``b_dec (d_in)`` and, for JumpReLU, ``threshold (d_sae)``; all in ``cfg.dtype``.

``cfg.json`` comes in two generations and :func:`read_sae` accepts both:

* SAELens < 6 (flat): ``architecture``, ``d_in``, ``d_sae``, ``dtype``, ``device``, ``model_name``,
  ``hook_name`` (older: ``hook_point``), ``hook_layer``, ``hook_head_index``, ``activation_fn_str``
  (``"relu"``/``"topk"``), ``activation_fn_kwargs`` (``{"k": K}`` for TopK), ``apply_b_dec_to_input``,
  ``normalize_activations`` (older: a bool), ``finetuning_scaling_factor``, ``prepend_bos``,
  ``context_size``, ``dataset_path``, ...;
* SAELens ≥ 6: the SAE fields at top level (``d_in``, ``d_sae``, ``dtype``, ``device``,
  ``apply_b_dec_to_input``, ``normalize_activations``, ``reshape_activations``, ``architecture``, ``k``
  for TopK) and the model-side fields (``model_name``, ``hook_name``, ``prepend_bos``, ...) nested under
  ``metadata`` (early 6.x) or ``meta`` (later 6.x).

:func:`write_sae` writes the flat layout, with ``k`` both at top level and in ``activation_fn_kwargs``:
SAELens 5 reads it directly and SAELens 6 converts it on load (a config without ``sae_lens_version`` is
treated as pre-6), so every version loads what we write.  Unknown keys are preserved in
``SAEConfig.extra`` and written back.

Caveats: architectures other than standard / jumprelu / topk (gated, batchtopk training checkpoints,
transcoders) are refused with a clear error; a non-trivial ``finetuning_scaling_factor``, ``hook_head_index``, ``reshape_activations`` or TopK
``rescale_acts_by_decoder_norm`` (settings that change the forward pass) is refused, never ignored;
``expected_average_only_in`` is read as the identity, as SAELens does for a local directory (a warning
says so).  Tensors are read with safetensors (no pickle) in any dtype torch supports (bfloat16 included).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import CompatibilityError, ConfigError, InputError
from ..outputs import OutputKind, atomic_directory
from ..progress import log
from ..storage import atomic_write_bytes, atomic_write_text
from .model import ARCHITECTURES, DTYPES, SAE, SAEConfig, dtype_name

CFG_FILENAME = "cfg.json"
WEIGHTS_FILENAME = "sae_weights.safetensors"
WEIGHT_SHAPES = {
    "W_enc": ("d_in", "d_sae"),
    "b_enc": ("d_sae",),
    "W_dec": ("d_sae", "d_in"),
    "b_dec": ("d_in",),
    "threshold": ("d_sae",),
}
_META_KEYS = ("metadata", "meta")
_CORE_KEYS = {
    "architecture",
    "d_in",
    "d_sae",
    "dtype",
    "device",
    "model_name",
    "hook_name",
    "hook_point",
    "hook_layer",
    "k",
    "activation_fn",
    "activation_fn_str",
    "activation_fn_kwargs",
    "apply_b_dec_to_input",
    "normalize_activations",
    "prepend_bos",
    "context_size",
    "dataset_path",
    *_META_KEYS,
}


# SAELens settings that would change what the SAE computes, with the values under which originlens's
# forward pass is SAELens's own (any other value is refused by config_from_dict)
_FORWARD_KEYS: dict[str, tuple[Any, ...]] = {
    "hook_head_index": (None,),  # an SAE on one attention head's output
    "reshape_activations": (None, "none"),  # e.g. "hook_z": per-head activations flattened
    "rescale_acts_by_decoder_norm": (None, False),  # TopK: activations scaled by the decoder row norms
}


# ----------------------------------------------------------------------------------------------------
# cfg.json <-> SAEConfig


def config_from_dict(d: Mapping[str, Any], *, where: str = "cfg.json") -> SAEConfig:
    """An :class:`SAEConfig` from a SAELens ``cfg.json`` of either generation (see the module docstring)."""
    if not isinstance(d, Mapping):
        raise InputError(f"{where} is not a JSON object", "pass an SAELens SAE directory")
    meta: Mapping[str, Any] = {}
    for key in _META_KEYS:
        if isinstance(d.get(key), Mapping):
            meta = d[key]
            break

    def get(key: str, default: Any = None) -> Any:
        if key in d and d[key] is not None:
            return d[key]
        return meta.get(key, default)

    arch = d.get("architecture", "standard") or "standard"
    act_fn = d.get("activation_fn") or d.get("activation_fn_str")
    kwargs = d.get("activation_fn_kwargs") or {}
    if arch == "standard" and act_fn == "topk":  # SAELens 4/5 spelled TopK this way
        arch = "topk"
    if arch not in ARCHITECTURES:
        raise ConfigError(
            f"{where}: SAE architecture {arch!r} is not supported",
            f"originlens runs {', '.join(ARCHITECTURES)} SAEs (convert the SAE first)",
        )
    k = d.get("k", kwargs.get("k") if isinstance(kwargs, Mapping) else None)
    if arch == "topk" and isinstance(k, float) and k.is_integer():
        k = int(k)
    norm = d.get("normalize_activations", "none")
    if isinstance(norm, bool):
        norm = "expected_average_only_in" if norm else "none"
    if norm == "expected_average_only_in":
        log(
            f"note: {where} has normalize_activations='expected_average_only_in'; like SAELens for a local "
            "directory, the SAE is applied without the dataset scaling factor"
        )
    if d.get("finetuning_scaling_factor") not in (None, False):
        raise ConfigError(
            f"{where}: finetuned scaling factors are not supported", "fold the scaling factor into the weights first"
        )
    # settings that change the forward pass and that originlens does not implement: refused, never ignored
    for key, trivial in _FORWARD_KEYS.items():
        v = get(key)
        if v not in trivial:
            raise ConfigError(
                f"{where}: {key}={v!r} changes the SAE's forward pass and is not supported",
                "use an SAE on the residual stream without it (or convert the SAE first)",
            )
    hook = get("hook_name") or get("hook_point")
    if not hook:
        raise InputError(f"{where} has no hook_name", "add the SAE's hook, e.g. blocks.3.hook_resid_post")
    for key in ("d_in", "d_sae"):
        if key not in d:
            raise InputError(f"{where} lacks {key}", "add d_in and d_sae to cfg.json")
    extra = {key: v for key, v in d.items() if key not in _CORE_KEYS}
    try:
        return SAEConfig(
            d_in=d["d_in"],
            d_sae=d["d_sae"],
            architecture=arch,
            k=k if arch == "topk" else None,
            hook_name=str(hook),
            model_name=get("model_name"),
            dtype=dtype_name(d.get("dtype") or "float32"),
            device=str(d.get("device") or "cpu"),
            apply_b_dec_to_input=bool(d.get("apply_b_dec_to_input", True)),
            normalize_activations=norm or "none",
            prepend_bos=bool(get("prepend_bos", True)),
            context_size=get("context_size"),
            dataset_path=get("dataset_path"),
            extra=extra,
        )
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc.what}", exc.fix) from None


def config_to_dict(cfg: SAEConfig) -> dict[str, Any]:
    """The flat SAELens ``cfg.json`` of ``cfg`` (loads in SAELens 5 and 6)."""
    topk = cfg.architecture == "topk"
    out: dict[str, Any] = {
        "architecture": cfg.architecture,
        "d_in": cfg.d_in,
        "d_sae": cfg.d_sae,
        "dtype": cfg.dtype,
        "device": cfg.device,
        "model_name": cfg.model_name or "",
        "hook_name": cfg.hook_name,
        "hook_layer": cfg.hook_layer if cfg.hook_layer is not None else 0,
        "hook_head_index": None,
        "activation_fn_str": "topk" if topk else "relu",
        "activation_fn_kwargs": {"k": cfg.k} if topk else {},
        "apply_b_dec_to_input": cfg.apply_b_dec_to_input,
        "finetuning_scaling_factor": False,
        "normalize_activations": cfg.normalize_activations,
        "prepend_bos": cfg.prepend_bos,
        "context_size": cfg.context_size,
        "dataset_path": cfg.dataset_path or "",
        "sae_lens_training_version": None,
        "neuronpedia_id": None,
        "model_from_pretrained_kwargs": {},
        "seqpos_slice": [None],
    }
    if topk:
        out["k"] = cfg.k
    for key, v in cfg.extra.items():
        out.setdefault(key, v)
    # only what a read cfg.json said: an SAE trained here never ran a dataset's remote code
    out.setdefault("dataset_trust_remote_code", False)
    return out


# ----------------------------------------------------------------------------------------------------
# directories


def _invalid_sae_config(path: Path) -> str | None:
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "not JSON"
    if not isinstance(cfg, dict) or not {"d_in", "d_sae"} <= set(cfg):
        return "it has no d_in and d_sae"
    return None


OUTPUT = OutputKind("SAE directory", CFG_FILENAME, (CFG_FILENAME, WEIGHTS_FILENAME), invalid=_invalid_sae_config)


def is_sae_dir(path: str | os.PathLike) -> bool:
    """True when ``path`` holds ``cfg.json`` and ``sae_weights.safetensors``."""
    p = Path(path)
    return (p / CFG_FILENAME).is_file() and (p / WEIGHTS_FILENAME).is_file()


def write_sae(sae: SAE, path: str | os.PathLike, *, overwrite: bool = True) -> Path:
    """Write ``sae`` as an SAELens directory (atomically: a failed write leaves no partial directory)."""
    from safetensors.torch import save

    from ..storage import canonical_safetensors

    tensors = {
        name: getattr(sae, name).detach().to("cpu").contiguous() for name in ("W_enc", "b_enc", "W_dec", "b_dec")
    }
    if sae.threshold is not None:
        tensors["threshold"] = sae.threshold.detach().to("cpu").contiguous()
    dt = DTYPES[sae.cfg.dtype]
    tensors = {k: v.to(dt) for k, v in tensors.items()}
    path = Path(path)
    with atomic_directory(path, overwrite=overwrite, output=OUTPUT) as tmp:
        atomic_write_bytes(tmp / WEIGHTS_FILENAME, canonical_safetensors(save(tensors)))
        atomic_write_text(tmp / CFG_FILENAME, json.dumps(config_to_dict(sae.cfg), indent=2) + "\n")
    return path


def resolve_sae_dir(path: str | os.PathLike) -> Path:
    """``path`` itself when it holds ``cfg.json``; the SAE inside it when ``path`` is an ``sae train`` run
    directory (``RUN/sae/cfg.json``), so ``--sae RUN`` and ``--sae RUN/sae`` both work."""
    p = Path(path)
    if not (p / CFG_FILENAME).is_file() and (p / "sae" / CFG_FILENAME).is_file():
        return p / "sae"
    return p


def read_config(path: str | os.PathLike) -> SAEConfig:
    """The :class:`SAEConfig` of an SAELens directory (``cfg.json`` only; an ``sae train`` run directory
    is resolved to its ``sae/``)."""
    p = resolve_sae_dir(path)
    if not p.is_dir():
        raise InputError(
            f"SAE directory {p} does not exist" if not p.exists() else f"{p} is not a directory",
            "pass a directory holding cfg.json and sae_weights.safetensors",
        )
    f = p / CFG_FILENAME
    if not f.is_file():
        raise InputError(f"{p} has no {CFG_FILENAME}", "pass an SAELens SAE directory")
    try:
        d = json.loads(f.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{f} is not valid JSON ({exc})", "re-create the SAE directory") from None
    return config_from_dict(d, where=str(f))


def read_sae(
    path: str | os.PathLike, *, device: str | torch.device | None = None, dtype: torch.dtype | str | None = None
) -> SAE:
    """Load an SAELens directory (or the SAE of an ``sae train`` run directory) into an :class:`SAE`
    (``dtype`` overrides the stored one)."""
    from safetensors import safe_open

    p = resolve_sae_dir(path)
    cfg = read_config(p)
    wf = p / WEIGHTS_FILENAME
    if not wf.is_file():
        raise InputError(f"{p} has no {WEIGHTS_FILENAME}", "pass an SAELens SAE directory")
    try:
        with safe_open(str(wf), framework="pt") as f:
            raw = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (a safetensors handle, not a dict)
    except Exception as exc:  # safetensors raises its own error types
        raise InputError(f"{wf} is not a readable safetensors file ({exc})", "re-create the SAE directory") from None
    if "threshold" not in raw and "log_threshold" in raw:  # SAELens JumpReLU training checkpoints
        raw["threshold"] = raw.pop("log_threshold").exp()
    if "scaling_factor" in raw:
        sf = raw.pop("scaling_factor")
        if not torch.all(sf == 1):
            raise ConfigError(f"{wf} holds a non-trivial scaling_factor", "fold it into the weights first")
    needed = ["W_enc", "b_enc", "W_dec", "b_dec"] + (["threshold"] if cfg.architecture == "jumprelu" else [])
    missing = [k for k in needed if k not in raw]
    if missing:
        raise InputError(
            f"{wf} lacks {', '.join(missing)} (has {', '.join(sorted(raw)) or 'nothing'})",
            f"a {cfg.architecture} SAE needs {', '.join(needed)}",
        )
    sizes = {"d_in": cfg.d_in, "d_sae": cfg.d_sae}
    for k in needed:
        want = tuple(sizes[s] for s in WEIGHT_SHAPES[k])
        if tuple(raw[k].shape) != want:
            raise CompatibilityError(
                f"{wf}: {k} has shape {tuple(raw[k].shape)} but cfg.json implies {want}",
                "the weights and cfg.json do not belong together",
            )
    if dtype is not None:
        cfg.dtype = dtype_name(dtype)
    sae = SAE(cfg).requires_grad_(False)
    with torch.no_grad():
        for k in needed:
            getattr(sae, k).copy_(raw[k].to(sae.dtype))
    if device is not None:
        sae = sae.to(device)
        cfg.device = str(device)
    return sae
