"""``originlens lm qscore | steer | lookahead``: SAE features of a language model (Q(w) of arXiv
2603.14087 §9, steering, look-ahead maps).

::

    originlens lm qscore    --model M --sae DIR --corpus C [--features all|0-63|1,5] [--contexts 8]
                            [--max-offset 10] [--ablation error_preserving|faithful|both] --out RUN
    originlens lm steer     --model M --sae DIR --features 1,5 [--coefficients 1,100] [--samples 64]
                            [--max-new-tokens 20] [--prompt TEXT] [--seed 42] --out RUN
    originlens lm lookahead --model M --sae DIR --corpus C [--max-offset 5] [--epochs 10] [--lr 1e-4]
                            [--qscore RUN/results.json] --out RUN

``--model``: any checkpoint :func:`originlens.lm.loading.load_adapter` reads (llama2.c ``.bin``, our GPT
``.safetensors``, Hugging Face directory or ``hf:ID[@REV]``); ``--tokenizer`` as for ``lm generate``
(default: found next to the model).  ``--sae``: an SAELens directory (``cfg.json`` + ``sae_weights.safetensors``,
e.g. from ``originlens sae train``) whose hook and width must match the model.  ``--corpus``: an originlens
corpus directory (its vocabulary must be the model's), an ``.npy`` of token windows, or raw text (files,
directories, ``hf:DATASET``) tokenised with the model's tokenizer and cut into ``--window``-token windows.

Every command writes a run directory: config.json, environment.json, metrics.jsonl, results.json,
figures/ and report.html (``qscore`` also ``examples-{ablation}.safetensors``: the per-example table of
feature, window, position, activation, KL_1..KL_K and ratio).  Mounted under the ``lm`` group of
:mod:`originlens.cli.lm_cmd` (listed after it in ``COMMAND_MODULES``); :mod:`originlens.cli.sae_cmd`
reuses the model/corpus helpers below.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CompatibilityError, ConfigError, InputError
from ..progress import log
from .options import add_device, add_threads, apply_threads, float_list, int_list_or_all, utf8_text

# ----------------------------------------------------------------------------------------------------
# shared helpers (also used by sae_cmd)


def add_model_arguments(p: argparse.ArgumentParser, *, corpus: bool = True, corpus_required: bool = True) -> None:
    """``--model``, ``--revision``, ``--tokenizer``, ``--device``, ``--threads`` and the corpus options."""
    g = p.add_argument_group("model")
    g.add_argument("--model", required=True, help="checkpoint path or hf:ID[@REVISION]")
    g.add_argument("--revision", default=None, help="hub revision for hf:ID")
    g.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer (llama2.c .bin, tokenizer.json, corpus or tokenizer directory); "
        "default: found next to the model",
    )
    add_device(g, help="where the model and the SAE run (default cpu)")
    add_threads(g)
    if corpus:
        c = p.add_argument_group("corpus")
        c.add_argument(
            "--corpus",
            required=corpus_required,
            help="corpus directory, .npy token windows, or raw text (files, directories, hf:DATASET)",
        )
        c.add_argument("--window", type=int, default=64, help="tokens per window for raw text (default 64)")
        c.add_argument("--max-windows", type=int, default=None, help="use at most this many windows")
        c.add_argument("--no-bos", dest="bos", action="store_false", help="do not prepend BOS to windows")


def setup_torch(args: argparse.Namespace) -> None:
    apply_threads(args)


def load_model_and_codec(args: argparse.Namespace) -> tuple[Any, Any]:
    """The adapter (on ``--device``) and its tokenizer codec (None when none is found and none was given)."""
    from ..devices import resolve_device
    from ..lm.loading import load_adapter, load_tokenizer

    device = resolve_device(args.device)  # before loading anything: CUDA missing is one line
    codec = None
    try:
        codec = load_tokenizer(args.model, args.tokenizer, revision=args.revision)
    except (InputError, ConfigError):
        if args.tokenizer is not None:
            raise
        log("note: no tokenizer found next to the model; texts will not be decoded (pass --tokenizer)")
    adapter = load_adapter(args.model, revision=args.revision, tokenizer=codec)
    if device.type != "cpu":
        module = getattr(adapter, "module", None)
        if module is None:
            raise ConfigError(f"cannot move a {type(adapter).__name__} to {args.device}", "use --device cpu")
        module.to(device)
    return adapter, codec


def _vocab_strings(codec: Any) -> list[str] | None:
    from ..lm.compare import tokenizer_vocab

    for obj in (codec, getattr(codec, "inner", None)):
        if obj is None:
            continue
        try:
            return tokenizer_vocab(obj)
        except ConfigError:
            continue
    return None


def load_corpus(args: argparse.Namespace, adapter: Any, codec: Any) -> tuple[np.ndarray, str]:
    """Token windows ``(N, T)`` (without BOS; it is prepended later) and a description of the source."""
    from ..data import TokenStore, is_corpus_dir, iter_documents, load_token_array
    from ..storage import vocab_hash

    src = args.corpus
    V = int(adapter.vocab_size)
    if is_corpus_dir(src):
        store = TokenStore.open(src)
        if store.vocab_size > V:
            raise CompatibilityError(
                f"corpus {src} has a vocabulary of {store.vocab_size} tokens but the model has {V}",
                "tokenize the corpus with the model's tokenizer",
            )
        vocab = _vocab_strings(codec) if codec is not None else None
        if vocab is not None and vocab_hash(vocab, len(vocab)) != store.vocab_hash:
            raise CompatibilityError(
                f"corpus {src} was tokenized with another vocabulary than the model's tokenizer",
                "pass the raw text as --corpus (tokenised with the model's "
                "tokenizer) or the corpus the model was trained on",
            )
        if vocab is None and store.vocab_size != V:
            raise CompatibilityError(
                f"corpus {src} has {store.vocab_size} tokens, the model {V}, and no tokenizer proves they agree",
                "pass --tokenizer, or a corpus in the model's vocabulary",
            )
        tokens = np.asarray(store.tokens)
        desc = f"corpus directory {src}"
    elif Path(src).suffix.lower() == ".npy" and Path(src).is_file():
        tokens, _, _ = load_token_array(src)
        tokens = np.asarray(tokens)
        desc = f"token array {src}"
    else:
        if codec is None:
            raise InputError("raw text needs the model's tokenizer", "pass --tokenizer, or a corpus directory")
        W = args.window
        if W < 2:
            raise ConfigError(f"--window must be ≥ 2, got {W}", "e.g. --window 64")
        rows: list[list[int]] = []
        for text in iter_documents([s for s in src.split(",") if s.strip()]):
            ids = codec.encode(text)
            rows += [ids[i : i + W] for i in range(0, len(ids) - W + 1, W)]
            if args.max_windows is not None and len(rows) >= args.max_windows:
                break
        if not rows:
            raise InputError(f"no document of {src} has {W} tokens", "use a smaller --window")
        tokens = np.asarray(rows, dtype=np.int64)
        desc = f"text {src} tokenised with {getattr(codec, 'source', '') or 'the model tokenizer'}, windows of {W}"
    if args.max_windows is not None:
        tokens = tokens[: args.max_windows]
    if tokens.size and int(tokens.max()) >= V:
        raise CompatibilityError(
            f"the corpus has token id {int(tokens.max())} but the model's vocabulary is [0, {V})",
            "tokenize the corpus with the model's tokenizer",
        )
    return tokens, f"{desc} ({tokens.shape[0]} windows of {tokens.shape[1]} tokens)"


def open_run(out: str, overwrite: bool) -> Any:
    """The run directory of an ``lm``/``sae`` command, locked for this process; ``--overwrite`` starts
    its append-only records (``metrics.jsonl``) afresh."""
    from ..runs import RunDir, hold_lock

    p = Path(out)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"--out {p} is a file", "choose a directory for --out")
    hold_lock(p)
    if (p / "results.json").exists() and not overwrite:
        raise ConfigError(f"{p} already holds results", "pass --overwrite or choose another --out")
    if overwrite:
        (p / "metrics.jsonl").unlink(missing_ok=True)
    return RunDir(p)


def _load_sae(args: argparse.Namespace, adapter: Any) -> tuple[Any, int]:
    from ..devices import resolve_device
    from ..sae import read_sae, sae_site

    sae = read_sae(args.sae, device=resolve_device(args.device))
    return sae, sae_site(sae, adapter)


def _features(spec: list[int] | None, sae: Any, limit: int | None = None) -> list[int]:
    feats = list(range(sae.d_sae)) if spec is None else spec
    bad = [f for f in feats if not 0 <= f < sae.d_sae]
    if bad:
        raise ConfigError(f"feature ids {bad[:5]} outside 0..{sae.d_sae - 1}", "pick features of this SAE")
    return feats[:limit] if limit is not None else feats


def _decode(codec: Any, ids: Any) -> str:
    if codec is None:
        return " ".join(str(int(i)) for i in ids)
    return codec.decode([int(i) for i in ids])


# ----------------------------------------------------------------------------------------------------
# qscore


def _context_text(codec: Any, seqs: Any, ex: Any, e: int, first: int, K: int) -> str:
    i, p = int(ex.seq_index[e]), int(ex.position[e])
    row = seqs[i].tolist()
    return (
        _decode(codec, row[first:p])
        + " [["
        + _decode(codec, row[p : p + 1])
        + "]] "
        + _decode(codec, row[p + 1 : p + K + 1])
    )


def _q_figures(report: Any, results: dict[str, Any], plt: Any) -> None:
    for mode, res in results.items():
        kept = res.kept()
        fig, axes = plt.subplots(1, 3, figsize=(11, 3))
        for ax, key, name in zip(
            axes, ("q", "q_ratio_of_means", "q_median"), ("mean of ratios (paper)", "ratio of means", "median ratio")
        ):
            v = np.array([getattr(f, key) for f in kept], dtype=float)
            v = v[np.isfinite(v) & (v > 0)]
            if v.size:
                lo, hi = np.log10(v.min()), np.log10(v.max())
                bins = np.logspace(lo - 0.1, hi + 0.1, max(5, min(40, v.size // 2 + 2)))
                ax.hist(v, bins=bins)
            ax.set_xscale("log")
            ax.set_xlabel("Pre-Caching Degree Q")
            ax.set_title(name)
        axes[0].set_ylabel("features")
        report.figure(
            fig,
            f"Histogram of Q over the {len(kept)} kept features ({mode} ablation), log x-axis; "
            "left: the paper's mean of per-example ratios, middle and right: robust aggregates.",
            name=f"q-hist-{mode}.png",
        )
        fig, ax = plt.subplots(figsize=(6, 3.5))
        if kept:
            K = len(kept[0].kl_by_offset)
            d = np.arange(1, K + 1)
            M = np.array([f.kl_by_offset for f in kept])
            ax.plot(d, np.median(M, 0), "k-", lw=2, label="median over features")
            ax.plot(d, M.mean(0), "k--", lw=1, label="mean over features")
            order = sorted(kept, key=lambda f: f.q_median)
            for f in order[:3] + order[-3:]:
                ax.plot(d, np.maximum(f.kl_by_offset, 1e-12), alpha=0.7, label=f"#{f.feature} (Q med {f.q_median:.2g})")
            ax.set_yscale("log")
            ax.legend(fontsize=6)
        ax.set_xlabel("offset d")
        ax.set_ylabel("KL(P_clean ‖ P_ablated)")
        report.figure(
            fig,
            f"Mean KL_d by offset d ({mode} ablation): median/mean over kept features and the "
            "three features with the lowest and highest median Q.",
            name=f"kl-by-offset-{mode}.png",
        )
    if len(results) == 2:
        a, b = results["error_preserving"], results["faithful"]
        qa = {f.feature: f.q_median for f in a.features if f.kept}
        pairs = [(qa[f.feature], f.q_median) for f in b.features if f.kept and f.feature in qa]
        pairs = [(x, y) for x, y in pairs if x > 0 and y > 0 and math.isfinite(x) and math.isfinite(y)]
        if pairs:
            fig, ax = plt.subplots(figsize=(4, 4))
            x, y = np.array(pairs).T
            ax.scatter(x, y, s=8)
            ax.set_xscale("log")
            ax.set_yscale("log")
            lim = [min(x.min(), y.min()), max(x.max(), y.max())]
            ax.plot(lim, lim, "k:", lw=1)
            ax.set_xlabel("median Q, error-preserving")
            ax.set_ylabel("median Q, faithful (reference)")
            report.figure(
                fig,
                "Median Q per feature under the two ablations; the faithful ablation also "
                "removes the SAE reconstruction error, a feature-independent change in every KL.",
                name="q-ablations.png",
            )


def cmd_qscore(args: argparse.Namespace) -> int:
    from ..lm.qscore import QScoreConfig, qscore
    from ..report.html import Report, setup_matplotlib
    from ..sae.activations import as_sequences
    from ..storage import atomic_write_json

    setup_torch(args)
    run = open_run(args.out, args.overwrite)
    adapter, codec = load_model_and_codec(args)
    sae, k = _load_sae(args, adapter)
    tokens, corpus_desc = load_corpus(args, adapter, codec)
    feats = _features(args.features, sae, args.max_features)
    modes = ["error_preserving", "faithful"] if args.ablation == "both" else [args.ablation]
    base = dict(
        n_contexts=args.contexts,
        max_offset=args.max_offset,
        position_rule=args.position_rule,
        dedup_distance=args.dedup_distance,
        min_total_kl=args.min_total_kl,
        prepend_bos=args.bos,
        batch_size=args.batch_size,
    )
    info = {
        "model": args.model,
        "sae": str(args.sae),
        "hook_name": sae.cfg.hook_name,
        "site": f"resid.{k}",
        "corpus": corpus_desc,
        "n_features": len(feats),
        "ablations": modes,
        **base,
    }
    run.write_config(info)
    run.write_environment(seeds={})
    results: dict[str, Any] = {}
    examples = None
    for mode in modes:
        res = qscore(adapter, sae, tokens, feats, QScoreConfig(ablation=mode, **base), examples=examples)
        examples = res.examples
        results[mode] = res
        for f in res.features:
            run.log_metrics({"ablation": mode, **{kk: v for kk, v in f.__dict__.items() if kk != "kl_by_offset"}})
        if not res.kept():
            s = res.summary()
            why = ", ".join(f"{r} {n}" for r, n in s["dropped"].items()) or "no reason recorded"
            raise InputError(
                f"none of the {len(res.features)} features could be scored ({mode} ablation; dropped: "
                f"{why}); no results or report were written (per-feature records: "
                f"{run.file('metrics.jsonl')})",
                "use a trained SAE of this model, more corpus text, other --features, or a lower --min-total-kl",
            )
    from ..storage import save_tensors

    for mode, res in results.items():
        save_tensors(
            run.file(f"examples-{mode}.safetensors"),
            res.example_arrays(),
            kind="qscore-examples",
            metadata={"ablation": mode, "site": f"resid.{k}"},
        )
    atomic_write_json(
        run.file("results.json"),
        {
            "info": info,
            "ablations": {
                m: {**r.to_json(include_examples=False), "examples_file": f"examples-{m}.safetensors"}
                for m, r in results.items()
            },
        },
    )
    plt = setup_matplotlib()
    rep = Report("Q(w): pre-caching degree of SAE features")
    rep.section("Settings")
    rep.table(["setting", "value"], [[kk, v] for kk, v in info.items()])
    rep.text(
        "Q = Σ_{d≥2} KL_d / (KL_1 + 1e-8) per example, KL_d = KL(P_clean ‖ P_ablated) of the prediction "
        "d − 1 positions after the ablated one. Features whose mean Σ_d KL_d ≤ min_total_kl are dropped. "
        "error_preserving subtracts a_f·W_dec[f]; faithful replaces the activation by the SAE "
        "reconstruction without the latent (the reference; also removes the reconstruction error)."
    )
    seqs = as_sequences(tokens, adapter, prepend_bos=args.bos)
    first = 1 if args.bos and adapter.bos_id is not None else 0
    for mode, res in results.items():
        s = res.summary()
        rep.section(f"Summary ({mode})")
        rows = [["features", s["n_features"]], ["kept", s["n_kept"]], ["examples", s["n_examples"]]]
        rows += [[f"dropped: {r}", n] for r, n in s["dropped"].items()]
        for key in ("q", "q_ratio_of_means", "q_median"):
            rows += [
                [f"{key}: median", s[key]["median"]],
                [f"{key}: std ln", s[key]["std_log"]],
                [f"{key}: fraction < 0.1", s[key]["frac_below_0.1"]],
                [f"{key}: fraction > 10", s[key]["frac_above_10"]],
            ]
        rep.table(["quantity", "value"], rows)
        kept = sorted(res.kept(), key=lambda f: f.q)
        header = ["feature", "Q (mean ratio)", "ratio of means", "median", "total KL", "n", "top context"]

        def row(f: Any) -> list[Any]:
            sel = np.nonzero(res.examples.feature == f.feature)[0]  # noqa: B023 (called at once)
            ctx = _context_text(codec, seqs, res.examples, int(sel[0]), first, args.max_offset) if sel.size else ""  # noqa: B023
            return [f.feature, f.q, f.q_ratio_of_means, f.q_median, f.total_kl, f.n_examples, ctx[-160:]]

        rep.table(header, [row(f) for f in kept[::-1][:10]], caption="highest Q (most pre-caching)")
        rep.table(header, [row(f) for f in kept[:10]], caption="lowest Q (most immediate)")
    rep.section("Figures")
    _q_figures(rep, results, plt)
    html = rep.write(run.path)
    for mode, res in results.items():
        s = res.summary()
        print(
            f"{mode}: {s['n_kept']}/{s['n_features']} features kept, median Q {s['q']['median']:.3g} "
            f"(ratio of means {s['q_ratio_of_means']['median']:.3g}, median ratio {s['q_median']['median']:.3g})"
        )
    print(f"report: {html}")
    return 0


# ----------------------------------------------------------------------------------------------------
# steer


def cmd_steer(args: argparse.Namespace) -> int:
    from ..lm.steering import steer
    from ..report.html import Report, setup_matplotlib
    from ..storage import atomic_write_json

    setup_torch(args)
    run = open_run(args.out, args.overwrite)
    adapter, codec = load_model_and_codec(args)
    sae, k = _load_sae(args, adapter)
    if args.features is None:
        raise ConfigError("--features all is not allowed for steering", "pick a few features, e.g. --features 3,17")
    feats = _features(args.features, sae)
    prompt_ids = None
    if args.prompt:
        if codec is None:
            raise InputError("a text prompt needs the model's tokenizer", "pass --tokenizer")
        prompt_ids = ([adapter.bos_id] if adapter.bos_id is not None else []) + codec.encode(args.prompt)
    info = {
        "model": args.model,
        "sae": str(args.sae),
        "hook_name": sae.cfg.hook_name,
        "site": f"resid.{k}",
        "features": feats,
        "coefficients": args.coefficients,
        "samples": args.samples,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
        "prompt": args.prompt,
        "coefficient_applied": "once per forward, at all positions",
    }
    run.write_config(info)
    run.write_environment(seeds={"sampling": args.seed})
    res = steer(
        adapter,
        sae,
        feats,
        args.coefficients,
        prompt_ids=prompt_ids,
        tokenizer=codec,
        n_samples=args.samples,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
    )
    for s in res:
        run.log_metrics(
            {
                "feature": s.feature,
                "coefficient": s.coefficient,
                **{kk: v for kk, v in s.stats.items() if kk != "promoted"},
            }
        )
    atomic_write_json(run.file("results.json"), {"info": info, "samples": [s.__dict__ for s in res]})
    plt = setup_matplotlib()
    rep = Report("Steering with SAE decoder directions")
    rep.section("Settings")
    rep.table(["setting", "value"], [[kk, v] for kk, v in info.items()])
    rep.section("Completion statistics")
    rows = []
    for s in res:
        promoted = ", ".join(
            repr(p["text"] if p["text"] is not None else p["id"]) for p in s.stats.get("promoted", [])[:5]
        )
        rows.append(
            [
                "baseline" if s.feature < 0 else s.feature,
                s.coefficient,
                s.stats.get("punct_frac", math.nan),
                s.stats.get("digit_frac", math.nan),
                s.stats["distinct_frac"],
                promoted,
            ]
        )
    rep.table(
        ["feature", "c", "punctuation", "digits", "distinct", "most promoted vs baseline"],
        rows,
        caption="fractions of generated tokens; promoted = largest count ratio against the unsteered samples",
    )
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(res)), 3))
    labels = ["base" if s.feature < 0 else f"#{s.feature}\nc={s.coefficient:g}" for s in res]
    xs = np.arange(len(res))
    ax.bar(xs - 0.2, [s.stats.get("punct_frac", 0) for s in res], 0.4, label="punctuation")
    ax.bar(xs + 0.2, [s.stats["distinct_frac"] for s in res], 0.4, label="distinct")
    ax.set_xticks(xs, labels, fontsize=7)
    ax.legend(fontsize=7)
    rep.figure(
        fig,
        "Steering samples: fraction of punctuation-only tokens and of distinct tokens per condition.",
        name="steering-stats.png",
    )
    rep.section("Samples")
    for s in res:
        if s.texts:
            title = "baseline (c = 0)" if s.feature < 0 else f"feature {s.feature}, c = {s.coefficient:g}"
            rep.code(title + "\n" + "\n".join(f"- {t!r}" for t in s.texts[: args.show]))
    html = rep.write(run.path)
    for s in res[: 1 + min(len(res) - 1, 6)]:
        t = s.texts[0] if s.texts else s.ids[0]
        print(f"{'baseline' if s.feature < 0 else f'feature {s.feature} c={s.coefficient:g}'}: {t!r}")
    print(f"report: {html}")
    return 0


# ----------------------------------------------------------------------------------------------------
# lookahead


def _read_q(path: str, aggregate: str) -> dict[int, float]:
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    if not p.is_file():
        raise InputError(f"{p} does not exist", "pass the results.json (or run directory) of `lm qscore`")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
        abl = data["ablations"]
        res = abl.get("error_preserving") or next(iter(abl.values()))
        return {int(f["feature"]): float(f[aggregate]) for f in res["features"] if f["kept"]}
    except (json.JSONDecodeError, KeyError, StopIteration, TypeError, ValueError) as exc:
        raise InputError(
            f"{p} is not a results.json of `lm qscore` ({exc})", "pass the qscore run's results.json"
        ) from None


def cmd_lookahead(args: argparse.Namespace) -> int:
    from ..lm.steering import LookaheadConfig, lookahead
    from ..report.html import Report, setup_matplotlib
    from ..storage import atomic_write_json

    setup_torch(args)
    run = open_run(args.out, args.overwrite)
    adapter, codec = load_model_and_codec(args)
    sae, k = _load_sae(args, adapter)
    tokens, corpus_desc = load_corpus(args, adapter, codec)
    q = _read_q(args.qscore, args.q_aggregate) if args.qscore else None
    feats = _features(args.features, sae) if args.features is not None else (sorted(q) if q else None)
    cfg = LookaheadConfig(
        max_offset=args.max_offset,
        lr=args.lr,
        epochs=args.epochs,
        batch_size=args.batch_size,
        seed=args.seed,
        max_positions=args.max_positions,
        prepend_bos=args.bos,
    )
    info = {
        "model": args.model,
        "sae": str(args.sae),
        "hook_name": sae.cfg.hook_name,
        "site": f"resid.{k} (the SAE's own site)",
        "corpus": corpus_desc,
        "qscore": args.qscore,
        "q_aggregate": args.q_aggregate,
        **cfg.__dict__,
    }
    run.write_config(info)
    run.write_environment(seeds={"lookahead": args.seed})
    res = lookahead(adapter, sae, tokens, cfg, features=feats, q=q)
    for m in res.maps:
        for h in m.history:
            run.log_metrics(h)
    atomic_write_json(run.file("results.json"), {"info": info, **res.to_json()})
    plt = setup_matplotlib()
    rep = Report("Look-ahead maps and SAE encoder alignment")
    rep.section("Settings")
    rep.table(["setting", "value"], [[kk, v] for kk, v in info.items()])
    rep.section("Maps")
    rep.table(
        ["offset k", "val CE (map)", "val CE (identity)", "val accuracy"],
        [[m.offset, m.val_loss, m.val_loss_identity, m.val_acc] for m in res.maps],
        caption="cross entropy of predicting token t+k from the mapped residual at t (held-out 20%)",
    )
    d = adapter.d_model
    r = np.arange(1, d + 1)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for off, al in res.alignment.items():
        ax.plot(r, al.mean(0), label=f"k = {off}")
    ax.plot(r, np.sqrt(r / d), "k:", label="random direction √(r/d)")
    ax.set_xlabel("rank r")
    ax.set_ylabel("mean cos(e_f, P_r e_f)")
    ax.legend(fontsize=7)
    rep.figure(
        fig,
        "Alignment of SAE encoder columns with the top-r right singular subspace of each look-ahead "
        "map, mean over features, against the random-direction baseline.",
        name="alignment.png",
    )
    if res.correlation:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for off, rows in res.correlation.items():
            ax.plot([x["rank"] for x in rows], [x["rho"] for x in rows], label=f"k = {off}")
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xlabel("rank r")
        ax.set_ylabel("Spearman ρ(alignment, Q)")
        ax.legend(fontsize=7)
        rep.figure(
            fig,
            f"Spearman correlation between encoder alignment at rank r and Q ({args.q_aggregate}) "
            "over the kept features of the Q run.",
            name="correlation.png",
        )
        best = []
        for off, rows in res.correlation.items():
            finite = [x for x in rows if math.isfinite(x["rho"])]
            if finite:
                b = max(finite, key=lambda x: abs(x["rho"]))
                best.append([off, b["rank"], b["rho"], b["p"]])
        rep.table(["offset k", "rank r (largest |ρ|)", "ρ", "p"], best, caption="uncorrected for the search over ranks")
    html = rep.write(run.path)
    for m in res.maps:
        print(f"k={m.offset}: val CE {m.val_loss:.4f} (identity {m.val_loss_identity:.4f}), acc {m.val_acc:.3f}")
    print(f"report: {html}")
    return 0


# ----------------------------------------------------------------------------------------------------
# registration


def _lm_subparsers(subparsers: Any) -> Any:
    lm = subparsers.choices.get("lm")
    if lm is None:
        lm = subparsers.add_parser("lm", help="language models")
    for action in lm._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return lm.add_subparsers(dest="lm_command", metavar="LM_COMMAND")


def _common(p: argparse.ArgumentParser, *, corpus: bool = True) -> None:
    add_model_arguments(p, corpus=corpus)
    p.add_argument("--sae", required=True, help="SAELens SAE directory (cfg.json + sae_weights.safetensors)")
    p.add_argument("--out", required=True, help="run directory to write")
    p.add_argument("--overwrite", action="store_true", help="replace earlier results at --out")


def register(subparsers: Any) -> None:
    sub = _lm_subparsers(subparsers)
    q = sub.add_parser(
        "qscore",
        help="Q(w): future/immediate KL ratio of SAE features (pre-caching degree)",
        description="For each SAE feature: top-activating contexts in the corpus, ablation at the "
        "activating position, KL of the next-token distributions at offsets 1..K, "
        "Q = Σ_{d≥2} KL_d / KL_1 (mean of ratios, ratio of means, median).",
    )
    _common(q)
    g = q.add_argument_group("Q(w)")
    g.add_argument("--features", type=int_list_or_all, default=None, help="all (default) | 0-63 | 1,5,9")
    g.add_argument("--max-features", type=int, default=None, help="only the first N of --features")
    g.add_argument("--contexts", type=int, default=8, help="top-activating contexts per feature (default 8)")
    g.add_argument("--max-offset", type=int, default=10, help="K: offsets d = 1..K (default 10)")
    g.add_argument(
        "--ablation",
        default="error_preserving",
        choices=["error_preserving", "faithful", "both"],
        help="error_preserving: x − a_f·W_dec[f] (default); faithful: SAE reconstruction without "
        "the latent (reference)",
    )
    g.add_argument(
        "--position-rule",
        default="restrict",
        choices=["restrict", "drop"],
        help="restrict: maximum over positions with K following tokens; drop: reference rule",
    )
    g.add_argument("--dedup-distance", type=int, default=10, help="token edit distance of duplicates; -1 = off")
    g.add_argument("--min-total-kl", type=float, default=0.05, help="drop features with mean Σ_d KL_d ≤ this")
    g.add_argument("--batch-size", type=int, default=128, help="rows per ablation forward (default 128)")
    q.set_defaults(func=cmd_qscore)

    s = sub.add_parser(
        "steer",
        help="sample text while adding c·W_dec[f] to the residual stream",
        description="Generate from BOS (or --prompt) with c·W_dec[f] added at the SAE's site at "
        "every position (once per forward), for every feature and coefficient, "
        "plus an unsteered baseline with the same seed.",
    )
    _common(s, corpus=False)
    g = s.add_argument_group("steering")
    g.add_argument("--features", type=int_list_or_all, required=True, help="features to steer with, e.g. 3,17")
    g.add_argument(
        "--coefficients",
        type=float_list,
        default=[1.0, 100.0],
        help="c values (default 1,100: the reference's effective values)",
    )
    g.add_argument("--samples", type=int, default=64, help="samples per condition (default 64)")
    g.add_argument("--max-new-tokens", type=int, default=20, help="default 20")
    g.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1)")
    g.add_argument("--prompt", type=utf8_text, default="", help="text after BOS (default: BOS only)")
    g.add_argument("--seed", type=int, default=42, help="sampling seed, shared by all conditions (default 42)")
    g.add_argument("--show", type=int, default=5, help="samples per condition shown in the report")
    s.set_defaults(func=cmd_steer)

    la = sub.add_parser(
        "lookahead",
        help="look-ahead maps (token t+k from the residual at t) vs SAE encoders",
        description="Train one affine map per offset k (identity init) so that the unembedding "
        "of the mapped residual at t predicts token t+k; SVD; alignment of SAE "
        "encoder columns with the top-r right singular vectors; Spearman with Q.",
    )
    _common(la)
    g = la.add_argument_group("look-ahead")
    g.add_argument("--max-offset", type=int, default=5, help="offsets k = 1..K (default 5)")
    g.add_argument("--epochs", type=int, default=10, help="default 10")
    g.add_argument("--lr", type=float, default=1e-4, help="Adam learning rate (default 1e-4)")
    g.add_argument("--batch-size", type=int, default=32, help="default 32")
    g.add_argument("--max-positions", type=int, default=None, help="cap on training positions")
    g.add_argument("--seed", type=int, default=0, help="split and shuffling seed")
    g.add_argument(
        "--features", type=int_list_or_all, default=None, help="features (default: those of --qscore, else all)"
    )
    g.add_argument("--qscore", default=None, help="results.json (or run directory) of `lm qscore` to correlate with")
    g.add_argument(
        "--q-aggregate",
        default="q_median",
        choices=["q", "q_ratio_of_means", "q_median"],
        help="which Q to correlate with (default q_median)",
    )
    la.set_defaults(func=cmd_lookahead)
