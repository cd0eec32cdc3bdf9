"""Formal text available offline: the Python source files of this interpreter's standard library and of
the installed distributions, as whole-file documents with provenance and licence (for the formal-feature
experiments of arXiv 2603.14087 §9, which need code next to stories).

:func:`python_source_documents` walks the sources (sorted, so the order is reproducible), keeps files of
``min_chars``..``max_chars`` characters that decode as UTF-8, drops exact duplicates (sha256 of the text
with trailing whitespace stripped per line; the first occurrence in walk order is kept) and yields
:class:`SourceDocument` records: the text, its path, where it comes from (``stdlib`` or the distribution
name and version) and the licence that distribution declares (the PEP 639 ``License-Expression``, else
the ``License`` field's first line, else its ``License ::`` classifiers, else ``"unknown"``; the standard
library is under the PSF License).  :func:`write_documents` writes them as JSON Lines that ``corpus
build`` reads (field ``text``) and a provenance file without the texts.

Caveat: a licence is what the package *declares* in its metadata, not a legal review; files generated or
vendored inside a distribution are attributed to it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from email.message import Message
from pathlib import Path
from typing import cast

from ..errors import ConfigError
from ..storage import atomic_write_text

STDLIB_LICENCE = "PSF-2.0"
SOURCES = ("stdlib", "site-packages")


@dataclass(frozen=True)
class SourceDocument:
    """One source file as a document: ``text``, ``path``, ``origin`` (``stdlib`` or a distribution),
    ``version``, ``licence``, ``sha256`` (of the normalised text) and ``domain`` (``"python"``)."""

    text: str
    path: str
    origin: str
    version: str
    licence: str
    sha256: str
    domain: str = "python"

    def provenance(self) -> dict[str, str | int]:
        rec = asdict(self)
        del rec["text"]
        rec["chars"] = len(self.text)
        return rec


def declared_licence(metadata) -> str:
    """The licence a distribution's metadata declares (see the module docstring), or ``"unknown"``."""
    expr = metadata.get("License-Expression")
    if expr and expr.strip():
        return expr.strip()
    lic = (metadata.get("License") or "").strip()
    if lic and lic.upper() not in ("UNKNOWN", "NONE"):
        first = lic.splitlines()[0].strip()
        if len(first) <= 100:
            return first
    classifiers = [
        c.split("::")[-1].strip() for c in (metadata.get_all("Classifier") or []) if c.startswith("License ::")
    ]
    return " AND ".join(classifiers) if classifiers else "unknown"


def _normalised_sha(text: str) -> str:
    return hashlib.sha256("\n".join(line.rstrip() for line in text.splitlines()).encode()).hexdigest()


def _stdlib_files() -> Iterator[tuple[Path, str, str, str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    version = ".".join(map(str, sys.version_info[:3]))
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(
            x
            for x in dirs
            if x not in ("site-packages", "dist-packages", "__pycache__", "test", "tests", "idlelib", "lib2to3")
            and not x.startswith(".")
        )
        for f in sorted(files):
            if f.endswith(".py"):
                yield Path(d) / f, "stdlib", version, STDLIB_LICENCE


def _distribution_files() -> Iterator[tuple[Path, str, str, str]]:
    import importlib.metadata as md

    seen: set[str] = set()
    # A distribution's metadata is an email Message at run time (the PackageMetadata protocol lacks .get).
    dists = sorted(md.distributions(), key=lambda x: (cast(Message, x.metadata).get("Name") or "").lower())
    for dist in dists:
        name = cast(Message, dist.metadata).get("Name") or "?"
        if name.lower() in seen:
            continue
        seen.add(name.lower())
        licence = declared_licence(dist.metadata)
        for f in sorted(dist.files or [], key=str):
            if str(f).endswith(".py"):
                yield Path(cast("os.PathLike[str]", dist.locate_file(f))), name, dist.version or "?", licence


def python_source_documents(
    sources: Iterable[str] = SOURCES, *, min_chars: int = 200, max_chars: int = 200_000, max_files: int | None = None
) -> Iterator[SourceDocument]:
    """Whole-file Python documents of ``sources`` (``"stdlib"``, ``"site-packages"``), deduplicated."""
    sources = list(sources)
    bad = [s for s in sources if s not in SOURCES]
    if bad or not sources:
        raise ConfigError(f"unknown source(s) {bad or sources!r}", f"use {', '.join(SOURCES)}")
    if not 0 <= min_chars <= max_chars:
        raise ConfigError(f"need 0 ≤ min_chars ≤ max_chars, got {min_chars}, {max_chars}", "e.g. 200 and 200000")
    walkers = {"stdlib": _stdlib_files, "site-packages": _distribution_files}
    seen: set[str] = set()
    n = 0
    for src in sources:
        for path, origin, version, licence in walkers[src]():
            if max_files is not None and n >= max_files:
                return
            try:
                raw = path.read_bytes()
                text = raw.decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if not min_chars <= len(text) <= max_chars:
                continue
            sha = _normalised_sha(text)
            if sha in seen:
                continue
            seen.add(sha)
            n += 1
            yield SourceDocument(text, str(path), origin, version, licence, sha)


def write_documents(docs: Iterable[SourceDocument], out: str | os.PathLike) -> tuple[Path, Path, int]:
    """``OUT.jsonl`` (one ``{"text", "domain", "origin", "licence", "sha256"}`` per line, readable by
    ``corpus build``) and ``OUT.provenance.jsonl`` (everything but the text); returns both paths and the
    number of documents."""
    out = Path(out)
    body, prov, n = [], [], 0
    for d in docs:
        body.append(
            json.dumps(
                {"text": d.text, "domain": d.domain, "origin": d.origin, "licence": d.licence, "sha256": d.sha256},
                ensure_ascii=False,
            )
        )
        prov.append(json.dumps(d.provenance(), ensure_ascii=False))
        n += 1
    a, b = out.with_suffix(".jsonl"), out.with_suffix(".provenance.jsonl")
    atomic_write_text(a, "".join(x + "\n" for x in body))
    atomic_write_text(b, "".join(x + "\n" for x in prov))
    return a, b, n
