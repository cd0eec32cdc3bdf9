"""The multi-seed Othello experiment: per-seed aggregation against a brute-force recomputation from the
attribution store, the k = L separation, the random-direction null, results file, verdict rules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from originlens.attribution.store import RANDOM_TAG, load_observables
from originlens.errors import ConfigError
from originlens.experiments.othello import HYPOTHESES, OthelloConfig, judge, run_othello
from originlens.experiments.results import read_results


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("oth")
    cfg = OthelloConfig(scale="ci", seeds=[0, 1], overrides={"steps": 12, "eval_size": 120})
    s = run_othello(cfg, out / "exp", results=out / "res.json", command="originlens test")
    return cfg, out, s


@pytest.mark.slow
def test_seed_aggregates_equal_a_brute_force_recomputation(ci_run):
    cfg, out, s = ci_run
    for seed in cfg.seeds:
        rows = load_observables(out / "exp" / f"seed-{seed}" / "run" / "attribution").to_pylist()
        for frac, cutoff in ((0.5, 6), (1.0, 12)):
            items: dict = {}
            for r in rows:
                if r["step"] <= cutoff and r["type"] in (1, 2) and r["influence"] is not None:
                    key = (r["site_layer"], r["site_position"], r["feature"], r["type"], r["component"])
                    items[key] = items.get(key, 0.0) + r["influence"]
            agg = s["per_seed"][seed]["aggregates"][f"{frac:g}"]
            assert agg["updates"] == cutoff
            for comp in ("direct", "precached", "shared", "full"):
                for t, name in ((1, "useless"), (2, "useful")):
                    for part, layers in (("main", {1}), ("last_layer", {2})):
                        for kind in ("real", "random"):
                            vals = [
                                v
                                for (k, i, f, ty, c), v in items.items()
                                if c == comp and ty == t and k in layers and ((RANDOM_TAG in f) == (kind == "random"))
                            ]
                            got = agg["means"][part][kind][comp][name]
                            assert got["n_items"] == len(vals)
                            assert math.isclose(got["mean"], float(np.mean(vals)), rel_tol=1e-9, abs_tol=1e-15)
            last = agg["means"]["last_layer"]["real"]["precached"]
            assert last["useful"]["mean"] == 0.0 and last["useless"]["mean"] == 0.0  # G_pre(L, i) ≡ 0


@pytest.mark.slow
def test_results_file_and_tests_over_seeds(ci_run):
    cfg, out, s = ci_run
    rec = read_results(out / "res.json")
    assert rec["experiment"] == "othello" and rec["seeds"] == [0, 1] and rec["command"] == "originlens test"
    assert set(rec["tests"]["hypotheses"]) == {h[0] for h in HYPOTHESES}
    t = rec["tests"]["hypotheses"]["direct: useful > useless"]
    useful = [s["per_seed"][x]["aggregates"]["1"]["means"]["main"]["real"]["direct"]["useful"]["mean"] for x in (0, 1)]
    useless = [
        s["per_seed"][x]["aggregates"]["1"]["means"]["main"]["real"]["direct"]["useless"]["mean"] for x in (0, 1)
    ]
    assert math.isclose(t["mean_diff"], float(np.mean(np.subtract(useful, useless))), rel_tol=1e-9)
    assert 0 <= rec["quality"]["legal_acc"]["low"] <= rec["quality"]["legal_acc"]["high"] <= 1
    assert rec["quality"]["probes"]["1"]["pearson"]["initial"]["n"] == 2  # the untrained null
    assert any(d == "steps 12 (paper 5000)" for d in rec["scale"]["deviations"])
    # the ci scale draws under half of its pool: the games drawn are hashed (the whole pool file otherwise)
    assert len(rec["data_hashes"]["seed-0"]["othello_pool_drawn_sha256"]) == 64
    # a model that does not play cannot reproduce the claim, whatever its influences
    assert judge(rec).verdict in ("not reproduced", "partial")


def _fake(holds: list[bool], acc: float) -> dict:
    return {
        "tests": {"hypotheses": {h[0]: {"holds": v} for h, v in zip(HYPOTHESES, holds)}},
        "quality": {"legal_acc": {"mean": acc}},
        "numbers": {"influence": {}},
        "seeds": [0, 1, 2],
        "scale": {"model": "m", "attribution": "a", "deviations": []},
    }


def test_verdict_rules():
    n = len(HYPOTHESES)
    assert judge(_fake([True] * n, 0.97)).verdict == "reproduced"
    v = judge(_fake([True] * n, 0.6))
    assert v.verdict == "partial" and "do not play" in v.ours
    assert judge(_fake([True] + [False] * (n - 1), 0.97)).verdict == "partial"
    assert judge(_fake([False] * n, 0.97)).verdict == "not reproduced"


def test_bad_configurations():
    with pytest.raises(ConfigError, match="unknown scale"):
        OthelloConfig(scale="big")
    with pytest.raises(ConfigError, match="override"):
        OthelloConfig(overrides={"width": 3})
    with pytest.raises(ConfigError, match="attribute_steps"):
        OthelloConfig(scale="ci", overrides={"attribute_steps": 999})
    with pytest.raises(ConfigError, match="layers"):
        OthelloConfig(scale="ci", layers=[5])


def test_recorded_updates_centre_each_block():
    from originlens.experiments.othello import recorded_updates

    assert recorded_updates(12, 1) == list(range(1, 13))
    assert recorded_updates(12, 3) == [2, 5, 8, 11]
    assert recorded_updates(200, 5) == list(range(3, 201, 5))
    with pytest.raises(ConfigError, match="record_every"):
        recorded_updates(10, 0)
    with pytest.raises(ConfigError, match="record_every"):
        OthelloConfig(scale="ci", overrides={"record_every": 0})


@pytest.mark.slow
def test_strided_recording_scales_the_sum_of_recorded_updates(ci_run, monkeypatch):
    """``record_every`` = 3: the aggregate is 3 × the sum over updates 2, 5, 8, 11 only — recomputed here
    from the store of the CI run (which recorded every update), filtered to those updates."""
    import pyarrow as pa
    import pyarrow.compute as pc

    import originlens.attribution.store as store_mod
    from originlens.experiments.othello import recorded_updates, seed_aggregates

    cfg, out, s = ci_run
    store = out / "exp" / "seed-0" / "run" / "attribution"
    table = load_observables(store)
    keep = pa.array(recorded_updates(12, 3), type=table["step"].type)
    sub = table.filter(pc.is_in(table["step"], value_set=keep))
    items: dict = {}
    for r in sub.to_pylist():
        if (
            r["type"] in (1, 2)
            and r["influence"] is not None
            and RANDOM_TAG not in r["feature"]
            and r["site_layer"] == 1
        ):
            key = (r["site_position"], r["feature"], r["type"], r["component"])
            items[key] = items.get(key, 0.0) + r["influence"]
    assert items
    monkeypatch.setattr(store_mod, "load_observables", lambda _path: sub)
    agg = seed_aggregates(store, 2, 12, [1.0], record_every=3)["1"]
    for comp in ("direct", "precached", "shared", "full"):
        for t, name in ((1, "useless"), (2, "useful")):
            vals = [3 * v for (i, f, ty, c), v in items.items() if c == comp and ty == t]
            got = agg["means"]["main"]["real"][comp][name]
            assert got["n_items"] == len(vals)
            assert math.isclose(got["mean"], float(np.mean(vals)), rel_tol=1e-9, abs_tol=1e-15)


@pytest.mark.slow
def test_parallel_seeds_match_the_serial_run(ci_run, tmp_path):
    """``jobs`` = 2 trains and attributes the seeds in two processes (one thread each): the same runs as
    the serial fixture up to thread-count round-off, and a rerun resumes everything."""
    cfg, out, s = ci_run
    par = OthelloConfig(scale="ci", seeds=[0, 1], overrides={"steps": 12, "eval_size": 120}, jobs=2)
    p = run_othello(par, tmp_path / "par", results=tmp_path / "par.json", command="originlens test")
    for seed in cfg.seeds:
        a = s["per_seed"][seed]["train"]["trained"]["final_eval"]
        b = p["per_seed"][seed]["train"]["trained"]["final_eval"]
        assert math.isclose(a["eval_loss"], b["eval_loss"], rel_tol=1e-4)
        ia = s["per_seed"][seed]["aggregates"]["1"]["means"]["main"]["real"]["full"]["useful"]
        ib = p["per_seed"][seed]["aggregates"]["1"]["means"]["main"]["real"]["full"]["useful"]
        assert ia["n_items"] == ib["n_items"] and math.isclose(ia["mean"], ib["mean"], rel_tol=1e-3, abs_tol=1e-12)
    again = run_othello(par, tmp_path / "par", results=tmp_path / "par.json", command="originlens test")
    assert again["per_seed"][0]["aggregates"] == p["per_seed"][0]["aggregates"]
    with pytest.raises(ConfigError, match="jobs"):
        OthelloConfig(scale="ci", jobs=0)


@pytest.mark.slow
def test_snapshots_are_rates_of_the_stored_sgd_influences(ci_run):
    """Each snapshot c: the SGD-variant segment c..c+K is stored, and its aggregate is the mean over items
    of (Σ recorded influences) / (number recorded), recomputed here from the raw rows; the quality at c
    is the eval record at step c (the untrained model's at c = 0)."""
    import json

    cfg, out, s = ci_run
    assert cfg.snapshot_window == 1 and cfg.snapshot_starts == list(range(10))
    for seed in cfg.seeds:
        run = out / "exp" / f"seed-{seed}" / "run"
        rows = load_observables(run / "attribution-snapshots").to_pylist()
        assert {r["optimizer"] for r in rows} == {"sgd"}
        assert sorted({r["step"] for r in rows}) == [c + 1 for c in cfg.snapshot_starts]
        for c in (0, 5, 9):
            items: dict = {}
            for r in rows:
                if (
                    c < r["step"] <= c + 1
                    and r["type"] in (1, 2)
                    and r["influence"] is not None
                    and RANDOM_TAG not in r["feature"]
                    and r["site_layer"] == 1
                ):
                    items.setdefault((r["site_position"], r["feature"], r["type"], r["component"]), []).append(
                        r["influence"]
                    )
            got = s["per_seed"][seed]["snapshots"][str(c)]
            assert got["updates"] == [c + 1, c + 1]
            for comp in ("direct", "precached", "shared"):
                vals = [np.mean(v) for (i, f, ty, cc), v in items.items() if cc == comp and ty == 2]
                g = got["means"]["main"]["real"][comp]["useful"]
                assert g["n_items"] == len(vals) > 0
                assert math.isclose(g["mean"], float(np.mean(vals)), rel_tol=1e-9, abs_tol=1e-15)
        evals = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        at5 = [e for e in evals if e.get("event") == "eval" and e["step"] == 5][-1]
        assert s["per_seed"][seed]["snapshot_eval"]["5"]["legal_acc"] == at5["legal_acc"]
        init = s["per_seed"][seed]["train"]["initial"]["final_eval"]["legal_acc"]
        assert s["per_seed"][seed]["snapshot_eval"]["0"]["legal_acc"] == init
    rec = read_results(out / "res.json")
    assert set(rec["numbers"]["snapshots"]) == {str(c) for c in cfg.snapshot_starts}
    assert set(rec["tests"]["snapshots"]["9"]) == {h[0] for h in HYPOTHESES}
    assert rec["numbers"]["snapshots"]["9"]["eval"]["legal_acc"]["n"] == 2
    assert any("SGD-variant influence" in d for d in rec["scale"]["deviations"])
    from originlens.experiments.othello import render_section

    text = "\n".join(render_section("othello/x", rec))
    assert "| checkpoint c | legal-move acc. at c |" in text and text.count("\n| 9 |") == 1


def test_snapshot_schedule():
    cfg = OthelloConfig(scale="cpu")
    assert cfg.checkpoint_every == 1200 and cfg.snapshot_window == 10
    assert cfg.snapshot_starts == [j * 1200 for j in range(10)]
    assert cfg.snapshot_recorded(1200) == [1201, 1203, 1205, 1207, 1209]
    off = OthelloConfig(scale="ci", overrides={"snapshot_updates": 0})
    assert off.snapshot_starts == [] and not any("SGD-variant" in d for d in off.deviations())
    with pytest.raises(ConfigError, match="snapshot_record_every"):
        OthelloConfig(scale="ci", overrides={"snapshot_record_every": 0})


def test_seed_records_combine_into_the_same_results(ci_run, tmp_path):
    """Each seed's values are written as a record beside the results file; combining the records (no run
    directories) gives the same numbers and tests as the run that made them, and a record of another
    configuration or a missing one is refused."""
    from originlens.errors import InputError
    from originlens.experiments.othello import read_seed_record, seed_record_path

    cfg, out, s = ci_run
    for seed in cfg.seeds:
        rec = read_seed_record(seed_record_path(out / "res.json", seed), cfg, seed)
        assert (
            rec["unit"] == f"seed-{seed}"
            and rec["values"]["train"]["trained"]["final_eval"] == s["per_seed"][seed]["train"]["trained"]["final_eval"]
        )
    comb = run_othello(
        cfg, tmp_path / "comb", results=out / "res.json", command="originlens combine", from_records=True
    )
    assert not (tmp_path / "comb" / "seed-0").exists()  # nothing trained
    again = read_results(out / "res.json")
    assert again["command"] == "originlens combine"
    assert comb["by_fraction"] == s["by_fraction"] and comb["quality"] == s["quality"]
    assert again["runs"][0]["commits"]["command"] == "originlens test"
    other = OthelloConfig(scale="ci", seeds=[0, 1], overrides={"steps": 14, "eval_size": 120})
    with pytest.raises(InputError, match="another configuration.*steps"):
        run_othello(other, tmp_path / "x", results=out / "res.json", from_records=True)
    more = OthelloConfig(scale="ci", seeds=[0, 1, 7], overrides={"steps": 12, "eval_size": 120})
    with pytest.raises(InputError, match="no record of seed-7"):
        run_othello(more, tmp_path / "y", results=out / "res.json", from_records=True)


def test_too_few_seeds_write_records_but_no_results_file_at_the_default_path(ci_run, tmp_path, monkeypatch):
    cfg, out, s = ci_run
    monkeypatch.chdir(tmp_path)
    one = OthelloConfig(scale="ci", seeds=[0], overrides={"steps": 12, "eval_size": 120})
    import shutil

    shutil.copytree(out / "exp" / "seed-0", tmp_path / "exp" / "seed-0")  # finished seed: resumes, no training
    r = run_othello(one, tmp_path / "exp", command="originlens test")
    assert r["results_file"] is None
    assert not (tmp_path / "results" / "othello" / "othello-ci.json").exists()
    assert (tmp_path / "results" / "othello" / "othello-ci" / "seed-0.json").is_file()
