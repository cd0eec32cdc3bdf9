"""Benchmark: corpus statistics, our path vs a straightforward dense one-hot einsum implementation.

Scenarios (each in its own subprocess so peak memory is measured per scenario):

* ``dense``  — same corpus through both paths (|V|=500, T=64, N=1024 by default), checks agreement
  and prints the speed ratio (target ≥ 50×).
* ``paper``  — the paper's scale: |V|=3,000, T=200, N=65,536 windows (TinyStories word windows, tiled
  to 65,536 when the subset is smaller; synthetic Zipf tokens when TinyStories is absent); target
  ≤ 2 minutes and ≤ 4 GB peak memory for all six statistics.
* ``big``    — top-20,000 tokens of a large vocabulary at T=128, float32 outputs streamed to a
  statistics directory (``stream_statistics``, what ``originlens stats`` runs); target ≤ 4 GB peak.
  A BPE tokenizer trained on the TinyStories subset stops near 11k tokens, so this scenario draws
  Zipf-distributed ids over 50,304 (Pythia's vocabulary size) — a worst case for sparsity.  Writes
  5 × 1.6 GB to a temporary directory (deleted afterwards).
* ``cli``    — peak memory of ``originlens stats`` against the library on the ``paper`` corpus, each in
  its own process measured by ``os.wait4``: the library in memory (``corpus_statistics``), the library
  streaming to disk (``stream_statistics``) and the command; target: the command at the library's peak.

Wall time and process CPU time are given for each; peaks are the maximum resident set size (GiB).

Usage: ``python benchmarks/stats.py [dense|paper|big|cli|all] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _emit import emit  # benchmarks/_emit.py (the script's own folder is on sys.path)


def dense_reference(tokens: np.ndarray, V: int):
    """The straightforward implementation: dense one-hot tensors and einsums as defined, torch float64."""
    import torch

    t = torch.as_tensor(tokens.astype(np.int64))
    N, T1 = t.shape
    T = T1 - 1
    eye = torch.eye(V, dtype=torch.float64)
    X, Y = eye[t[:, :-1]], eye[t[:, 1:]]
    R0 = Y - 1.0 / V
    A0 = torch.tril(torch.ones(T, T, dtype=torch.float64)) / torch.arange(1, T + 1, dtype=torch.float64)[:, None]
    B = torch.einsum("ntv,ntw->vw", X, R0) / (N * T)
    Phi = torch.einsum("ntv,ntw->vw", R0, torch.einsum("ts,nsw->ntw", A0, X)) / (N * T)
    Sig = B.T @ B
    Vlt = Phi.T @ B.T
    M = torch.einsum("ntv,vw,nkw->ntk", R0, Sig @ Phi, X)
    J = torch.diag_embed(A0) - A0[:, :, None] * A0[:, None, :]  # (T, T, T) softmax Jacobians
    Qn = torch.einsum("tij,ntj->nti", J, M)
    Q = torch.einsum("ntv,ntj,njw->vw", X, Qn, X) / (N * T)
    Qm = Qn.sum(0) / (N * T)
    Delta = torch.stack([torch.diagonal(Qm, offset=-d).sum() for d in range(T)])
    return {
        k: v.numpy()
        for k, v in dict(
            bigram=B, context=Phi, interchangeability=Sig, value_target=Vlt, query_key=Q, positional=Delta
        ).items()
    }


def tinystories_windows(vocab_size: int, seq_len: int, tokenizer: str = "words") -> np.ndarray | None:
    from originlens.data import build_corpus
    from originlens.paths import tinystories_files

    files = tinystories_files()
    if not files:
        return None
    with tempfile.TemporaryDirectory() as d:
        store = build_corpus(
            files, Path(d) / "c", tokenizer=tokenizer, vocab_size=vocab_size, seq_len=seq_len, windows="pack", oov="unk"
        )
        return np.array(store.tokens), store.vocab_size


def zipf_windows(V: int, T: int, N: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, V + 1)
    return rng.choice(V, size=(N, T + 1), p=p / p.sum()).astype(np.uint32 if V > 65535 else np.uint16)


def scenario_dense(quick: bool) -> dict:
    import torch

    from originlens.stats import corpus_statistics

    torch.set_num_threads(2)
    V, T, N = (300, 48, 256) if quick else (500, 64, 1024)
    got = tinystories_windows(V, T)
    if got is None:
        tokens, src = zipf_windows(V, T, N), "zipf"
    else:
        tokens, V = got[0][:N], got[1]
        src = "tinystories-words"
    corpus_statistics(tokens[:4], V)  # compile kernels outside the timing
    t0, c0 = time.perf_counter(), time.process_time()
    ours = corpus_statistics(tokens, V)
    t_ours, c_ours = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    ref = dense_reference(tokens, V)
    t_dense, c_dense = time.perf_counter() - t0, time.process_time() - c0
    err = max(float(np.abs(getattr(ours, k) - ref[k]).max() / (np.abs(ref[k]).max() or 1)) for k in ref)
    return {
        "scenario": "dense",
        "source": src,
        "V": V,
        "T": T,
        "N": int(tokens.shape[0]),
        "ours_s": t_ours,
        "dense_s": t_dense,
        "speedup": t_dense / t_ours,
        "speedup_cpu": c_dense / c_ours,
        "max_rel_err": err,
    }


def paper_windows(quick: bool) -> tuple[np.ndarray, int, str]:
    V, T, N = 3000, 200, (8192 if quick else 65536)
    got = tinystories_windows(V, T)
    if got is None:
        return zipf_windows(V, T, N), V, "zipf"
    base, V = got
    reps = -(-N // len(base))
    return np.concatenate([base] * reps)[:N], V, f"tinystories-words ({len(base)} windows tiled)"


def scenario_paper(quick: bool) -> dict:
    from originlens.stats import corpus_statistics

    tokens, V, src = paper_windows(quick)
    T = tokens.shape[1] - 1
    corpus_statistics(tokens[:4], V)
    t0, c0 = time.perf_counter(), time.process_time()
    st = corpus_statistics(tokens, V)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "scenario": "paper",
        "source": src,
        "V": V,
        "T": T,
        "N": int(tokens.shape[0]),
        "ours_s": secs,
        "ours_cpu_s": cpu,
        "n_pairs": st.n_pairs,
    }


def scenario_big(quick: bool) -> dict:
    from originlens.stats import corpus_statistics, stream_statistics

    T, K = 128, 20000
    got = None if quick else tinystories_windows(32000, T, tokenizer="bpe")
    if got is not None and got[1] < K:
        # the TinyStories subset supports only ~11k BPE merges: fall back to a Pythia-sized id space
        got = None
    if got is None:
        V = 50304
        tokens, src = zipf_windows(V, T, 4096 if quick else 16384), "zipf over 50,304 ids"
    else:
        tokens, V = got
        src = f"tinystories-bpe (|V|={V})"
    K = min(K, V)
    corpus_statistics(tokens[:4], V, top_k=8, dtype=np.float32)  # compile kernels outside the timing
    with tempfile.TemporaryDirectory() as d:
        t0, c0 = time.perf_counter(), time.process_time()
        st = stream_statistics(tokens, V, Path(d) / "stats", top_k=K, dtype=np.float32)
        secs, cpu = time.perf_counter() - t0, time.process_time() - c0
        size = st.size
        del st
    return {
        "scenario": "big",
        "source": src,
        "V": V,
        "K": size,
        "T": T,
        "N": int(tokens.shape[0]),
        "ours_s": secs,
        "ours_cpu_s": cpu,
    }


def run_measured(cmd: list[str]) -> tuple[float, float, float]:
    """Run ``cmd``; (wall s, CPU s, peak RSS GiB) of that process alone (``os.wait4``)."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "CI": "1"})
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"{cmd[2:4]} failed:\n{err.read().decode()[-2000:]}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024**2


def library_child(how: str, tokens_file: str, V: int) -> None:
    """One library run on a saved token file (``cli`` scenario): in memory or streamed to a directory."""
    from originlens.stats import corpus_statistics, stream_statistics

    tokens = np.load(tokens_file, mmap_mode="r")  # as the command does; both load the compiled kernels
    if how == "memory":
        corpus_statistics(tokens, V)
    else:
        with tempfile.TemporaryDirectory() as d:
            stream_statistics(tokens, V, Path(d) / "stats")


def scenario_cli(quick: bool) -> dict:
    tokens, V, src = paper_windows(quick)
    res: dict = {"scenario": "cli", "source": src, "V": V, "T": tokens.shape[1] - 1, "N": int(tokens.shape[0])}
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "tokens.npy"
        np.save(f, tokens)
        del tokens
        for name, cmd in (
            ("library", [sys.executable, __file__, "lib-memory", "--child", "--lib-args", str(f), str(V)]),
            ("library_stream", [sys.executable, __file__, "lib-stream", "--child", "--lib-args", str(f), str(V)]),
            ("cli", [sys.executable, "-m", "originlens", "-q", "stats", "--tokens", str(f), "--vocab-size", str(V)]
             + ["--out", str(Path(d) / "out")]),
        ):  # fmt: skip
            wall, cpu, peak = run_measured(cmd)
            res.update({f"{name}_s": wall, f"{name}_cpu_s": cpu, f"{name}_peak_gb": peak})
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "which", nargs="?", default="all", choices=["dense", "paper", "big", "cli", "all", "lib-memory", "lib-stream"]
    )
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke test)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--lib-args", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.which.startswith("lib-"):
        library_child(a.which[4:], a.lib_args[0], int(a.lib_args[1]))
        return
    if a.child and a.which == "cli":
        print(json.dumps(scenario_cli(a.quick)))
        return
    if a.child:
        fn = {"dense": scenario_dense, "paper": scenario_paper, "big": scenario_big}[a.which]
        res = fn(a.quick)
        res["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
        print(json.dumps(res))
        return
    names = ["dense", "paper", "big", "cli"] if a.which == "all" else [a.which]
    print(f"machine: {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    for n in names:
        cmd = [sys.executable, __file__, n, "--child"] + (["--quick"] if a.quick else [])
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "CI": "1"})
        if out.returncode != 0:
            print(f"{n}: FAILED\n{out.stderr[-2000:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        if n == "dense":
            print(
                f"dense  V={r['V']} T={r['T']} N={r['N']} ({r['source']}): ours {r['ours_s']:.3f} s, "
                f"dense einsum {r['dense_s']:.2f} s, ratio {r['speedup']:.0f}x [CPU {r['speedup_cpu']:.0f}x], max rel err "
                f"{r['max_rel_err']:.1e}, peak {r['peak_rss_gb']:.2f} GB"
            )
            emit("stats.dense", r["speedup_cpu"], cpu=True, goal=50)
        elif n == "paper":
            print(
                f"paper  V={r['V']} T={r['T']} N={r['N']} ({r['source']}): all six statistics in "
                f"{r['ours_s']:.1f} s [CPU {r['ours_cpu_s']:.1f} s], peak {r['peak_rss_gb']:.2f} GB"
            )
        elif n == "big":
            print(
                f"big    top-{r['K']} of V={r['V']} T={r['T']} N={r['N']} ({r['source']}), float32 streamed to disk: "
                f"{r['ours_s']:.1f} s [CPU {r['ours_cpu_s']:.1f} s], peak {r['peak_rss_gb']:.2f} GB"
            )
        else:
            line = ", ".join(
                f"{k.replace('_', ' ')} {r[k + '_peak_gb']:.2f} GB in {r[k + '_s']:.1f} s [CPU {r[k + '_cpu_s']:.1f} s]"
                for k in ("library", "library_stream", "cli")
            )
            print(f"cli    V={r['V']} T={r['T']} N={r['N']} ({r['source']}), peak RSS per process: {line}")


if __name__ == "__main__":
    main()
