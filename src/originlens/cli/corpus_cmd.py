"""``originlens corpus build|info``: turn text into a token-window corpus directory and describe one.

The heavy modules (``originlens.data``) are imported inside the command functions so that
``originlens --help`` stays fast and never fails because of the corpus pipeline.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BUILD_EPILOG = """\
sources:
  FILE.txt            one document per line (or --split-mode blank|eot; auto = eot if the
                      marker <|endoftext|> appears in the first MiB, else one per line)
  FILE.json/.jsonl    a JSON list of objects/strings, or JSON Lines; field 'text' or 'story'
                      (or --text-field); .gz versions of .txt/.json/.jsonl are read too
  FILE.parquet        column 'text' or 'story' (or --text-field)
  DIR                 every such file below DIR (recursive, sorted, hidden files skipped)
  hf:NAME[/CONFIG][@REV][:SPLIT]
                      a Hugging Face dataset (needs the optional package 'datasets' and network)
  (none)              the built-in storyworld corpus with planted statistics (--stories, --seed)

examples:
  originlens corpus build ../shared/data/tinystories --vocab-size 3000 --seq-len 200 --out corpora/ts3000
  originlens corpus build --stories 2000 --vocab-size 500 --out corpora/storyworld
  originlens corpus info corpora/ts3000
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "corpus",
        help="build or inspect a tokenised corpus (windows of T+1 token ids)",
        description="Build a corpus directory (tokens.npy of shape (N, T+1), vocab.json, tokenizer/, "
        "manifest.json) from text, or describe one.",
    )
    sub = p.add_subparsers(dest="corpus_command", metavar="ACTION")

    b = sub.add_parser(
        "build",
        help="tokenise text sources into fixed-length windows",
        description="Tokenise SOURCE... (two streaming passes: train/count, then encode) and write a corpus "
        "directory atomically: nothing appears under --out unless the build succeeds.",
        epilog=BUILD_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument(
        "sources",
        nargs="*",
        metavar="SOURCE",
        help="text files, directories or hf:NAME[/CONFIG][@REV][:SPLIT]; none = built-in storyworld",
    )
    b.add_argument("--out", required=True, type=Path, metavar="DIR", help="output corpus directory")
    b.add_argument(
        "--tokenizer",
        default="words",
        metavar="words|bpe|PATH",
        help="'words' (the paper's lower-cased word/punctuation tokenizer, default), 'bpe' "
        "(Hugging Face BPE trained on the sources), or a tokenizer.json file / directory "
        "holding one (a pretrained tokenizer, or the tokenizer/ of a corpus directory)",
    )
    b.add_argument(
        "--vocab-size",
        type=int,
        default=1000,
        metavar="K",
        help="number of token ids |V| including special tokens (default 1000; the paper uses "
        "3000 for words, 10000 for BPE); ignored for a pretrained tokenizer",
    )
    b.add_argument(
        "--seq-len",
        type=int,
        default=64,
        metavar="T",
        help="window length T: each window holds T+1 tokens (inputs x_0..x_{T-1}, targets "
        "x_1..x_T); default 64, the paper uses 200",
    )
    b.add_argument(
        "--windows",
        choices=("first", "pack", "split"),
        default="first",
        help="'first' (paper): the first T+1 tokens of each document, shorter documents "
        "skipped; 'pack': documents joined by an end-of-text token and cut into "
        "non-overlapping windows; 'split': each document cut into its own windows "
        "(none spans two documents) (default first)",
    )
    b.add_argument(
        "--oov",
        choices=("drop", "unk"),
        default="drop",
        help="out-of-vocabulary tokens: 'drop' (paper) discards every document containing one "
        "(checked over the whole document); 'unk' maps them to <unk> (default drop)",
    )
    b.add_argument(
        "--text-field",
        metavar="F",
        default=None,
        help="JSON/Parquet/HF field holding the text (default: 'text', else 'story')",
    )
    b.add_argument(
        "--split-mode",
        choices=("auto", "line", "blank", "eot"),
        default="auto",
        help="how plain-text files are cut into documents (default auto)",
    )
    b.add_argument(
        "--encoding-errors",
        choices=("strict", "replace"),
        default="strict",
        help="invalid UTF-8: 'strict' stops with the file and byte offset (default), 'replace' substitutes U+FFFD",
    )
    b.add_argument(
        "--max-windows", type=int, default=None, metavar="N", help="stop after N windows (the first N in source order)"
    )
    b.add_argument(
        "--no-wrap", action="store_true", help="BPE only: do not wrap each text as <s> ... </s> (the paper wraps)"
    )
    b.add_argument(
        "--stories",
        type=int,
        default=None,
        metavar="N",
        help="storyworld only: number of generated stories (default 2000)",
    )
    b.add_argument("--seed", type=int, default=0, help="storyworld seed (default 0)")
    b.add_argument("--overwrite", action="store_true", help="replace an existing corpus directory at --out")
    b.set_defaults(func=_cmd_build, writes=lambda a: [a.out])

    i = sub.add_parser(
        "info",
        help="print the summary of a corpus directory",
        description="Validate a corpus directory and print its manifest summary.",
    )
    i.add_argument("corpus", type=Path, metavar="DIR", help="corpus directory (from 'corpus build')")
    i.add_argument("--json", action="store_true", help="print the whole manifest as JSON")
    i.set_defaults(func=_cmd_info, writes=lambda a: [])

    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _cmd_build(args: argparse.Namespace) -> int:
    from ..data.build import DEFAULT_STORIES, build_corpus
    from ..errors import ConfigError

    if args.stories is not None and args.sources:
        raise ConfigError(
            "--stories only applies to the built-in storyworld (no SOURCE given)", "drop --stories or the sources"
        )
    if not args.sources:
        n = args.stories if args.stories is not None else DEFAULT_STORIES
        print(f"no SOURCE given: using the built-in storyworld corpus ({n} stories, seed {args.seed})")
    store = build_corpus(
        args.sources or None,
        args.out,
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        seq_len=args.seq_len,
        windows=args.windows,
        oov=args.oov,
        max_windows=args.max_windows,
        text_field=args.text_field,
        seed=args.seed,
        storyworld_stories=args.stories,
        split_mode=args.split_mode,
        errors=args.encoding_errors,
        wrap=not args.no_wrap,
        overwrite=args.overwrite,
    )
    print(summary(store.manifest, store.path))
    warning = dropped_warning(store.manifest)
    if warning:
        print(warning, file=sys.stderr)
    return 0


def dropped_warning(m: dict) -> str | None:
    """A warning line when ``corpus build`` dropped documents, naming how many of each reason and the flag
    that keeps them; None when nothing was dropped."""
    c = m.get("counts", {})
    dropped = {k: int(v) for k, v in (c.get("documents_dropped") or {}).items() if v}
    if not dropped:
        return None
    read = int(c.get("documents_read") or 0)
    fixes = {
        "oov": "--oov unk maps out-of-vocabulary tokens to <unk> instead",
        "too_short": f"--windows pack joins documents shorter than T + 1 = {int(m.get('seq_len', 0)) + 1} "
        f"tokens into packed windows",
    }
    parts = [f"{v} {k.replace('_', ' ')}" + (f" ({fixes[k]})" if k in fixes else "") for k, v in dropped.items()]
    total = sum(dropped.values())
    share = f" ({100 * total / read:.0f} %)" if read else ""
    return f"warning: {total} of {read} documents{share} were dropped and are in no window: " + "; ".join(parts)


def _cmd_info(args: argparse.Namespace) -> int:
    from ..data.store import TokenStore

    store = TokenStore.open(args.corpus)
    if args.json:
        print(json.dumps(store.manifest, indent=2, ensure_ascii=False))
    else:
        print(summary(store.manifest, store.path))
    return 0


def summary(m: dict, path: Path | str) -> str:
    """Human-readable multi-line summary of a corpus manifest."""
    c = m.get("counts", {})
    n, t1 = m.get("shape", [0, 0])
    srcs = m.get("sources", [])
    tok = m.get("tokenizer", {})
    sized = [s.get("bytes") for s in srcs if isinstance(s.get("bytes"), int)]
    dropped = c.get("documents_dropped", {})
    lines = [
        f"corpus {path}",
        f"  windows     {n} x {t1} tokens (T = {m.get('seq_len')}, mode '{m.get('windows')}', dtype {m.get('dtype')})",
        f"  vocabulary  |V| = {m.get('vocab_size')} (tokenizer '{tok.get('kind')}', oov '{m.get('oov')}', "
        f"hash {m.get('vocab_hash')})",
        f"  sources     {len(srcs)}"
        + (f" ({sum(sized)} bytes)" if sized else "")
        + ": "
        + ", ".join(_source_name(s) for s in srcs[:3])
        + (" ..." if len(srcs) > 3 else ""),
        f"  documents   {c.get('documents_read')} read, {c.get('documents_kept')} kept, dropped: "
        + (", ".join(f"{k} {v}" for k, v in dropped.items()) or "none"),
        f"  tokens      {c.get('tokens_read')} read, {c.get('tokens_in_windows')} in windows",
    ]
    if c.get("stopped_at_max_windows"):
        lines.append(f"  note        stopped at --max-windows {m.get('max_windows')}")
    return "\n".join(lines)


def _source_name(s: dict) -> str:
    if s.get("path") == "storyworld":
        return f"storyworld ({s.get('stories')} stories, seed {s.get('seed')})"
    return str(s.get("path"))
