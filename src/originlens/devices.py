"""Devices, named once: ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (CUDA when torch sees one, else the CPU).

:func:`check_device_spec` validates the *name* without importing torch (argparse types, config
validation: ``--help`` stays fast); :func:`resolve_device` turns a name into a ``torch.device`` and
raises one :class:`~originlens.errors.ConfigError` when CUDA is asked for but unavailable (a CPU-only
torch build, no GPU, or N out of range).  Every command and config that takes a device uses these two.

Model dtypes likewise: :func:`check_dtype_spec` (the name) and :func:`resolve_dtype` (a ``torch.dtype``, or
None for ``auto``: the checkpoint's stored dtype).
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from .errors import ConfigError

SPECS = "cpu | cuda | cuda:N | auto"
_RE = re.compile(r"cpu|auto|cuda(?::\d+)?")


def check_device_spec(spec: Any) -> str:
    """The normalised name (lower case, stripped) of a valid device spec; :class:`ConfigError` otherwise."""
    name = "cpu" if spec is None else str(spec).strip().lower()
    if not _RE.fullmatch(name):
        raise ConfigError(f"unknown device {spec!r}", f"use one of: {SPECS}")
    return name


def device_arg(s: str) -> str:
    """argparse type of ``--device`` (the name only; availability is checked when the command runs)."""
    try:
        return check_device_spec(s)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.what) from None


def resolve_device(spec: Any) -> Any:
    """``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"auto"`` or a ``torch.device`` → ``torch.device``.

    Raises :class:`~originlens.errors.ConfigError` for an unknown name or when CUDA is requested but
    torch sees no CUDA device (CPU-only build, no GPU, or N out of range)."""
    import torch

    if isinstance(spec, torch.device):
        spec = str(spec)
    name = check_device_spec(spec)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        why = "this torch build has no CUDA support" if torch.version.cuda is None else "no CUDA device is visible"
        raise ConfigError(
            f"device '{spec}' requested but CUDA is unavailable ({why})",
            "use --device cpu (or auto, which falls back to the CPU)",
        )
    idx = int(name.partition(":")[2] or 0)
    if idx >= torch.cuda.device_count():
        raise ConfigError(
            f"device '{spec}' requested but only {torch.cuda.device_count()} CUDA device(s) exist",
            f"use cuda:0 … cuda:{torch.cuda.device_count() - 1}",
        )
    return torch.device(f"cuda:{idx}")


DTYPE_SPECS = ("float32", "float64", "bfloat16", "float16", "auto")


def check_dtype_spec(spec: Any) -> str:
    """The normalised name of a model dtype (``float32``, ``float64``, ``bfloat16``, ``float16`` or ``auto``:
    as stored in the checkpoint); :class:`ConfigError` otherwise."""
    name = str(spec).strip().lower().replace("torch.", "")
    name = {"fp32": "float32", "fp64": "float64", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}.get(
        name, name
    )
    if name not in DTYPE_SPECS:
        raise ConfigError(f"unknown dtype {spec!r}", f"use one of: {', '.join(DTYPE_SPECS)}")
    return name


def dtype_arg(s: str) -> str:
    """argparse type of ``--dtype``."""
    try:
        return check_dtype_spec(s)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.what) from None


def resolve_dtype(spec: Any) -> Any:
    """A dtype name or ``torch.dtype`` → ``torch.dtype``; None for ``auto`` (keep the stored dtype)."""
    import torch

    if isinstance(spec, torch.dtype):
        return spec
    name = check_dtype_spec(spec)
    return None if name == "auto" else getattr(torch, name)


MATMUL_PRECISIONS = ("highest", "tf32")
DETERMINISTIC_ENV = "ORIGINLENS_CUDA_DETERMINISTIC"


def configure_device(device: Any, matmul_precision: str = "highest") -> dict[str, Any]:
    """Process-wide kernel settings for training or replaying on ``device``; returns what was set (recorded
    in a run's ``environment.json``).  A no-op on the CPU (``matmul_precision`` is validated only).

    On CUDA: deterministic kernels (``torch.use_deterministic_algorithms``, cuBLAS's fixed workspace), so
    that a run's attribution replay repeats its updates bit for bit on the same GPU and software, unless the
    environment sets ``ORIGINLENS_CUDA_DETERMINISTIC=0``; and float32 matrix products in TF32 (10-bit
    mantissa inputs, float32 accumulation and storage) when ``matmul_precision`` is ``"tf32"``.  Both are
    process-wide torch flags: they stay set until the next configuration, which sets both again."""
    import os

    import torch

    check_matmul_precision(matmul_precision)
    if torch.device(device).type != "cuda":
        return {}  # TF32 and these kernels are CUDA's; CPU products are float32 throughout
    deterministic = os.environ.get(DETERMINISTIC_ENV, "1") != "0"
    if deterministic:
        # read when cuBLAS creates its handle: set before the first product of the process
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    _set_kernel_flags(deterministic, matmul_precision == "tf32")
    return {"deterministic": deterministic, "matmul_precision": matmul_precision}


def _set_kernel_flags(deterministic: bool, tf32: bool) -> None:
    """torch's process-wide flags, set both ways (a second configuration in one process, e.g. a run with
    ``ORIGINLENS_CUDA_DETERMINISTIC=0`` after one without, must not inherit the first's)."""
    import torch

    torch.use_deterministic_algorithms(deterministic)
    # deterministic mode also fills every new allocation with NaN (a kernel per tensor); nothing here
    # reads memory before writing it, so that guard is dropped
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def check_matmul_precision(spec: Any) -> str:
    """``"highest"`` (float32 products in float32) or ``"tf32"``; :class:`ConfigError` otherwise."""
    name = str(spec).strip().lower()
    if name not in MATMUL_PRECISIONS:
        raise ConfigError(f"unknown matmul precision {spec!r}", f"use one of: {', '.join(MATMUL_PRECISIONS)}")
    return name
