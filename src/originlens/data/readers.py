"""Streaming document readers: text, JSON/JSONL, Parquet, directories, Hugging Face datasets.

:func:`iter_documents` turns a *source* into an iterator of document strings with memory bounded by
the largest document (plus a 1 MiB read buffer):

* plain text (``.txt``, ``.text``, any unknown extension): one document per line (``split_mode="line"``),
  documents separated by blank lines (``"blank"``) or by ``<|endoftext|>`` (``"eot"``); ``"auto"`` picks
  ``"eot"`` when the marker occurs in the first MiB of the file, else ``"line"``;
* JSON (``.json``): a list of objects or of strings, streamed element by element; a ``.json`` file that
  starts with ``{`` is read as a sequence of objects (JSON Lines saved under ``.json``, as
  ``datasets.Dataset.to_json`` does);
* JSON Lines (``.jsonl``, ``.ndjson``); ``.gz`` versions of text/JSON/JSONL files are decompressed;
* Parquet (``.parquet``) and Arrow (``.arrow``, as ``datasets`` writes): one string column
  (:mod:`.columnar`);
* a directory: every file above, recursively, sorted by relative path; hidden entries and nested
  originlens corpus directories are skipped; a directory written by ``datasets``' ``save_to_disk``
  stands for its Arrow shards (a ``DatasetDict`` is refused with a line naming its splits);
* ``hf:NAME[/CONFIG][@REVISION][:SPLIT]``: a Hugging Face dataset through the optional ``datasets``
  package (streaming; :func:`parse_hf`), recorded with the commit its revision resolved to.

Objects take the field ``text_field`` if given, else ``text``, else ``story``; ``null`` values are
skipped. Documents that are empty or whitespace-only are skipped everywhere. ``split_mode`` applies to
plain text only. Invalid UTF-8 stops with the file and byte offset (offsets count *decompressed*
bytes for ``.gz``) unless ``errors="replace"``; a file read as text whose first MiB holds a NUL byte is
refused as binary.
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..errors import ConfigError, InputError
from ..storage import sha256_file
from .columnar import is_saved_dataset, iter_arrow, iter_parquet, refuse_dataset_dict, saved_dataset_files
from .store import is_corpus_dir

EOT_MARKER = "<|endoftext|>"
SPLIT_MODES = ("auto", "line", "blank", "eot")
ERROR_MODES = ("strict", "replace")
TEXT_EXTS = (".txt", ".text")
JSON_EXTS = (".json",)
JSONL_EXTS = (".jsonl", ".ndjson")
PARQUET_EXTS = (".parquet",)
ARROW_EXTS = (".arrow",)
KNOWN_EXTS = TEXT_EXTS + JSON_EXTS + JSONL_EXTS + PARQUET_EXTS + ARROW_EXTS
DEFAULT_FIELDS = ("text", "story")
HF_PREFIX = "hf:"
_CHUNK = 1 << 20

Source = str | os.PathLike


# --------------------------------------------------------------------------------------- entry points


def iter_documents(
    source: Source | Iterable[Source],
    *,
    text_field: str | None = None,
    split_mode: str = "auto",
    errors: str = "strict",
) -> Iterator[str]:
    """Iterate over the documents of ``source`` (a path, a directory, ``hf:NAME[/CONFIG][@REV][:SPLIT]``, or a list).

    Path problems raise :class:`InputError` immediately; decoding problems when reached. A source that
    yields no document at all raises ``InputError`` at the end of the iteration.
    """
    if split_mode not in SPLIT_MODES:
        raise ConfigError(f"unknown split mode {split_mode!r}", f"use one of {', '.join(SPLIT_MODES)}")
    if errors not in ERROR_MODES:
        raise ConfigError(f"unknown encoding-error mode {errors!r}", "use 'strict' or 'replace'")
    sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not sources:
        raise InputError("no corpus source given", "pass a file, a directory or hf:NAME")
    plans = [_plan(s, text_field) for s in sources]  # validates every path up front
    return _iterate(plans, sources, text_field, split_mode, errors)


def source_files(source: Source) -> list[Path]:
    """The files a local source stands for (a file, or the readable files below a directory)."""
    p = Path(source)
    if not p.exists():
        raise InputError(
            f"corpus source {p} does not exist", "check the path (or use hf:NAME for a Hugging Face dataset)"
        )
    if p.is_dir():
        refuse_dataset_dict(p)
        files = saved_dataset_files(p) if is_saved_dataset(p) else _walk(p)
        if not files:
            raise InputError(
                f"directory {p} holds no corpus files ({', '.join(KNOWN_EXTS)}, or .gz)",
                "point at a directory of .txt/.json/.jsonl/.parquet files",
            )
        return files
    return [p]


def source_fingerprint(source: Source | Iterable[Source]) -> list[dict[str, Any]]:
    """Per file: ``{"path", "bytes", "sha256"}`` (for ``hf:`` sources bytes and sha256 are ``None``).

    Caveat: hashing reads every file once more.
    """
    sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    out: list[dict[str, Any]] = []
    for s in sources:
        if isinstance(s, str) and s.startswith(HF_PREFIX):
            ds = parse_hf(s)
            out.append(
                {
                    "path": ds.spec,
                    "bytes": None,
                    "sha256": None,
                    "name": ds.name,
                    "config": ds.config,
                    "revision": ds.revision,
                    "split": ds.split,
                    "resolved_commit": dataset_commit(ds.name, ds.revision),
                }
            )
            continue
        for f in source_files(s):
            out.append({"path": str(f), "bytes": f.stat().st_size, "sha256": sha256_file(f)})
    return out


@dataclass(frozen=True)
class HFDataset:
    """A Hugging Face dataset source: ``name`` (``ORG/NAME`` or ``NAME``), ``config`` (the dataset's
    configuration / subset, e.g. ``sample-10BT``), ``revision`` (branch, tag or commit) and ``split``."""

    name: str
    config: str | None
    revision: str | None
    split: str

    @property
    def spec(self) -> str:
        return (
            f"{HF_PREFIX}{self.name}"
            + (f"/{self.config}" if self.config else "")
            + (f"@{self.revision}" if self.revision else "")
            + f":{self.split}"
        )


_HF_PART = r"[A-Za-z0-9][\w.-]*"


def parse_hf(spec: str) -> HFDataset:
    """``"hf:NAME[/CONFIG][@REVISION][:SPLIT]"`` → :class:`HFDataset` (SPLIT defaults to ``"train"``).

    NAME is ``ORG/NAME`` (or a bare NAME); a third path component is the configuration, so
    ``hf:HuggingFaceFW/fineweb/sample-10BT`` is FineWeb's ``sample-10BT`` (a bare NAME cannot take a
    configuration this way: write its canonical ``ORG/NAME``)."""
    fix = (
        "write hf:NAME[/CONFIG][@REVISION][:SPLIT], e.g. hf:roneneldan/TinyStories:train or "
        "hf:HuggingFaceFW/fineweb/sample-10BT@main:train"
    )
    rest = spec[len(HF_PREFIX) :]
    body, _, split = rest.partition(":")
    body, _, revision = body.partition("@")
    parts = body.split("/")
    if (
        not body
        or len(parts) > 3
        or not all(re.fullmatch(_HF_PART, x) for x in parts)
        or (split and not re.fullmatch(r"[\w.\[\]%:+-]+", split))
        or ("@" in rest and not revision)
    ):
        raise ConfigError(f"bad Hugging Face source {spec!r}", fix)
    name, config = ("/".join(parts[:2]), parts[2]) if len(parts) == 3 else (body, None)
    return HFDataset(name, config, revision or None, split or "train")


def dataset_commit(name: str, revision: str | None) -> str | None:
    """The commit ``revision`` (default ``main``) of dataset ``name`` resolves to in the local hub cache
    (``datasets--ORG--NAME/refs/REVISION``; a 40-hex revision is its own commit); None when unknown."""
    if revision and re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision
    try:
        from huggingface_hub import constants
    except ImportError:
        return None
    ref = Path(constants.HF_HUB_CACHE) / f"datasets--{name.replace('/', '--')}" / "refs" / (revision or "main")
    try:
        sha = ref.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return sha if re.fullmatch(r"[0-9a-f]{40}", sha) else None


# --------------------------------------------------------------------------------------- planning


def _plan(source: Source, text_field: str | None) -> tuple[str, Any]:
    if isinstance(source, str) and source.startswith(HF_PREFIX):
        return ("hf", parse_hf(source))
    return ("files", source_files(source))


def _iterate(plans, sources, text_field, split_mode, errors) -> Iterator[str]:
    n = 0
    for kind, arg in plans:
        docs = (
            _iter_hf(arg, text_field)
            if kind == "hf"
            else (d for f in arg for d in _iter_file(f, text_field, split_mode, errors))
        )
        for d in docs:
            if d is not None and d.strip():
                n += 1
                yield d
    if n == 0:
        names = ", ".join(str(s) for s in sources)
        raise InputError(
            f"empty corpus: no non-empty document in {names}", "check the files (and --text-field / --split-mode)"
        )


def _walk(root: Path) -> list[Path]:
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        refuse_dataset_dict(d)
        if is_saved_dataset(d):  # datasets' save_to_disk: its shards, not its JSON metadata
            out += saved_dataset_files(d)
            dirnames[:] = []
            continue
        dirnames[:] = sorted(x for x in dirnames if not x.startswith(".") and not is_corpus_dir(d / x))
        for name in filenames:
            if not name.startswith(".") and _kind(Path(name), strict=True) is not None:
                out.append(d / name)
    return sorted(out, key=lambda p: p.relative_to(root).parts)


def _kind(p: Path, strict: bool = False) -> str | None:
    """'text' | 'json' | 'jsonl' | 'parquet' | 'arrow' (None for unknown extensions when ``strict``)."""
    name = p.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
        if name.endswith(PARQUET_EXTS + ARROW_EXTS):
            return None if strict else "text"
    kinds = ((TEXT_EXTS, "text"), (JSON_EXTS, "json"), (JSONL_EXTS, "jsonl"), (PARQUET_EXTS, "parquet"))
    for exts, kind in (*kinds, (ARROW_EXTS, "arrow")):
        if name.endswith(exts):
            return kind
    return None if strict else "text"


# --------------------------------------------------------------------------------------- files


def _iter_file(path: Path, text_field, split_mode, errors) -> Iterator[str | None]:
    kind = _kind(path)
    if kind in ("parquet", "arrow"):
        yield from (iter_parquet if kind == "parquet" else iter_arrow)(path, text_field)
        return
    try:
        f = gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}", "check the path and permissions") from None
    with f:
        try:
            if kind == "text":
                mode = split_mode
                if mode == "auto":
                    head = f.read(_CHUNK + len(EOT_MARKER))
                    mode = "eot" if EOT_MARKER.encode() in head else "line"
                    f.seek(0)
                yield from _iter_text(_decoded_chunks(f, path, errors), mode)
            elif kind == "jsonl":
                yield from _iter_jsonl(_decoded_chunks(f, path, errors), path, text_field)
            else:
                yield from _iter_json(_decoded_chunks(f, path, errors), path, text_field)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise InputError(f"cannot read {path}: {exc}", "check that the file is complete") from None


class _ByteReader(Protocol):
    """A binary file open for reading (a plain or a gzip file)."""

    def read(self, size: int, /) -> bytes: ...


def _decoded_chunks(f: _ByteReader, path: Path, errors: str) -> Iterator[str]:
    """UTF-8 text of ``f`` in ~1 MiB pieces; strict errors name the file and absolute byte offset."""
    dec = codecs.getincrementaldecoder("utf-8")(errors=errors)
    fed = 0
    first = True
    while True:
        b = f.read(_CHUNK)
        if first and b"\x00" in b:
            raise InputError(
                f"{path} is a binary file (it holds NUL bytes), not UTF-8 text",
                "pass text, JSON/JSONL, Parquet or Arrow files, or a directory written by datasets' save_to_disk",
            )
        pending = len(dec.getstate()[0])
        try:
            text = dec.decode(b, final=not b)
        except UnicodeDecodeError as exc:
            off = fed - pending + exc.start
            raise InputError(
                f"{path} is not valid UTF-8 (invalid byte 0x{exc.object[exc.start]:02x} at byte offset {off})",
                "re-encode the file as UTF-8, or pass --encoding-errors replace (errors='replace')",
            ) from None
        fed += len(b)
        if first and text.startswith("\ufeff"):
            text = text[1:]  # byte-order mark
        first = False
        if text:
            yield text
        if not b:
            return


def _split(chunks: Iterable[str], sep: str) -> Iterator[str]:
    """Pieces of the concatenated ``chunks`` between occurrences of ``sep`` (last piece included)."""
    buf = ""
    for chunk in chunks:
        start_search = max(0, len(buf) - len(sep) + 1)
        buf += chunk
        pos = buf.find(sep, start_search)
        if pos < 0:
            continue
        parts = buf.split(sep)
        buf = parts.pop()
        yield from parts
    yield buf


def _iter_text(chunks: Iterable[str], mode: str) -> Iterator[str]:
    if mode == "eot":
        for piece in _split(chunks, EOT_MARKER):
            piece = piece.strip()
            if piece:
                yield piece
        return
    lines = (ln[:-1] if ln.endswith("\r") else ln for ln in _split(chunks, "\n"))
    if mode == "line":
        for ln in lines:
            if ln.strip():
                yield ln
        return
    block: list[str] = []  # "blank"
    for ln in lines:
        if ln.strip():
            block.append(ln)
        elif block:
            yield "\n".join(block)
            block = []
    if block:
        yield "\n".join(block)


def _field(obj: Any, path: Path, where: str, text_field: str | None) -> str | None:
    if isinstance(obj, str):
        return obj
    if not isinstance(obj, dict):
        raise InputError(
            f"{path}: {where} is a {type(obj).__name__}, expected an object or a string",
            "use a list of objects with a 'text' field (or of strings), or JSON Lines",
        )
    names = (text_field,) if text_field else DEFAULT_FIELDS
    for name in names:
        if name in obj:
            val = obj[name]
            if val is None or isinstance(val, str):
                return val
            raise InputError(
                f"{path}: {where} field {name!r} is a {type(val).__name__}, not a string",
                "pass --text-field naming a string field",
            )
    keys = ", ".join(repr(k) for k in list(obj)[:10])
    wanted = repr(text_field) if text_field else "'text' or 'story'"
    raise InputError(
        f"{path}: {where} has no field {wanted} (fields: {keys})",
        "pass --text-field (text_field=) naming the field that holds the text",
    )


def _iter_jsonl(chunks: Iterable[str], path: Path, text_field) -> Iterator[str | None]:
    for i, ln in enumerate(_split(chunks, "\n"), 1):
        if not ln.strip():
            continue
        try:
            obj = json.loads(ln)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"{path}: line {i} is not valid JSON ({exc.msg} at column {exc.colno})",
                "fix the line, or check that the file is JSON Lines",
            ) from None
        yield _field(obj, path, f"line {i}", text_field)


def _iter_json(chunks: Iterable[str], path: Path, text_field) -> Iterator[str | None]:
    """Stream a top-level JSON array element by element (or a sequence of top-level objects)."""
    dec = json.JSONDecoder()
    it = iter(chunks)
    buf, pos, eof = "", 0, False

    def more() -> bool:
        nonlocal buf, pos, eof
        if eof:
            return False
        nxt = next(it, None)
        if nxt is None:
            eof = True
            return False
        buf = buf[pos:] + nxt
        pos = 0
        return True

    def skip_ws() -> str:
        nonlocal pos
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n":
                pos += 1
            if pos < len(buf):
                return buf[pos]
            if not more():
                return ""

    def bad(msg: str) -> InputError:
        return InputError(
            f"{path} is not valid JSON ({msg})", "expected a list of objects/strings or JSON Lines; check the file"
        )

    first = skip_ws()
    if first == "":
        return
    array = first == "["
    if array:
        pos += 1
    elif first != "{":
        raise bad(f"starts with {first!r}")
    index = 0
    while True:
        c = skip_ws()
        if array and c == "]":
            pos += 1
            if skip_ws() != "":
                raise bad("data after the closing ']'")
            return
        if c == "":
            if array:
                raise bad("unterminated list")
            return
        if array and index > 0:
            if c != ",":
                raise bad(f"expected ',' between elements, found {c!r}")
            pos += 1
            skip_ws()
        while True:
            err = None
            try:
                obj, end = dec.raw_decode(buf, pos)
                # a number cut at a chunk border parses "successfully": only trust it when it ended
                if end < len(buf) or eof or isinstance(obj, (dict, list, str)):
                    break
            except json.JSONDecodeError as exc:
                err = exc
            if not more():
                if err is None:
                    break
                raise bad(f"{err.msg} near element {index}")
        pos = end
        yield _field(obj, path, f"element {index}", text_field)
        index += 1


# --------------------------------------------------------------------------------------- Hugging Face


def _hf_fix(name: str) -> str:
    return (
        f"download the dataset files (e.g. the .txt/.json/.parquet files of {name} from the Hub) and "
        f"pass the file or directory path instead"
    )


def _iter_hf(src: HFDataset, text_field: str | None) -> Iterator[str | None]:
    name = src.name
    try:
        import datasets  # optional dependency
    except ImportError:
        raise InputError(
            f"reading hf:{name} needs the optional package 'datasets', which is not installed",
            "pip install 'originlens[hf]', or " + _hf_fix(name),
        ) from None
    try:
        kw: dict[str, Any] = {"split": src.split, "streaming": True}
        if src.config:
            kw["name"] = src.config  # datasets calls the configuration "name"
        if src.revision:
            kw["revision"] = src.revision
        ds = datasets.load_dataset(name, **kw)
        it = iter(ds)
        for i, row in enumerate(it):
            yield _field(row, Path(src.spec), f"row {i}", text_field)
    except InputError:
        raise
    except Exception as exc:  # network / offline / unknown name: datasets raises many types
        msg = " ".join(str(exc).split())[:200]
        what = ", ".join(
            x
            for x in (
                f"config {src.config!r}" if src.config else "",
                f"revision {src.revision!r}" if src.revision else "",
                f"split {src.split!r}",
            )
            if x
        )
        raise InputError(
            f"cannot load Hugging Face dataset {name!r} ({what}): {type(exc).__name__}: {msg}",
            "check the name and the network (offline?), or " + _hf_fix(name),
        ) from None
