"""The leading-terms persistence experiment: per-step cosines against the trainer's own theory comparison,
the nulls recomputed from their definitions, resume, horizons, results file and verdict rules."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from originlens.errors import ConfigError
from originlens.experiments import persistence as P
from originlens.experiments import persistence_config as PC
from originlens.experiments import persistence_cosines as PCos
from originlens.experiments import persistence_report as PR
from originlens.experiments.results import read_results


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pers")
    cfg = PC.PersistenceConfig(scale="ci", seeds=[0, 1, 2], overrides={"steps": 16})
    s = P.run_persistence(cfg, out / "exp", results=out / "res.json", command="originlens test")
    return cfg, out, s


def _records(run_dir, event):
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in recs if r.get("event") == event]


@pytest.mark.slow
def test_step_cosines_equal_the_trainers_theory_comparison(ci_run):
    """At every checkpoint the callback's min-over-layers cosines equal ``compare_to_theory``'s (computed by
    the trainer from the saved weights on another code path)."""
    cfg, out, _ = ci_run
    for lr in cfg.lrs:
        d = P.run_dir_of(out / "exp", lr, 0)
        cos = {r["step"]: r for r in _records(d, "cosines")}
        assert sorted(cos) == list(range(1, 17))
        cks = [r for r in _records(d, "checkpoint") if "min_cos" in r]
        assert [r["step"] for r in cks] == cfg.logging_points
        for r in cks:
            for k in PCos.KINDS:
                a, b = cos[r["step"]]["lt"][k], r["min_cos"][k]
                assert (a is None) == (b is None or (isinstance(b, float) and math.isnan(b)))
                if a is not None:
                    assert math.isclose(a, b, rel_tol=0, abs_tol=1e-6)  # float32 weights, float64 products


@pytest.mark.slow
def test_null_cosines_recomputed_from_their_definitions(ci_run):
    import torch

    from originlens.data import TokenStore
    from originlens.stats import corpus_statistics
    from originlens.storage import load_tensors
    from originlens.theory.leading_terms import cosine, leading_terms

    cfg, out, _ = ci_run
    store = TokenStore.open(out / "exp" / "corpus")
    tokens = np.asarray(store.tokens, dtype=np.int64)
    V, B = store.vocab_size, cfg.settings["batch_size"]
    lr, seed = cfg.lrs[-1], 1
    d = P.run_dir_of(out / "exp", lr, seed)
    perm = torch.randperm(len(tokens), generator=torch.Generator().manual_seed(42 + seed)).numpy()
    first = tokens[perm[:B]]
    shuffled = first.copy()
    rng = np.random.default_rng(42 + seed)
    for row in shuffled:
        rng.shuffle(row)
    targets = {
        "lt": leading_terms(corpus_statistics(first, V)),
        "permuted": leading_terms(corpus_statistics(shuffled, V)),
        "disjoint": leading_terms(corpus_statistics(tokens[perm[B : 2 * B]], V)),
    }
    w, _ = load_tensors(d / "model.safetensors")
    final = {r["step"]: r for r in _records(d, "cosines")}[16]
    for which, lt in targets.items():
        for k in PCos.KINDS:
            names = [n for n in w if n.split(".")[0] == k]
            want = min(cosine(np.asarray(w[n], dtype=np.float64), lt[k]) for n in names)
            assert math.isclose(final[which][k], want, rel_tol=0, abs_tol=1e-9), (which, k)
    # the permuted null keeps each window's tokens and changes their order
    assert all(sorted(a) == sorted(b) for a, b in zip(first, shuffled)) and (first != shuffled).any()
    assert PCos.permuted_windows(first, 42 + seed).tolist() == shuffled.tolist()


@pytest.mark.slow
def test_summary_min_and_horizon_from_the_logged_series(ci_run):
    cfg, out, s = ci_run
    for lr in cfg.lrs:
        for seed in cfg.seeds:
            d = P.run_dir_of(out / "exp", lr, seed)
            series = {r["step"]: r["lt"] for r in _records(d, "cosines")}
            got = s["runs"][f"{lr:g}"][str(seed)]["lt"]
            for k in PCos.KINDS:
                vals = [v[k] for v in series.values() if v[k] is not None]
                assert got[k]["min_all"] == min(vals)
                assert got[k]["min_logged"] == min(series[p][k] for p in cfg.logging_points if series[p][k] is not None)
                for th in PCos.THRESHOLDS:
                    below = [st for st in sorted(series) if series[st][k] is not None and series[st][k] < th]
                    assert got[k]["horizon"][f"{th:g}"] == (below[0] if below else None)
    rec = read_results(out / "res.json")
    assert rec["experiment"] == "leading-terms" and rec["name"] == "persistence-ci" and rec["seeds"] == [0, 1, 2]
    one = rec["numbers"]["by_lr"]["0.05"]["W_O"]
    assert one["min_logged"]["n"] == 3 and "Fisher z" in one["min_logged"]["interval"]
    assert set(one["nulls"]) == {"permuted", "disjoint"} and "p_t" in one["nulls"]["permuted"]["test_final"]
    assert rec["numbers"]["by_lr"]["0.05"]["t"] == pytest.approx(0.8)
    assert any(x.startswith("steps 16 (paper 3200)") for x in rec["scale"]["deviations"])
    text = "\n".join(PR.render_section("leading-terms/persistence-ci", rec))
    assert "| η | steps | weight |" in text and text.count("| 0.005 | 16 (t = 0.08") == 3


@pytest.mark.slow
def test_an_interrupted_run_resumes_to_the_same_records(ci_run, tmp_path):
    """A run stopped at step 7 and resumed by rerunning the experiment ends with the cosine and loss
    records of the uninterrupted fixture run, bit for bit."""
    from originlens.train.assoc import AssocTrainer

    cfg, out, _ = ci_run
    one = PC.PersistenceConfig(scale="ci", seeds=[0], lrs=[0.05], overrides={"steps": 16})
    exp = tmp_path / "exp"
    exp.mkdir()
    store = P.build_experiment_corpus(one, exp)
    tokens = np.asarray(store.tokens, dtype=np.int64)

    class StopAt:
        def on_step_end(self, tr):
            if tr.step == 7:
                tr.request_stop()

    d = P.run_dir_of(exp, 0.05, 0)
    nulls = PCos.null_statistics(tokens, store.vocab_size, 32, 42)
    r = AssocTrainer(
        tokens,
        store.vocab_size,
        one.train_config(0.05, 0, d),
        [PCos.StepCosines(nulls), StopAt()],
        vocab=list(store.vocab),
    ).run(resume=True)
    assert r.stopped_early and r.step == 7
    P.run_persistence(one, exp, results=tmp_path / "r.json", command="t")
    ref = P.run_dir_of(out / "exp", 0.05, 0)
    for ev in ("cosines", "step"):
        a = [{k: v for k, v in x.items() if k != "time"} for x in _records(d, ev)]
        b = [{k: v for k, v in x.items() if k != "time"} for x in _records(ref, ev)]
        assert a == b and len(a) == 16


def test_every_scale_has_a_summary_and_a_protocol():
    assert set(PC.SUMMARIES) == set(PC.SCALES) == set(PC.PAPER_OF)
    for scale in PC.SCALES:
        assert PC.PersistenceConfig(scale=scale).paper_scale in ("paper", "paper-bpe")


def test_horizon_and_schedule():
    assert PCos.horizon([(1, None), (2, 0.995), (3, 0.98), (4, 0.5)], 0.99) == 3
    assert PCos.horizon([(1, 0.999), (2, 0.995)], 0.99) is None
    cfg = PC.PersistenceConfig(scale="cpu")
    assert cfg.logging_points == list(range(64, 3201, 64)) and cfg.epoch30_step == 960
    assert cfg.train_config(0.005, 2, "x").data_seed == 44  # 42 (the paper's) + seed


def _fake(small_min=0.995, t=16.0, ep30=0.95, final=0.8, p=0.01):
    ci = lambda m: {"mean": m, "low": m - 0.001, "high": m + 0.001}
    kind = lambda m: {
        "min_logged": ci(m),
        "epoch30": ci(ep30),
        "final": ci(final),
        "nulls": {"permuted": {"test_final": {"p_t": p}}},
    }
    by = {
        "0.005": {"t": t, **{k: kind(small_min) for k in PCos.KINDS}},
        "0.05": {"t": 10 * t, **{k: kind(small_min) for k in PCos.KINDS}},
    }
    return {"numbers": {"by_lr": by}, "seeds": [0, 1, 2], "scale": {"model": "m", "training": "t", "deviations": []}}


def test_verdict_rules():
    assert PR.judge(_fake()).verdict == "reproduced"
    assert PR.judge(_fake(t=0.06)).verdict == "partial"  # too short a run proves nothing
    assert PR.judge(_fake(p=0.5)).verdict == "partial"  # no better than permuted tokens
    assert PR.judge(_fake(small_min=0.5, ep30=0.5, final=0.5, p=0.5)).verdict == "not reproduced"


def test_bad_configurations():
    with pytest.raises(ConfigError, match="unknown scale"):
        PC.PersistenceConfig(scale="huge")
    with pytest.raises(ConfigError, match="override"):
        PC.PersistenceConfig(overrides={"width": 3})
    with pytest.raises(ConfigError, match="learning rates"):
        PC.PersistenceConfig(lrs=[0.0])
    with pytest.raises(ConfigError, match="steps"):
        PC.PersistenceConfig(overrides={"steps": 0})
    with pytest.raises(ConfigError, match="seeds"):
        PC.PersistenceConfig(seeds=[1, 1])


@pytest.mark.slow
def test_bpe_protocol_builds_a_bpe_corpus_and_is_judged_against_table_2(tmp_path):
    cfg = PC.PersistenceConfig(
        scale="ci",
        seeds=[0, 1],
        lrs=[0.005],
        overrides={"tokenizer": "bpe", "windows": "first", "vocab_size": 120, "steps": 10, "log_every": 5},
    )
    s = P.run_persistence(cfg, tmp_path / "exp", results=tmp_path / "r.json", command="t")
    manifest = json.loads((tmp_path / "exp" / "corpus" / "manifest.json").read_text())
    assert "bpe" in json.dumps(manifest.get("tokenizer", manifest)).lower()
    assert set(s["by_lr"]) == {"0.005"}
    bpe = PC.PersistenceConfig(scale="cpu-bpe")
    assert bpe.lrs == [0.005] and bpe.paper_scale == "paper-bpe" and bpe.logging_points[:2] == [5, 10]
    assert not any(d.startswith(("steps", "tokenizer", "log_every")) for d in bpe.deviations())
    rec = read_results(tmp_path / "r.json")
    assert rec["paper_t"] == 16.0 and rec["protocol"] == "paper"  # a ci scale stands for Table 1
    with pytest.raises(ConfigError, match="tokenizer"):
        PC.PersistenceConfig(scale="ci", overrides={"tokenizer": "sentencepiece"})
    with pytest.raises(ConfigError, match="override"):
        PC.PersistenceConfig(scale="ci", overrides={"lrs": [0.1]})


@pytest.mark.slow
def test_docs_figure_is_drawn_from_the_results_file_and_checked_by_its_digest(ci_run, tmp_path):
    import shutil

    from PIL import Image

    from originlens.experiments.render import BEGIN, END, render, results_digest

    cfg, out, _ = ci_run
    root = tmp_path / "root"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text(f"# x\n\n{BEGIN}\n{END}\n")
    (root / "results" / "leading-terms").mkdir(parents=True)
    dst = root / "results" / "leading-terms" / "persistence-ci.json"
    shutil.copy(out / "res.json", dst)
    changed = {p.name for p in render(root)}
    png = root / "docs" / "figures" / "leading-terms-persistence-ci.png"
    assert "leading-terms-persistence-ci.png" in changed and png.is_file()
    rec = json.loads(dst.read_text())
    with Image.open(png) as im:
        assert im.info["Description"] == results_digest(rec)
    assert (
        "![leading-terms/persistence-ci](figures/leading-terms-persistence-ci.png)"
        in (root / "docs" / "results.md").read_text()
    )
    assert render(root, check=True) == []
    rec["runs"][0]["curve"]["W"][-1] = 0.5  # other numbers: the figure is out of date
    dst.write_text(json.dumps(rec))
    assert png in render(root, check=True)


def test_unit_records_combine_into_the_same_results(ci_run, tmp_path):
    """Every (η, seed) run writes a record beside the results file; runs made one seed at a time combine
    with from_records into the numbers of the run that made them all at once; another configuration or a
    missing unit is refused; fewer than 3 seeds at the default path write records only."""
    from originlens.errors import InputError
    from originlens.experiments.records import record_path
    from originlens.experiments.results import read_results

    cfg, out, s = ci_run
    for lr in cfg.lrs:
        for seed in cfg.seeds:
            assert record_path(out / "res.json", P.unit_name(lr, seed)).is_file()
    comb = P.run_persistence(cfg, tmp_path / "comb", results=out / "res.json", command="combine", from_records=True)
    assert not (tmp_path / "comb" / "corpus").exists()  # nothing built or trained
    assert comb["by_lr"] == s["by_lr"]
    rec = read_results(out / "res.json")
    assert rec["command"] == "combine" and rec["runs"][0]["commits"]["command"] == "originlens test"
    other = PC.PersistenceConfig(scale="ci", seeds=[0, 1, 2], overrides={"steps": 17})
    with pytest.raises(InputError, match="another configuration"):
        P.run_persistence(other, tmp_path / "x", results=out / "res.json", from_records=True)
    more = PC.PersistenceConfig(scale="ci", seeds=[0, 1, 2, 9], overrides={"steps": 16})
    with pytest.raises(InputError, match="no record of lr-"):
        P.run_persistence(more, tmp_path / "y", results=out / "res.json", from_records=True)
    # units built their corpus in separate output directories: equal windows, manifests differing only in
    # their build time, combine; a unit trained on other windows is refused
    import json

    path = record_path(out / "res.json", P.unit_name(cfg.lrs[0], cfg.seeds[1]))
    saved = path.read_text()
    raw = json.loads(saved)
    try:
        path.write_text(json.dumps({**raw, "values": {**raw["values"], "corpus_manifest_sha256": "0" * 64}}))
        again = P.run_persistence(cfg, tmp_path / "again", results=out / "res.json", from_records=True)
        assert again["by_lr"] == s["by_lr"]
        other_data = {**raw["values"], "data_hashes": {"tokens": "f" * 64}}
        path.write_text(json.dumps({**raw, "values": other_data}))
        with pytest.raises(InputError, match="another corpus"):
            P.run_persistence(cfg, tmp_path / "z", results=out / "res.json", from_records=True)
    finally:  # the module's shared run as it was
        path.write_text(saved)
        P.run_persistence(cfg, tmp_path / "comb2", results=out / "res.json", command="combine", from_records=True)
