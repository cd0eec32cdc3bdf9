"""``originlens stats``: compute the six corpus statistics and write ``DIR/statistics.safetensors``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..progress import log
from .options import add_option, finite_float


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "stats",
        help="compute corpus statistics (bigram, interchangeability, context, value_target, query_key, positional)",
        description="Compute the exact corpus statistics of arXiv 2601.19208 §3 from a corpus directory "
        "(originlens corpus build) or an (N, T+1) .npy token file, and write "
        "DIR/statistics.safetensors with exactly the six keys (plus vocab.json and "
        "manifest.json when built from a corpus directory). Under `torchrun --nproc_per_node N -m "
        "originlens stats ...` each process takes a shard and the sums are all-gathered.",
    )
    p.add_argument("corpus", nargs="?", help="corpus directory written by `originlens corpus build`")
    p.add_argument("--tokens", help="an (N, T+1) integer .npy file instead of a corpus directory")
    p.add_argument("--vocab-size", type=int, help="|V| (required with --tokens; default: the corpus's)")
    add_option(p, "--top-tokens", dest="top_k", type=int, help="restrict to the K most frequent tokens (matrices K×K)")
    p.add_argument(
        "--centering",
        type=finite_float,
        help="centring constant c of the targets (default 1/|V|, the model softmax at init)",
    )
    p.add_argument("--pad-id", type=int, help="token id whose pairs are not counted (padding)")
    p.add_argument("--max-windows", type=int, help="use only the first N windows (e.g. the first batch)")
    p.add_argument(
        "--dtype",
        choices=["float64", "float32"],
        default="float64",
        help="output precision (float32 halves memory for big vocabularies)",
    )
    p.add_argument("--chunk-size", type=int, default=1024, help="windows per processing chunk")
    p.add_argument("--out", required=True, help="output directory (written atomically)")
    p.set_defaults(func=run, writes=lambda a: [a.out])


def run(args: argparse.Namespace) -> int:
    from ..data import TokenWindows
    from ..distributed import distributed_corpus_statistics, init
    from ..stats import CorpusStatistics, save_statistics, stream_statistics
    from ..storage import sha256_file

    if bool(args.corpus) == bool(args.tokens):
        raise InputError(
            "give either a corpus directory or --tokens FILE.npy (exactly one)",
            "e.g. `originlens stats runs/corpus --out runs/stats`",
        )
    if args.tokens and args.vocab_size is None:
        raise InputError("--tokens needs --vocab-size", "pass --vocab-size V (ids must be < V)")
    src = Path(args.corpus or args.tokens)
    from ..outputs import check_output_directory
    from ..stats.io import OUTPUT

    check_output_directory(args.out, output=OUTPUT, inputs=[src])  # before any work
    windows = TokenWindows.load(src, args.vocab_size)
    tokens, vocab, manifest = windows.as_tuple()
    V = windows.vocab_size
    if args.max_windows is not None:
        if args.max_windows < 1:
            raise InputError(f"--max-windows must be ≥ 1 (got {args.max_windows})", "pass a positive number")
        tokens = tokens[: args.max_windows]
    log(
        f"statistics of {tokens.shape[0]} windows × T={tokens.shape[1] - 1}, |V|={V}"
        + (f", top-{args.top_k}" if args.top_k else "")
    )
    t0 = time.perf_counter()
    rank, world_size = init()  # under torchrun: each rank takes a shard, sums are all-gathered
    kwargs = dict(
        top_k=args.top_k,
        centering=args.centering,
        pad_id=args.pad_id,
        dtype=np.dtype(args.dtype),
        chunk_size=args.chunk_size,
        vocab=vocab,
    )
    corpus = manifest if manifest is not None else {"tokens_file": str(src), "sha256": sha256_file(src)}

    def out_manifest(st: CorpusStatistics) -> dict:
        return {
            "statistics": {
                "source": str(src),
                "windows": int(tokens.shape[0]),
                "processes": world_size,
                "seq_len": st.seq_len,
                "vocab_size": V,
                "size": st.size,
                "centering": st.centering,
                "n_pairs": st.n_pairs,
                "top_k": args.top_k,
                "pad_id": args.pad_id,
                "dtype": args.dtype,
                "seconds": time.perf_counter() - t0,
            },
            "corpus": corpus,
        }

    meta = {"source": str(src), "windows": int(tokens.shape[0]), "seconds": None, "top_k": args.top_k}
    if world_size == 1:  # each statistic goes to disk as it is computed (peak memory: one or two K×K arrays)
        st = stream_statistics(tokens, V, args.out, meta=meta, manifest=out_manifest, inputs=[src], **kwargs)
    else:
        st = distributed_corpus_statistics(tokens, V, **kwargs)
        if rank != 0:  # every rank holds the same result; rank 0 writes it
            return 0
        st.meta.update({**meta, "seconds": round(time.perf_counter() - t0, 3)})
        save_statistics(st, args.out, manifest=out_manifest(st), inputs=[src])
    secs = time.perf_counter() - t0
    print(
        f"wrote {Path(args.out) / 'statistics.safetensors'} ({st.size}×{st.size}, T={st.seq_len}, "
        f"{st.n_pairs} pairs, {secs:.1f} s)"
    )
    return 0
