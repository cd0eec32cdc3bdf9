"""Checkpoint grids: walk a list of model checkpoints one at a time (e.g. Pythia's, arXiv 2601.19208).

:class:`CheckpointGrid` takes checkpoint *specs* and yields ``(label, adapter)`` pairs, loading **one**
checkpoint at a time and dropping it (``del`` + ``gc.collect()``, and the CUDA cache when there is one)
before the next is loaded.  A spec is

* a local path (a file such as ``step-000004.safetensors`` / ``stories260K.bin``, or a directory), or
* a hub revision ``hf:ORG/NAME@REVISION`` (e.g. ``hf:EleutherAI/pythia-1.4b-deduped@step4``);

the label is the revision, or the file/directory name with a ``step…`` number normalised to ``stepN``.
:func:`log_spaced_steps` / :func:`pythia_revisions` give Pythia's log-spaced pattern 1, 2, 4, …, 512.

Integrity: every checkpoint's weights are hashed (sha256 over sorted names, dtypes,
shapes and raw bytes, tensor by tensor); two checkpoints with identical weights are reported with a
warning and recorded in :attr:`CheckpointGrid.duplicates` (several public Pythia early-step branches
serve identical weights).  A missing directory/file is detected before anything is loaded; a revision
the loader cannot fetch is detected when its turn comes.  Either way the checkpoint is named and the
grid stops (``on_missing="stop"``, an :class:`~originlens.errors.InputError`) or skips it and records it
in :attr:`CheckpointGrid.skipped` (``"skip"``).

Loading: ``loader(spec) -> LMAdapter`` receives the spec string exactly as given.  The default,
:func:`default_loader`, reads our GPT files (safetensors of kind ``"gpt"`` or ``ntp train`` checkpoints of
kind ``"ntp-checkpoint"``, via :func:`load_gpt_adapter`) itself and hands everything else to ``originlens.lm.loading.load_adapter`` (imported lazily), falling
back to the llama2.c format registry when that function is not available.

Caveat: with plain iteration the caller's loop variable still references the previous adapter while the
next one loads (two models briefly in memory); :meth:`CheckpointGrid.map` holds exactly one.
"""

from __future__ import annotations

import gc
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputError, OriginlensError
from ..progress import log

ON_MISSING = ("stop", "skip")
_STEP_RE = re.compile(r"(?:^|[^a-z])step[-_]?0*(\d+)", re.IGNORECASE)
_CKPT_SUFFIXES = (".safetensors", ".bin")


# ----------------------------------------------------------------------------------------------------
# specs


@dataclass(frozen=True)
class CheckpointSpec:
    """One checkpoint: ``spec`` as given, its ``label``, and how to find it.

    ``kind`` is ``"path"`` (``path`` set) or ``"hub"`` (``repo`` and ``revision`` set).
    """

    spec: str
    label: str
    kind: str
    path: Path | None = None
    repo: str | None = None
    revision: str | None = None

    @property
    def step(self) -> int | None:
        """Training step parsed from the label (``step128`` → 128), if any."""
        m = _STEP_RE.search(self.label)
        return int(m.group(1)) if m else None


def _label_from_name(name: str) -> str:
    stem = name
    for suf in _CKPT_SUFFIXES:
        if stem.endswith(suf):
            stem = stem[: -len(suf)]
    m = _STEP_RE.search(stem)
    return f"step{int(m.group(1))}" if m else stem


def parse_spec(spec: str | Path) -> CheckpointSpec:
    """A :class:`CheckpointSpec` from ``hf:ORG/NAME@REVISION`` or a local path (not checked here)."""
    s = str(spec)
    if not s.strip():
        raise ConfigError("empty checkpoint spec", "give a path or hf:ORG/NAME@REVISION")
    if s.startswith("hf:"):
        body = s[3:]
        repo, _, rev = body.partition("@")
        if not repo or "@" in rev:
            raise ConfigError(f"bad hub checkpoint spec {s!r}", "use hf:ORG/NAME or hf:ORG/NAME@REVISION")
        return CheckpointSpec(s, rev or repo, "hub", repo=repo, revision=rev or None)
    p = Path(s)
    return CheckpointSpec(s, _label_from_name(p.name), "path", path=p)


def log_spaced_steps(max_step: int = 512, *, include_zero: bool = False) -> list[int]:
    """``[1, 2, 4, …]`` up to ``max_step`` (powers of two; ``0`` first with ``include_zero``)."""
    if int(max_step) < 1:
        raise ConfigError(f"max_step must be ≥ 1 (got {max_step})", "e.g. 512")
    out = [0] if include_zero else []
    s = 1
    while s <= max_step:
        out.append(s)
        s *= 2
    return out


def pythia_revisions(max_step: int = 512, repo: str | None = None, *, include_zero: bool = False) -> list[str]:
    """Pythia's early log-spaced revisions ``step1, step2, step4, …`` (``hf:REPO@stepN`` with ``repo``)."""
    revs = [f"step{s}" for s in log_spaced_steps(max_step, include_zero=include_zero)]
    return [f"hf:{repo}@{r}" for r in revs] if repo else revs


def checkpoints_in_dir(directory: str | Path) -> list[str]:
    """Checkpoint files/directories in ``directory`` (``*.safetensors``, ``*.bin``, sub-directories),
    ordered by the step number in their name (names without one last, alphabetically)."""
    d = Path(directory)
    if not d.is_dir():
        raise InputError(
            f"checkpoint directory {d} does not exist" if not d.exists() else f"{d} is not a directory",
            "pass a directory holding checkpoint files",
        )
    entries = [p for p in d.iterdir() if not p.name.startswith(".") and (p.is_dir() or p.suffix in _CKPT_SUFFIXES)]
    if not entries:
        raise InputError(
            f"no checkpoints (*.safetensors, *.bin or sub-directories) in {d}",
            "point --checkpoint-dir at the folder holding the checkpoint files",
        )

    def key(p: Path) -> tuple[int, int, str]:
        step = parse_spec(p).step
        return (0, step, p.name) if step is not None else (1, 0, p.name)

    return [str(p) for p in sorted(entries, key=key)]


# ----------------------------------------------------------------------------------------------------
# hashing


def weights_hash(tensors: Mapping[str, Any]) -> str:
    """sha256 over the sorted tensor names, dtypes, shapes and raw bytes (streamed tensor by tensor).

    Each tensor contributes ``"name|dtype|shape|"`` (dtype as numpy names it, e.g. ``float32``) and its
    bytes, so torch tensors and numpy arrays with the same contents hash alike.
    """
    import numpy as np
    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        if isinstance(t, torch.Tensor):
            t = t.detach()
            h.update(f"{name}|{str(t.dtype).removeprefix('torch.')}|{tuple(t.shape)}|".encode())
            raw = t.to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        else:
            a = np.ascontiguousarray(t)
            h.update(f"{name}|{a.dtype}|{tuple(int(n) for n in a.shape)}|".encode())
            raw = a.reshape(-1).view(np.uint8)
        h.update(raw.data)
    return h.hexdigest()


def adapter_hash(adapter: Any) -> str:
    """:func:`weights_hash` of ``adapter.named_tensors()``."""
    return weights_hash(adapter.named_tensors())


# ----------------------------------------------------------------------------------------------------
# loaders


def load_gpt_adapter(path: str | Path) -> Any:
    """A :class:`~originlens.lm.native.GPTAdapter` for a file written by ``GPT.save`` (kind ``"gpt"``) or a
    checkpoint of ``originlens ntp train`` (kind ``"ntp-checkpoint"``: its ``model.*`` weights).

    The metadata keys ``bos_id`` and ``vocab_hash`` (when saved) become ``adapter.bos_id`` and
    ``adapter.vocab_hash`` (used to check that a corpus uses the model's tokenizer).
    """
    import torch

    from ..errors import CompatibilityError
    from ..models.gpt import GPT, GPTConfig
    from ..storage import load_tensors
    from .native import GPTAdapter

    path = Path(path)
    meta = _safetensors_metadata(path) or {}
    if meta.get("kind") == "ntp-checkpoint":
        arrays, meta = load_tensors(path, kind="ntp-checkpoint")
        if "gpt_config" not in meta:
            raise CompatibilityError(f"{path} has no GPT config in its metadata", "pass a checkpoint of ntp train")
        state = {k[len("model.") :]: torch.from_numpy(v.copy()) for k, v in arrays.items() if k.startswith("model.")}
        model = GPT.from_state_dict(state, GPTConfig.from_dict(json.loads(meta["gpt_config"])))
    else:
        model = GPT.load(path)
    model.eval()
    bos = _meta_value(meta.get("bos_id"))
    adapter: Any = GPTAdapter(model, bos_id=None if bos is None else int(bos))  # gets a vocab_hash attribute
    vh = meta.get("vocab_hash")  # a string, possibly JSON-quoted; never parsed as a number ("1234e567")
    if vh in ("null", ""):  # written as JSON null: no hash recorded
        vh = None
    elif vh is not None and vh.startswith('"'):
        vh = json.loads(vh)
    adapter.vocab_hash = None if vh is None else str(vh)
    return adapter


def _meta_value(raw: str | None) -> Any:
    """A safetensors metadata value: JSON when it parses (``"3"``, ``"null"``), else the raw string."""
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _safetensors_metadata(path: Path) -> dict[str, str] | None:
    """The string metadata of a safetensors file (header only), or None when it is not one."""
    if not (path.is_file() and path.suffix == ".safetensors"):
        return None
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            return dict(f.metadata() or {})
    except Exception:  # not a readable safetensors file: let the other loaders report it
        return None


def default_loader(spec: str) -> Any:
    """Load one checkpoint spec as an :class:`~originlens.lm.adapter.LMAdapter` (see module docstring)."""
    p = Path(spec)
    if not spec.startswith("hf:") and (_safetensors_metadata(p) or {}).get("kind") in ("gpt", "ntp-checkpoint"):
        return load_gpt_adapter(p)
    load_adapter: Callable[[str], Any] | None
    try:
        from .loading import load_adapter  # added by the adapter loading work; imported lazily
    except ImportError:
        load_adapter = None
    if load_adapter is not None:
        return load_adapter(spec)
    if spec.startswith("hf:"):
        raise InputError(
            f"cannot load {spec}: this installation has no Hugging Face loader",
            "use local checkpoints, or install a version of originlens with lm.loading.load_adapter",
        )
    from .llama2c import Llama2cModel
    from .loading import load_model
    from .native import Llama2cAdapter

    model = load_model(p)
    if isinstance(model, Llama2cModel):
        return Llama2cAdapter(model)
    raise InputError(f"no adapter for the model at {spec}", "pass a GPT .safetensors or a llama2.c .bin")


# ----------------------------------------------------------------------------------------------------
# the grid


@dataclass
class Duplicate:
    """Checkpoint ``label`` has exactly the weights of the earlier checkpoint ``same_as``."""

    label: str
    same_as: str
    sha256: str


@dataclass
class Skipped:
    """A checkpoint that was not available (``reason`` says why)."""

    label: str
    spec: str
    reason: str


def _free() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass


@dataclass
class CheckpointGrid:
    """Iterate checkpoints one at a time: ``for label, adapter in CheckpointGrid(specs): ...``.

    ``specs``: paths and/or ``hf:ID@REVISION`` strings (labels must be distinct); ``loader``: spec string
    → adapter (default :func:`default_loader`); ``on_missing``: ``"stop"`` or ``"skip"``; ``hash_weights``:
    hash every checkpoint to detect duplicates.  After (or during) iteration, :attr:`hashes`,
    :attr:`duplicates` and :attr:`skipped` describe what was seen; :meth:`summary` is JSON-able.
    """

    specs: Sequence[str | Path]
    loader: Callable[[str], Any] | None = None
    on_missing: str = "stop"
    hash_weights: bool = True
    hashes: dict[str, str] = field(default_factory=dict, init=False)
    commits: dict[str, str] = field(default_factory=dict, init=False)  # label → resolved hub commit
    duplicates: list[Duplicate] = field(default_factory=list, init=False)
    skipped: list[Skipped] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if self.on_missing not in ON_MISSING:
            raise ConfigError(f"unknown on_missing={self.on_missing!r}", "use 'stop' or 'skip'")
        if not len(self.specs):
            raise ConfigError("no checkpoints given", "pass at least one checkpoint spec")
        self.parsed = [parse_spec(s) for s in self.specs]
        seen: dict[str, str] = {}
        for p in self.parsed:
            if p.label in seen:
                raise ConfigError(
                    f"checkpoints {seen[p.label]!r} and {p.spec!r} have the same label {p.label!r}",
                    "give each checkpoint a distinct name or revision",
                )
            seen[p.label] = p.spec

    @property
    def labels(self) -> list[str]:
        return [p.label for p in self.parsed]

    def __len__(self) -> int:
        return len(self.parsed)

    def missing(self) -> list[CheckpointSpec]:
        """Local specs whose file/directory does not exist (hub revisions are checked when loaded)."""
        return [p for p in self.parsed if p.kind == "path" and not p.path.exists()]  # type: ignore[union-attr]

    def _unavailable(self, p: CheckpointSpec, reason: str) -> None:
        if self.on_missing == "stop":
            raise InputError(
                f"checkpoint {p.label!r} ({p.spec}) is not available: {reason}",
                "fix or remove it, or pass on_missing='skip' (CLI: --on-missing skip)",
            )
        log(f"warning: skipping checkpoint {p.label!r} ({p.spec}): {reason}")
        self.skipped.append(Skipped(p.label, p.spec, reason))

    def _load(self, p: CheckpointSpec) -> Any | None:
        loader = self.loader or default_loader
        try:
            return loader(p.spec)
        except (OriginlensError, OSError) as exc:
            self._unavailable(p, getattr(exc, "what", None) or str(exc))
            return None

    def _record_hash(self, label: str, adapter: Any) -> None:
        if not self.hash_weights:
            return
        digest = adapter_hash(adapter)
        for other, h in self.hashes.items():
            if h == digest:
                log(
                    f"warning: checkpoint {label!r} has exactly the weights of {other!r} "
                    f"(sha256 {digest[:12]}…): a duplicated or mislabelled checkpoint"
                )
                self.duplicates.append(Duplicate(label, other, digest))
                break
        self.hashes[label] = digest

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        self.hashes, self.commits, self.duplicates, self.skipped = {}, {}, [], []
        absent = {p.spec for p in self.missing()}
        if absent and self.on_missing == "stop":
            names = ", ".join(sorted(absent))
            raise InputError(
                f"checkpoint path(s) not found: {names}",
                "fix the paths, or pass on_missing='skip' (CLI: --on-missing skip)",
            )
        for p in self.parsed:
            if p.spec in absent:
                self._unavailable(p, "no such file or directory")
                continue
            adapter = self._load(p)
            if adapter is None:
                continue
            self._record_hash(p.label, adapter)
            if getattr(adapter, "commit", None):
                self.commits[p.label] = str(adapter.commit)
            yield p.label, adapter
            del adapter
            _free()

    def map(self, fn: Callable[[str, Any], Any]) -> dict[str, Any]:
        """``{label: fn(label, adapter)}``, holding exactly one loaded checkpoint at a time."""
        out: dict[str, Any] = {}
        it = iter(self)
        while True:
            try:
                label, adapter = next(it)
            except StopIteration:
                break
            out[label] = fn(label, adapter)
            del adapter
        return out

    def summary(self) -> dict[str, Any]:
        """JSON-able record: specs, labels, weight hashes, resolved hub commits, duplicates and skipped checkpoints."""
        return {
            "specs": [p.spec for p in self.parsed],
            "labels": self.labels,
            "on_missing": self.on_missing,
            "hashes": dict(self.hashes),
            "commits": dict(self.commits),
            "duplicates": [vars(d) for d in self.duplicates],
            "skipped": [vars(s) for s in self.skipped],
        }
