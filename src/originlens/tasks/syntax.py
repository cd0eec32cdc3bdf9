"""Word-level syntax annotators (Penn-Treebank tags, dependency labels, character spans) and their
alignment to model tokens: the 20 syntax features of the TinyStories task (arXiv 2603.14087, the
TinyStories language model).

The paper probes, after every model token, indicators of 10 Penn-Treebank tags (:data:`TAGS`) and 10
dependency labels (:data:`DEPS`) computed by spaCy ``en_core_web_sm`` on the whole story and moved to the
model's tokens through character spans.

* :class:`Annotation`: one text and its annotator tokens, ``(start_char, end_char, penn_tag or None,
  dep_label or None)`` with ``text[start:end]`` the token (end exclusive).
* :class:`Annotator` (protocol): ``name``, ``version`` (goes into cache keys), ``provides`` (a subset of
  ``{"tags", "deps"}``) and ``annotate(texts) -> list[Annotation]``.  :func:`get_annotator` builds one:

  - ``spacy`` (:class:`SpacyAnnotator`): spaCy with a pipeline named by the caller (default
    ``en_core_web_sm``: the paper's choice), batched ``nlp.pipe`` over whole texts, full pipeline.
    spaCy is optional: without it, or without the named pipeline, a one-line :class:`ConfigError` says
    how to install them (``pip install spacy``; ``python -m spacy download en_core_web_sm``).  Nothing
    is ever downloaded by originlens.
  - ``lingua`` (:class:`LinguaAnnotator`): Penn tags from the Perl module Lingua::EN::Tagger (Debian
    package ``liblingua-en-tagger-perl``; a bigram hidden-Markov tagger whose lexicon and transition
    counts, trained on Penn-Treebank text, ship inside the package), run as one ``perl`` subprocess per
    call.  **Tags only**: it gives no dependency labels, so asking for them raises ``ConfigError``
    naming spaCy as the fix.  Words are split here (:func:`ptb_tokens`, Penn-Treebank conventions:
    punctuation apart, ``n't 's 'm 'd 'll 're 've`` apart, double quotes as ````/''``) and the tagger's
    own lexicon lookup and transition step tag them in order (its tokeniser would lose the character
    spans); its tag names are mapped to Penn's (``det`` → DT, ``pp`` → ``.``, ``ppc`` → ``,`` ...).
  - ``gold`` (:class:`GoldAnnotator`): the exact tags and labels of stories written by
    :mod:`originlens.data.storyworld` (:func:`~originlens.data.storyworld.annotate_story`); other
    texts raise ``InputError``.

* :func:`align` (expand mode): model token j gets every tag and label of every annotator token whose
  character span overlaps its own (``max(a, s) < min(b, e)``); tokens covering only whitespace get none.
  Output ``(n_tokens, 20)`` bool, columns :data:`SYNTAX_FEATURES` (tags first, then labels).

Choice of the offline annotator (this workplace reaches PyPI and Debian only, no model hub): spaCy's
official pipelines are not on PyPI (those that are are third-party re-uploads, not used); Debian has
no spaCy, UDPipe or parser model; Apache OpenNLP (Debian) ships without models; ``frog`` is Dutch;
CMU link-grammar (Debian ``link-grammar``) ships an English dictionary but gives link types, not a
dependency tree with ClearNLP labels (a linkage may attach one word to two heads), so labels would be
our own conversion rather than a parser's output.  Lingua::EN::Tagger is a real, packaged, self-contained
Penn tagger; hence tags offline, dependency labels with spaCy only.

Caveats: Lingua is a greedy bigram tagger (well below spaCy's accuracy; e.g. it tends to tag the verb
"like" as IN), and its tokens are not spaCy's (hyphenated words stay whole, abbreviations such as
"Mr." keep their period), which only matters through the character spans.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from ..errors import ConfigError, InputError

TAGS = ("NN", "VBD", "DT", "PRP", "JJ", "NNP", "IN", "RB", "VB", "CC")
DEPS = ("nsubj", "ROOT", "det", "dobj", "pobj", "advmod", "prep", "cc", "conj", "aux")
SYNTAX_FEATURES = TAGS + DEPS
#: feature names of the columns of :func:`align` (prefixed: the tag CC and the label cc differ by case only)
FEATURE_NAMES = tuple(f"tag_{t}" for t in TAGS) + tuple(f"dep_{d}" for d in DEPS)
LABEL_SETS = {"all": ("tags", "deps"), "tags": ("tags",), "deps": ("deps",)}
ANNOTATORS = ("spacy", "lingua", "gold")
DEFAULT_SPACY_MODEL = "en_core_web_sm"
SPACY_FIX = "pip install spacy && python -m spacy download en_core_web_sm"

Span = tuple  # (start_char: int, end_char: int, penn_tag: str | None, dep_label: str | None)


@dataclass(frozen=True)
class Annotation:
    """A text and its annotator tokens ``(start, end, tag or None, label or None)``, in text order."""

    text: str
    spans: tuple[Span, ...]

    def __len__(self) -> int:
        return len(self.spans)

    def __iter__(self):
        return iter(self.spans)


@runtime_checkable
class Annotator(Protocol):
    """Gives word-level Penn tags and/or dependency labels with character spans."""

    name: str

    @property
    def version(self) -> str: ...

    @property
    def provides(self) -> frozenset[str]: ...

    def annotate(self, texts: Sequence[str]) -> list[Annotation]: ...


# ------------------------------------------------------------------------------------------ spaCy


class SpacyAnnotator:
    """spaCy pipeline ``model`` (an installed package name or a pipeline directory), loaded on first use.

    Raises (at construction):
        ConfigError: spaCy is not importable, or ``model`` is neither an installed pipeline package nor
            a directory.
    """

    name = "spacy"

    def __init__(self, model: str = DEFAULT_SPACY_MODEL, *, batch_size: int = 64) -> None:
        try:
            import spacy  # noqa: F401
        except ImportError:
            raise ConfigError("the syntax annotator 'spacy' needs spaCy, which is not installed", SPACY_FIX) from None
        if not isinstance(model, str) or not model:
            raise ConfigError(f"spacy_model must be a pipeline name, got {model!r}", "e.g. en_core_web_sm")
        self.model = model
        self.batch_size = int(batch_size)
        if not (self._is_package() or Path(model).is_dir()):
            raise ConfigError(
                f"the spaCy pipeline {model!r} is not installed (no such package or directory)",
                "install an official pipeline (python -m spacy download en_core_web_sm) and pass its "
                "name, or pass the directory of a saved pipeline, as spacy_model",
            )

    def _is_package(self) -> bool:
        import spacy

        return bool(re.fullmatch(r"[A-Za-z0-9_.\-]+", self.model)) and spacy.util.is_package(self.model)

    @functools.cached_property
    def nlp(self):
        import spacy

        try:
            return spacy.load(self.model)
        except (OSError, ImportError, ValueError) as exc:
            msg = " ".join(str(exc).split())[:200]
            raise ConfigError(
                f"cannot load the spaCy pipeline {self.model!r} ({msg})",
                f"reinstall it: python -m spacy download {self.model}",
            ) from None

    @functools.cached_property
    def version(self) -> str:
        import spacy

        if self._is_package():
            mv = spacy.util.get_package_version(self.model) or "?"
        else:
            meta = Path(self.model) / "meta.json"
            mv = spacy.util.load_meta(meta).get("version", "?") if meta.is_file() else "?"
        return f"spacy-{spacy.__version__}/{Path(self.model).name}-{mv}"

    @functools.cached_property
    def provides(self) -> frozenset[str]:
        """What the pipeline sets, judged on a probe sentence (``Doc.has_annotation`` of TAG and DEP)."""
        doc = self.nlp("The little dog saw a red ball and ran home.")
        return frozenset(k for k, attr in (("tags", "TAG"), ("deps", "DEP")) if doc.has_annotation(attr))

    def annotate(self, texts: Sequence[str]) -> list[Annotation]:
        want = self.provides
        out = []
        for text, doc in zip(texts, self.nlp.pipe(list(texts), batch_size=self.batch_size)):
            spans = tuple(
                (
                    t.idx,
                    t.idx + len(t.text),
                    (t.tag_ or None) if "tags" in want else None,
                    (t.dep_ or None) if "deps" in want else None,
                )
                for t in doc
                if not t.is_space
            )
            out.append(Annotation(text, spans))
        return out


# ------------------------------------------------------------------------------------------ Lingua

PTB_TOKENIZER_VERSION = "1"
_ABBREVIATIONS = frozenset(["mr", "mrs", "ms", "dr", "st", "jr", "sr", "prof", "mt"])
_TOKEN_RE = re.compile(
    r"""
    (?P<ellipsis>\.\.\.+|…)
  | (?P<dash>--+|[–—])
  | (?P<number>\d+(?:[.,:]\d+)+)
  | (?P<word>[^\W_]+(?:[-'’][^\W_]+)*)
  | (?P<other>\S)
""",
    re.VERBOSE,
)
_CLITICS = ("s", "m", "d", "ll", "re", "ve")
_OPEN_QUOTES = "“‘"
_CLOSE_QUOTES = "”’"


def ptb_tokens(text: str) -> list[tuple[int, int, str]]:
    """Penn-Treebank-style word tokens of ``text``: ``(start, end, form)`` with ``text[start:end]`` the
    token and ``form`` what a Penn tagger expects (quotes as ````/''``/`` ` ``/``'``, ``’`` as ``'``,
    ``…`` as ``...``, dashes as ``--``).  Punctuation characters are tokens of their own, ``n't`` and the
    clitics ``'s 'm 'd 'll 're 've`` are split off, hyphenated words stay whole, "Mr." keeps its period."""
    out: list[tuple[int, int, str]] = []
    for m in _TOKEN_RE.finditer(text):
        a, b, kind, tok = m.start(), m.end(), m.lastgroup, m.group()
        if kind == "ellipsis":
            out.append((a, b, "..."))
        elif kind == "dash":
            out.append((a, b, "--"))
        elif kind == "word":
            norm = tok.replace("’", "'")
            low = norm.lower()
            if low.endswith("n't") and len(low) > 3:
                out += [(a, b - 3, norm[:-3]), (b - 3, b, "n't")]
            elif "'" in norm and low.rsplit("'", 1)[1] in _CLITICS:
                k = norm.rindex("'")
                out += [(a, a + k, norm[:k]), (a + k, b, norm[k:])]
            elif low in _ABBREVIATIONS and text[b : b + 1] == "." and text[b + 1 : b + 2] != ".":
                out.append((a, b + 1, norm + "."))
            else:
                out.append((a, b, norm))
        elif out and out[-1][1] == b and out[-1][2].endswith("."):
            continue  # the period already joined to an abbreviation
        elif tok in "\"'`":
            prev = text[a - 1] if a else " "
            opening = prev.isspace() or prev in "([{" + _OPEN_QUOTES + "\"'`"
            if tok == "`":
                opening = True
            double = tok == '"'
            out.append((a, b, ("``" if double else "`") if opening else ("''" if double else "'")))
        elif tok in _OPEN_QUOTES:
            out.append((a, b, "``" if tok == "“" else "`"))
        elif tok in _CLOSE_QUOTES:
            out.append((a, b, "''" if tok == "”" else "'"))
        else:
            out.append((a, b, tok))
    return out


# Tags each token in the order given, one text per input line (tokens separated by single spaces), with
# the module's lexicon lookup (_clean_word) and transition step (_assign_tag) exactly as its
# add_tags() does after tokenising; the previous tag starts at 'pp' (sentence end) for every text.
_LINGUA_SCRIPT = r"""
use strict; use warnings;
use Lingua::EN::Tagger;
binmode(STDIN, ':encoding(UTF-8)'); binmode(STDOUT, ':encoding(UTF-8)');
my $p = Lingua::EN::Tagger->new(stem => 0);
die "Lingua::EN::Tagger $Lingua::EN::Tagger::VERSION lacks _assign_tag/_clean_word\n"
    unless $p->can('_assign_tag') && $p->can('_clean_word');
while (my $line = <STDIN>) {
    chomp $line;
    my $t = 'pp';
    my @out;
    for my $w (split(/ /, $line)) {
        next if $w eq '';
        $t = $p->_assign_tag($t, $p->_clean_word($w)) || 'nn';
        push @out, $t;
    }
    print join(' ', @out), "\n";
}
"""
_LINGUA_TO_PENN = {
    "det": "DT",
    "pp": ".",
    "ppc": ",",
    "ppd": "$",
    "pps": ":",
    "ppl": "``",
    "ppr": "''",
    "lrb": "-LRB-",
    "rrb": "-RRB-",
    "prps": "PRP$",
    "wps": "WP$",
}
LINGUA_FIX = (
    "apt-get install liblingua-en-tagger-perl (Debian/Ubuntu; elsewhere: cpan Lingua::EN::Tagger), "
    "or use annotator='spacy'"
)


def lingua_to_penn(tag: str) -> str:
    """Penn-Treebank name of a Lingua::EN::Tagger tag (``det`` → ``DT``, ``ppc`` → ``,``, ``nn`` → ``NN``)."""
    return _LINGUA_TO_PENN.get(tag, tag.upper())


class LinguaAnnotator:
    """Penn tags from Lingua::EN::Tagger (Perl), no dependency labels (see the module docstring).

    Raises (at construction):
        ConfigError: ``perl`` or the Lingua::EN::Tagger module is missing (the fix names the Debian package).
    """

    name = "lingua"
    provides = frozenset({"tags"})

    def __init__(self) -> None:
        perl = shutil.which("perl")
        if perl is None:
            raise ConfigError("the syntax annotator 'lingua' needs perl, which is not on PATH", LINGUA_FIX)
        self.perl = perl
        try:
            r = subprocess.run(
                [perl, "-MLingua::EN::Tagger", "-e", "print $Lingua::EN::Tagger::VERSION"],
                capture_output=True,
                text=True,
                timeout=120,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"cannot run perl for the 'lingua' annotator ({exc})", LINGUA_FIX) from None
        if r.returncode != 0 or not r.stdout.strip():
            raise ConfigError("the Perl module Lingua::EN::Tagger is not installed", LINGUA_FIX)
        self.lingua_version = r.stdout.strip()

    @property
    def version(self) -> str:
        return f"lingua-en-tagger-{self.lingua_version}/ptb-tokens-{PTB_TOKENIZER_VERSION}"

    def annotate(self, texts: Sequence[str]) -> list[Annotation]:
        tokens = [ptb_tokens(t) for t in texts]
        if not texts:
            return []
        payload = "".join(" ".join(f for _, _, f in toks) + "\n" for toks in tokens).encode("utf-8")
        try:
            r = subprocess.run([self.perl, "-e", _LINGUA_SCRIPT], input=payload, capture_output=True)
        except OSError as exc:
            raise ConfigError(f"cannot run perl for the 'lingua' annotator ({exc})", LINGUA_FIX) from None
        if r.returncode != 0:
            err = " ".join(r.stderr.decode("utf-8", "replace").split())[-300:]
            raise ConfigError(f"Lingua::EN::Tagger failed ({err})", LINGUA_FIX)
        lines = r.stdout.decode("utf-8").split("\n")
        if len(lines) < len(texts):
            raise ConfigError(
                f"Lingua::EN::Tagger returned {len(lines)} lines for {len(texts)} texts",
                "check the Perl installation, or use annotator='spacy'",
            )
        out = []
        for i, (text, toks) in enumerate(zip(texts, tokens)):
            tags = lines[i].split()
            if len(tags) != len(toks):
                raise ConfigError(
                    f"Lingua::EN::Tagger returned {len(tags)} tags for the {len(toks)} tokens of text {i}",
                    "check the Perl installation, or use annotator='spacy'",
                )
            out.append(Annotation(text, tuple((a, b, lingua_to_penn(t), None) for (a, b, _), t in zip(toks, tags))))
        return out


# ------------------------------------------------------------------------------------------ gold


class GoldAnnotator:
    """The generator's own tags and labels for storyworld stories (:mod:`originlens.data.storyworld`)."""

    name = "gold"
    provides = frozenset({"tags", "deps"})

    @property
    def version(self) -> str:
        from ..data.storyworld import GENERATOR_VERSION

        return f"storyworld-{GENERATOR_VERSION}"

    def annotate(self, texts: Sequence[str]) -> list[Annotation]:
        from ..data.storyworld import annotate_story

        out = []
        for i, text in enumerate(texts):
            try:
                words = annotate_story(text)
            except ValueError as exc:
                raise InputError(
                    f"text {i} is not a storyworld story ({exc})",
                    "use annotator='gold' only on stories written by originlens.data.storyworld, "
                    "else annotator='spacy' or 'lingua'",
                ) from None
            out.append(Annotation(text, tuple((w.start, w.end, w.tag, w.dep) for w in words)))
        return out


# ------------------------------------------------------------------------------------------ selection


def get_annotator(name: str, *, spacy_model: str = DEFAULT_SPACY_MODEL) -> Annotator:
    """The annotator called ``name`` (:data:`ANNOTATORS`); ``spacy_model`` only applies to ``spacy``.

    Raises:
        ConfigError: unknown name, or the annotator's software is not installed.
    """
    if name == "spacy":
        return SpacyAnnotator(spacy_model)
    if name == "lingua":
        return LinguaAnnotator()
    if name == "gold":
        return GoldAnnotator()
    raise ConfigError(f"unknown syntax annotator {name!r}", f"use one of: {', '.join(ANNOTATORS)}")


def selected_columns(labels: str) -> list[int]:
    """Columns of :data:`SYNTAX_FEATURES` for a label set: ``all`` (20), ``tags`` (10), ``deps`` (10)."""
    if labels not in LABEL_SETS:
        raise ConfigError(f"unknown syntax label set {labels!r}", f"use one of: {', '.join(LABEL_SETS)}")
    sets = LABEL_SETS[labels]
    return [i for i in range(len(SYNTAX_FEATURES)) if ("tags" if i < len(TAGS) else "deps") in sets]


def check_provides(annotator: Annotator, labels: str | Iterable[str]) -> None:
    """Raise ConfigError (one line, naming spaCy) when ``annotator`` lacks a requested label set."""
    want = LABEL_SETS[labels] if isinstance(labels, str) and labels in LABEL_SETS else tuple(labels)
    missing = [w for w in want if w not in annotator.provides]
    if missing:
        what = {"tags": "Penn-Treebank tags", "deps": "dependency labels"}
        raise ConfigError(
            f"the syntax annotator {annotator.name!r} gives no {' or '.join(what[m] for m in missing)}",
            f"use annotator='spacy' with en_core_web_sm ({SPACY_FIX})"
            + (
                ", or syntax_labels='tags' for the 10 tag features"
                if missing == ["deps"] and "tags" in annotator.provides
                else ""
            ),
        )


# ------------------------------------------------------------------------------------------ alignment

_COL = {t: i for i, t in enumerate(TAGS)}
_DEP_COL = {d: len(TAGS) + i for i, d in enumerate(DEPS)}


def align(
    annotation: Annotation,
    token_char_spans: Sequence[tuple[int, int]] | np.ndarray,
    n_tokens: int,
    *,
    story: int | None = None,
) -> np.ndarray:
    """Expand-mode alignment: ``(n_tokens, 20)`` bool, ``out[j, c]`` True when some annotator token whose
    span overlaps token j's span carries feature c (:data:`SYNTAX_FEATURES`).  Tokens whose characters
    are all whitespace (or none) get no feature.

    Raises:
        InputError: a token span is not inside the text (``0 ≤ start ≤ end ≤ len``), an annotator span is
            not (``0 ≤ start ≤ end ≤ len``), or the number of spans is not ``n_tokens``; the message names
            ``story`` when given.
    """
    text = annotation.text
    n_chars = len(text)
    where = f"story {story}" if story is not None else "text"
    tok = (
        np.asarray(token_char_spans, dtype=np.int64).reshape(-1, 2)
        if len(token_char_spans)
        else np.zeros((0, 2), dtype=np.int64)
    )
    if len(tok) != n_tokens:
        raise InputError(
            f"{where}: {len(tok)} token spans for {n_tokens} tokens",
            "pass one (start, end) character span per model token",
        )
    bad = np.flatnonzero((tok[:, 0] < 0) | (tok[:, 0] > tok[:, 1]) | (tok[:, 1] > n_chars))
    if bad.size:
        j = int(bad[0])
        raise InputError(
            f"{where} cannot be aligned: token {j} spans characters {tok[j, 0]}..{tok[j, 1]}, outside "
            f"the text ({n_chars} characters)",
            "tokenise the story text itself (the whole story, with the task's tokenizer)",
        )
    cols, starts, ends = [], [], []
    for k, sp in enumerate(annotation.spans):
        a, b, tag, dep = sp
        if not (0 <= a <= b <= n_chars):
            raise InputError(
                f"{where} cannot be aligned: annotator token {k} spans characters {a}..{b}, outside "
                f"the text ({n_chars} characters)",
                "annotate the same text that is tokenised",
            )
        for c in (_COL.get(tag), _DEP_COL.get(dep)):
            if c is not None:
                cols.append(c)
                starts.append(a)
                ends.append(b)
    out = np.zeros((n_tokens, len(SYNTAX_FEATURES)), dtype=bool)
    if not cols or not n_tokens:
        return out
    diff = np.zeros((len(SYNTAX_FEATURES), n_chars + 1), dtype=np.int32)
    np.add.at(diff, (np.array(cols), np.array(starts)), 1)
    np.add.at(diff, (np.array(cols), np.array(ends)), -1)
    covered = np.cumsum(diff[:, :n_chars], axis=1) > 0  # (20, chars)
    csum = np.zeros((len(SYNTAX_FEATURES), n_chars + 1), dtype=np.int64)
    np.cumsum(covered, axis=1, out=csum[:, 1:])
    out[:] = (csum[:, tok[:, 1]] - csum[:, tok[:, 0]] > 0).T
    blank = [j for j, (s, e) in enumerate(tok.tolist()) if not text[s:e].strip()]
    out[blank] = False
    return out
