"""Leading-term features across training checkpoints on CPU (the comparison of arXiv 2601.19208).

    .venv/bin/python examples/compare_tinystories.py --out runs/compare-demo        # everything (minutes)
    .venv/bin/python examples/compare_tinystories.py --out runs/compare-demo --skip-train   # reuse checkpoints

Steps:

1. **corpus**: the shared TinyStories subset, word tokenizer (|V| = ``--vocab-size``, ``oov=unk``), documents
   packed into windows of T+1 = ``--seq-len`` + 1 tokens separated by ``<eot>`` (``originlens corpus build``);
2. **training**: our GPT (``--n-layers`` × ``--d-model``, GPT-2 init) with Adam on random windows, saving
   ``GPT.save`` checkpoints at the Pythia pattern of steps 0, 1, 2, 4, …, ``--max-step`` (with the corpus's
   vocabulary hash and ``<eot>`` as BOS in their metadata);
3. **comparison**: :func:`originlens.experiments.compare_run.run_compare` (what ``originlens lm compare``
   runs) on the checkpoint directory and the corpus, K = ``--top-tokens`` (BOS = ``<eot>``
   prepended per window, per-head maps, permuted-token null baseline and token-centred cosine);
4. **fast vs direct**: the last checkpoint's cosines recomputed by a straightforward float64 transcription of
   the definition (explicit K×K score matrices and covariances), agreement and speed ratio printed;
5. **stories260K**: the same comparison on the llama2.c model with its tok512 tokenizer, statistics from
   the TinyStories text tokenised with that tokenizer.

``OUT/summary.json`` records the wall time of every step and the mean cosines.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from originlens.cli.options import add_option


def compare(out: Path, **settings: object) -> float:
    """One checkpoint comparison (:func:`originlens.experiments.compare_run.run_compare`, the library
    behind ``originlens lm compare``); returns its wall time."""
    from originlens.experiments.compare_run import CompareRunConfig, run_compare

    print(f"compare -> {out}: {settings}", flush=True)
    return run_compare(CompareRunConfig(**settings), out, overwrite=True).seconds  # type: ignore[arg-type]


def train(corpus: Path, ckpt_dir: Path, args: argparse.Namespace) -> dict:
    """Adam on random windows; GPT checkpoints at steps 0, 1, 2, 4, …, max_step."""
    import numpy as np
    import torch

    from originlens.data import TokenStore
    from originlens.lm.checkpoints import log_spaced_steps
    from originlens.models.gpt import GPT, GPTConfig

    store = TokenStore.open(corpus)
    tokens = torch.from_numpy(np.asarray(store.tokens).astype(np.int64))
    eot = store.vocab.index("<eot>")
    torch.manual_seed(args.seed)
    model = GPT(
        GPTConfig(
            vocab_size=store.vocab_size,
            seq_len=store.seq_len + 1,
            n_layer=args.layers,
            d_model=args.d_model,
            n_head=args.heads,
        )
    )
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.95))
    save_at = set(log_spaced_steps(args.max_step, include_zero=True))
    meta = {"bos_id": eot, "vocab_hash": store.vocab_hash, "corpus": str(corpus)}
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    losses = []
    t0 = time.perf_counter()
    model.save(ckpt_dir / "step-000000.safetensors", {**meta, "step": 0})
    for step in range(1, args.max_step + 1):
        batch = tokens[torch.from_numpy(rng.integers(0, len(tokens), args.batch))]
        loss = model.loss(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if step in save_at:
            model.save(ckpt_dir / f"step-{step:06d}.safetensors", {**meta, "step": step})
            print(f"step {step:4d}  loss {np.mean(losses[-8:]):.3f}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    return {
        "train_s": round(time.perf_counter() - t0, 1),
        "loss_first": losses[0],
        "loss_last": float(np.mean(losses[-16:])),
        "params": model.num_params(),
        "windows": len(tokens),
        "vocab_size": store.vocab_size,
        "T": store.seq_len,
    }


def direct_check(corpus: Path, ckpt: Path, run: Path) -> dict:
    """The last checkpoint's covariance cosines (variant ``"spec"``) by a straightforward float64
    implementation (K×K matrices)."""
    import numpy as np
    import torch

    from originlens.data import TokenStore
    from originlens.lm.checkpoints import load_gpt_adapter
    from originlens.lm.compare import checkpoint_cosines, prepare_targets
    from originlens.lm.compare_statistics import comparison_statistics, prepend_bos

    res = json.loads((run / "results.json").read_text())
    K = res["statistics"]["K"]
    ad = load_gpt_adapter(ckpt)
    store = TokenStore.open(corpus)
    stats = comparison_statistics(prepend_bos(np.asarray(store.tokens), ad.bos_id), ad.vocab_size, top_k=K)

    def cov(M: np.ndarray) -> np.ndarray:
        Z = M - M.mean(axis=1, keepdims=True)
        C = Z @ Z.T / (M.shape[1] - 1)
        return C / np.linalg.norm(C)

    def rownorm(A: np.ndarray) -> np.ndarray:
        n = np.linalg.norm(A, axis=1, keepdims=True)
        return np.where(n > 0, A / np.where(n > 0, n, 1), 0.0)

    t0 = time.perf_counter()
    CQ, CV = cov(rownorm(stats.query_key)), cov(rownorm(stats.value_target))
    direct_theory_s = time.perf_counter() - t0
    ids = torch.as_tensor(stats.token_ids)
    out = {"attention": [], "embedding_no_mlp": [], "embedding": []}
    t0 = time.perf_counter()
    with torch.no_grad():
        st = ad.single_token_states(ids)
        for l in range(ad.n_layers):
            WQ, WK = (w.double().numpy() for w in ad.qk_weights(l))
            E = st.pre[l].double().numpy()
            A_emb = np.mean([WQ[h].T @ WK[h] for h in range(ad.n_heads)], axis=0)
            out["attention"].append(float(np.trace(CQ.T @ cov(E @ A_emb @ E.T))))
            out["embedding_no_mlp"].append(float(np.trace(CV.T @ cov(st.attn[l].double().numpy()))))
            out["embedding"].append(float(np.trace(CV.T @ cov(st.post[l].double().numpy()))))
    direct_ckpt_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    targets = prepare_targets(stats)
    fast_theory_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    fast = checkpoint_cosines(ad, stats.token_ids, targets, layers=range(ad.n_layers))
    fast_ckpt_s = time.perf_counter() - t0
    err = max(abs(a - b) for k in out for a, b in zip(out[k], fast.values["spec"][k]))
    n = len(res["labels"])
    direct_total, fast_total = direct_theory_s + n * direct_ckpt_s, fast_theory_s + n * fast_ckpt_s
    print(
        f"paper statistic, {ad.n_layers} layers, K = {K}: direct float64 transcription {direct_theory_s:.2f} s "
        f"theory + {direct_ckpt_s:.2f} s per checkpoint; fast path {fast_theory_s:.2f} s + {fast_ckpt_s:.2f} s; "
        f"per checkpoint {direct_ckpt_s / fast_ckpt_s:.1f}x, {n} checkpoints {direct_total / fast_total:.1f}x; "
        f"max |difference| {err:.2e}",
        flush=True,
    )
    return {
        "K": K,
        "layers": ad.n_layers,
        "direct_theory_s": round(direct_theory_s, 3),
        "direct_per_checkpoint_s": round(direct_ckpt_s, 3),
        "fast_theory_s": round(fast_theory_s, 3),
        "fast_per_checkpoint_s": round(fast_ckpt_s, 3),
        "ratio_per_checkpoint": round(direct_ckpt_s / fast_ckpt_s, 1),
        "ratio_sweep": round(direct_total / fast_total, 1),
        "max_abs_diff": err,
    }


def means(run: Path) -> dict:
    res = json.loads((run / "results.json").read_text())
    return {
        v: {k: [round(sum(col) / len(col), 3) for col in zip(*m)] for k, m in d.items()}
        for v, d in res["cosines"].items()
    } | {"labels": res["labels"], "timings": res["timings"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--vocab-size", type=int, default=2500)
    p.add_argument("--seq-len", type=int, default=64)
    add_option(p, "--n-layers", dest="layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--max-step", type=int, default=512)
    p.add_argument("--top-tokens", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--skip-train", action="store_true", help="reuse OUT/corpus and OUT/checkpoints")
    p.add_argument("--skip-260k", action="store_true", help="do not run the stories260K comparison")
    args = p.parse_args(argv)
    import torch

    from originlens.data import build_corpus
    from originlens.paths import data_path, tinystories_files

    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"args": vars(args)}
    files = tinystories_files()
    if not files:
        raise SystemExit("the TinyStories subset is missing (set ORIGINLENS_DATA)")
    corpus, ckpts = out / "corpus", out / "checkpoints"
    if not args.skip_train:
        t0 = time.perf_counter()
        build_corpus(
            files,
            corpus,
            tokenizer="words",
            vocab_size=args.vocab_size,
            seq_len=args.seq_len,
            windows="pack",
            oov="unk",
        )
        summary["corpus_s"] = round(time.perf_counter() - t0, 1)
        summary["training"] = train(corpus, ckpts, args)
    run = out / "compare-gpt"
    common = dict(top_tokens=args.top_tokens, null_baseline=True, token_centred=True)
    summary["compare_gpt_s"] = round(
        compare(
            run, checkpoint_dir=str(ckpts), corpus=str(corpus), heads_layers=list(range(1, args.layers + 1)), **common
        ),
        1,
    )
    summary["compare_gpt"] = means(run)
    last = sorted(ckpts.glob("step-*.safetensors"))[-1]
    summary["fast_vs_direct"] = direct_check(corpus, last, run)
    if not args.skip_260k:
        d = data_path("models", "stories260K")
        run260 = out / "compare-stories260K"
        summary["compare_260k_s"] = round(
            compare(
                run260,
                model=str(d / "stories260K.bin"),
                tokenizer=str(d / "tok512.bin"),
                corpus=",".join(map(str, files)),
                heads_layers=[1, 2, 3, 4, 5],
                **common,
            ),
            1,
        )
        summary["compare_260k"] = means(run260)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "args"}, indent=1))
    return 0


if __name__ == "__main__":
    from originlens.cli.main import run_script

    sys.exit(run_script(main, "compare_tinystories.py"))
