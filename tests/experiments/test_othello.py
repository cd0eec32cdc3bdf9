"""The multi-seed Othello experiment over all of training: the strata (where their segments lie, the
carried first moment), the stratified estimate against a brute-force recomputation from the attribution
stores, the estimator check, the learning curve, the gates and the verdict, the records (one commit per
kind, one configuration), and the refusals."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from originlens.attribution.store import RANDOM_TAG, load_observables
from originlens.errors import ConfigError, InputError
from originlens.experiments import gates
from originlens.experiments.othello import run_othello
from originlens.experiments.othello_analysis import HYPOTHESES, across_seeds, collapsed_strata_se, learned_gate
from originlens.experiments.othello_config import OthelloConfig, segment_starts, stratum_bounds, stratum_segment
from originlens.experiments.othello_report import judge
from originlens.experiments.othello_strata import (
    STRATA_STORE,
    initial_mismatch,
    mismatch_record_path,
    stratum_record_path,
)
from originlens.experiments.results import read_results

SEEDS = [0, 1, 2]


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("oth")
    cfg = OthelloConfig(scale="ci", seeds=SEEDS)
    s = run_othello(cfg, out / "exp", results=out / "res" / "othello-ci.json", command="originlens test")
    return cfg, out, s


def test_strata_cover_training_and_segments_start_at_checkpoints_inside_them():
    cfg = OthelloConfig(scale="cpu", seeds=[0, 1, 2, 3, 4])
    bounds = [stratum_bounds(cfg, h) for h in range(10)]
    assert bounds[0][0] == 0 and bounds[-1][1] == 12000
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))  # contiguous, no overlap
    for h in range(10):
        assert segment_starts(cfg, h) == [1200 * h + 300 * u for u in range(4)]
        starts = set()
        for seed in range(5):
            c, end, recorded = stratum_segment(cfg, seed, h)
            lo, hi = bounds[h]
            assert lo <= c and end <= hi and c % 300 == 0
            assert recorded == list(range(c + 51, c + 101)) and end == c + 100
            starts.add(c)
        assert len(starts) > 1  # the seeds sample different parts of the stratum
    assert cfg.sampled_fraction() == pytest.approx(500 / 12000)


def test_bad_configurations():
    with pytest.raises(ConfigError, match="unknown scale"):
        OthelloConfig(scale="big")
    with pytest.raises(ConfigError, match="override"):
        OthelloConfig(overrides={"width": 3})
    with pytest.raises(ConfigError, match="layers"):
        OthelloConfig(scale="ci", layers=[5])
    with pytest.raises(ConfigError, match="burn_in"):  # the carried share would stay above 1 %
        OthelloConfig(scale="cpu", overrides={"burn_in": 20})
    with pytest.raises(ConfigError, match="leaves room"):  # a segment longer than a stratum
        OthelloConfig(scale="cpu", overrides={"stratum_updates": 1200})
    with pytest.raises(ConfigError, match="check positions"):
        OthelloConfig(scale="cpu", overrides={"check_positions": [30]})
    with pytest.raises(ConfigError, match="strata"):
        OthelloConfig(scale="ci", strata_run=[7])


def test_collapsed_strata_standard_error():
    assert collapsed_strata_se([1.0]) is None
    assert collapsed_strata_se([1.0, 3.0]) == pytest.approx(2.0)
    assert collapsed_strata_se([1.0, 3.0, 2.0, 2.0]) == pytest.approx(2.0)
    assert collapsed_strata_se([1.0, 3.0, 5.0]) == pytest.approx(np.sqrt(4 + 4 / 2))


@pytest.mark.slow
def test_the_stratified_estimate_equals_a_brute_force_recomputation(ci_run):
    """Per seed, the mean over items (k < L, real probes) of Σ_h (N_h / n_h) Σ_recorded I equals the
    results file's number, recomputed here from the attribution store's rows; random directions apart."""
    cfg, out, s = ci_run
    rec = read_results(out / "res" / "othello-ci.json")
    L = cfg.settings["n_layer"]
    by_seed = {r["seed"]: r["estimate"] for r in rec["runs"]}
    for seed in cfg.seeds:
        rows = load_observables(out / "exp" / f"seed-{seed}" / "run" / STRATA_STORE).to_pylist()
        weight = {}
        for h in range(cfg.settings["strata"]):
            c, end, recorded = stratum_segment(cfg, seed, h)
            lo, hi = stratum_bounds(cfg, h)
            for st in recorded:
                weight[st] = (hi - lo) / len(recorded)
        for comp in ("direct", "precached", "shared", "carried", "full"):
            for tau, tname in ((1, "useless"), (2, "useful")):
                items: dict = {}
                for r in rows:
                    if r["component"] != comp or r["type"] != tau or r["site_layer"] >= L or RANDOM_TAG in r["feature"]:
                        continue
                    key = (r["site_layer"], r["site_position"], r["feature"])
                    items[key] = items.get(key, 0.0) + weight[r["step"]] * (r["influence"] or 0.0)
                got = by_seed[seed]["means"]["main"]["real"][comp][tname]["mean"]
                assert got == pytest.approx(np.mean(list(items.values())), rel=1e-12, abs=1e-15)
    assert rec["numbers"]["sampled_fraction"] == pytest.approx(5 * 2 / 30)
    assert len(rec["numbers"]["attributed_updates"]) == 5 * len(SEEDS)


@pytest.mark.slow
def test_carried_segments_keep_the_real_update_and_the_check_compares_with_the_contiguous_integral(ci_run):
    cfg, out, s = ci_run
    rec = read_results(out / "res" / "othello-ci.json")
    chk = rec["numbers"]["check"]
    assert chk["seed"] == 0 and chk["updates"] == 12
    assert chk["burn_in"]["full_max_rel_diff"] < 1e-5  # float32 model: the components' JVPs round apart
    for c in ("direct", "precached", "shared", "full"):
        for t in ("useful", "useless"):
            v = chk["components"][c][t]
            assert v["exact"] is not None and v["stratified"] is not None
    for h in range(cfg.settings["strata"]):
        r = json.loads(stratum_record_path(out / "res" / "othello-ci.json", 0, h).read_text())
        checks = r["values"]["checks"]
        assert checks["adam_sum_max_rel_err"] < 1e-6 and (checks["losses_checked"] or checks["checkpoints_verified"])
        start = r["values"]["segment"][0]
        assert (checks["carried_share"]["first_recorded"] is None) == (start == 0)


@pytest.mark.slow
def test_results_file_curve_gates_and_verdict(ci_run):
    cfg, out, s = ci_run
    rec = read_results(out / "res" / "othello-ci.json")
    assert set(rec["tests"]["hypotheses"]) == {h[0] for h in HYPOTHESES}
    names = [g["name"] for g in rec["tests"]["gates"]]
    assert names == ["learned", "control", "detectable"]
    steps = [p["step"] for p in rec["numbers"]["curve"]["points"]]
    assert steps[0] == 0 and steps[-1] == 30 and steps == sorted(steps)
    final = rec["numbers"]["curve"]["points"][-1]
    assert set(final["probes"]) == {"1", "2"} and final["n_seeds"] == 3
    assert rec["tests"]["detectable_dz"] == pytest.approx(gates.detectable_dz(3))
    v = judge(rec)
    assert v.verdict == "not tested"  # three seeds of a 30-step plumbing check: the gates must say so
    assert (out / "exp" / "report.html").is_file()


@pytest.mark.slow
def test_the_mismatch_record_and_the_normalised_control(ci_run):
    """The mismatch record's R(θ₀) is measured at the initialisation, also when the replay had restored a
    later checkpoint before (``restore(0)`` returns to θ₀); the control on the scale of each direction's own
    mismatch equals its recomputation from the records: per seed, the mean over types of the mean over main
    items of (stratified integral of ``full``) / R(θ₀), real vs random."""
    from originlens.attribution.run import RunReplay

    cfg, out, s = ci_run
    res = out / "res" / "othello-ci.json"
    rec = read_results(res)
    L = cfg.settings["n_layer"]
    run = RunReplay(out / "exp" / "seed-0" / "run")
    sites = [(k, i) for k in cfg.attr_layers for i in sorted(cfg.settings["positions"])]
    feats = [f for f in run.task.tracked.features if f in run.probes.feature_names]
    fresh = initial_mismatch(run, sites, feats, random_directions=cfg.random_directions)
    assert run.restore(max(run.checkpoints)) == max(run.checkpoints)
    again = initial_mismatch(run, sites, feats, random_directions=cfg.random_directions)
    recorded = json.loads(mismatch_record_path(res, 0).read_text())["values"]
    assert again["real"] == fresh["real"] == recorded["real"] and again["random"] == recorded["random"]
    real_n, rand_n = [], []
    for seed in cfg.seeds:
        m = json.loads(mismatch_record_path(res, seed).read_text())["values"]
        assert set(m["random"]) == set(m["real"]) and all(v > 0 for d in m["random"].values() for v in d.values())
        strata = [
            json.loads(stratum_record_path(res, seed, h).read_text())["values"] for h in range(cfg.settings["strata"])
        ]
        per_kind = []
        for field, r0 in (("items", m["real"]), ("random", m["random"])):
            by_type = []
            for t in ("useless", "useful"):
                ratios = []
                for k in r0:
                    seen = [st[field][k]["full"][t] for st in strata if t in st[field].get(k, {}).get("full", {})]
                    if int(k.split(".")[0]) >= L or t not in r0[k] or not seen:
                        continue  # items with no row of type t in any stratum have no integral of it
                    total = sum(st["weight"] * st[field].get(k, {}).get("full", {}).get(t, 0.0) for st in strata)
                    ratios.append(total / r0[k][t])
                by_type.append(np.mean(ratios))
            per_kind.append(np.mean(by_type))
        real_n.append(per_kind[0])
        rand_n.append(per_kind[1])
    ctn = rec["tests"]["control_normalised"]
    assert ctn["real"]["values"] == pytest.approx(real_n, rel=1e-10)
    assert ctn["random"]["values"] == pytest.approx(rand_n, rel=1e-10)
    assert ctn["mean_diff"] == pytest.approx(np.mean(np.subtract(real_n, rand_n)), rel=1e-9, abs=1e-12)
    assert "own initial mismatch" in next(g for g in rec["tests"]["gates"] if g["name"] == "control")["reason"]


@pytest.mark.slow
def test_records_combine_without_run_directories_and_refuse_mixed_commits(ci_run, tmp_path):
    cfg, out, s = ci_run
    res = tmp_path / "res"
    shutil.copytree(out / "res", res)
    again = run_othello(cfg, tmp_path / "exp", results=res / "othello-ci.json", stage="combine", command="c")
    a = read_results(out / "res" / "othello-ci.json")
    b = read_results(again["results_file"])
    assert a["numbers"]["influence"] == b["numbers"]["influence"] and a["tests"] == b["tests"]
    path = stratum_record_path(res / "othello-ci.json", 1, 2)
    r = json.loads(path.read_text())
    r["git_commit"] = "0" * 40
    path.write_text(json.dumps(r))
    with pytest.raises(InputError, match="different commits"):
        run_othello(cfg, tmp_path / "exp", results=res / "othello-ci.json", stage="combine", command="c")
    r["config_key"]["attribution"]["burn_in"] = 7
    path.write_text(json.dumps(r))
    with pytest.raises(InputError, match="another configuration"):
        run_othello(cfg, tmp_path / "exp", results=res / "othello-ci.json", stage="combine", command="c")
    path.unlink()
    with pytest.raises(InputError, match="no record of stratum-1-2"):
        run_othello(cfg, tmp_path / "exp", results=res / "othello-ci.json", stage="combine", command="c")


def test_the_stratum_stage_needs_a_trained_seed(tmp_path):
    cfg = OthelloConfig(scale="ci", seeds=[0])
    with pytest.raises(InputError, match="not trained"):
        run_othello(cfg, tmp_path / "exp", results=tmp_path / "r.json", stage="stratum")


@pytest.mark.slow
def test_a_checkpoint_without_optimizer_state_is_refused(ci_run, tmp_path):
    from safetensors.numpy import load_file, save_file

    cfg, out, s = ci_run
    exp = tmp_path / "exp"
    shutil.copytree(out / "exp" / "seed-1", exp / "seed-1")
    shutil.rmtree(exp / "seed-1" / "run" / STRATA_STORE)
    c, _, _ = stratum_segment(cfg, 1, 3)
    ck = exp / "seed-1" / "run" / "checkpoints" / f"step-{c:06d}.safetensors"
    from safetensors import safe_open

    with safe_open(ck, "np") as f:
        meta = f.metadata()
    arrays = {k: v for k, v in load_file(ck).items() if not k.startswith("adam.")}
    save_file(arrays, ck, metadata=meta)
    one = OthelloConfig(scale="ci", seeds=[1], strata_run=[3])
    with pytest.raises(Exception, match="(?i)adam|optimizer"):
        run_othello(one, exp, results=tmp_path / "res" / "othello-ci.json", stage="stratum")


# ----------------------------------------------------------------------------------------------------
# the gates on synthetic seeds


def _seed(real_full: float, rand_full: float, r_at: float, r_null: float, shift: float) -> dict:
    """Synthetic per-seed values: item means of every component and type, one stratum's curve."""

    def means(kind_full):
        comps = {
            "direct": {"useful": 2.0 + shift, "useless": -0.5 + shift},
            "precached": {"useful": -0.2 + shift, "useless": 0.6 + shift},
            "shared": {"useful": 3.0 + shift, "useless": 2.0 + shift},
            "carried": {"useful": 0.0, "useless": 0.0},
            "full": {"useful": kind_full + shift, "useless": kind_full - 1 + shift},
        }
        return {c: {t: {"mean": v, "se": 0.1} for t, v in ts.items()} for c, ts in comps.items()}

    probes = {str(k): {"pearson": r_at + 0.01 * k} for k in (1, 2, 3)}
    null = {str(k): {"pearson": r_null} for k in (1, 2, 3)}
    return {
        "estimate": {
            "means": {"main": {"real": means(real_full), "random": means(rand_full)}},
            "normalised": {},
            "per_stratum": {"0": {"bounds": [0, 10], "rate": {"full": {"useful": 1.0, "useless": 1.0}}}},
        },
        "strata": {0: {"curve": {"start": {"step": 5, "probes": probes}}}},
        "train": {"initial_probes": null},
    }


SHIFTS = [0.0, 0.11, -0.07, 0.05, -0.13]


def _gates(real_full, rand_full, r_at, r_null, n=5):
    per_seed = {s: _seed(real_full, rand_full, r_at + 0.01 * s, r_null, SHIFTS[s]) for s in range(n)}
    stats = across_seeds(per_seed, 0.95)
    learned, _ = learned_gate(per_seed, 4, 0)
    control = gates.control(stats["control"]["holds"], "synthetic")
    held = sum(t["holds"] for t in stats["tests"].values())
    detect = gates.detectable(n, negative=held < len(stats["tests"]))
    return learned, control, detect, stats


def test_gates_trip_on_synthetic_records_and_pass_on_a_good_one():
    learned, control, detect, stats = _gates(5.0, 0.1, 0.5, 0.2)
    assert learned.passed and control.passed and detect.passed
    assert sum(t["holds"] for t in stats["tests"].values()) == len(HYPOTHESES)
    learned, *_ = _gates(5.0, 0.1, 0.15, 0.2)  # probes at the window no better than the untrained model
    assert not learned.passed and "not learned" in learned.reason
    _, control, *_ = _gates(0.1, 5.0, 0.5, 0.2)  # random directions get more than the real probes
    assert not control.passed and "control fails" in control.reason
    assert not gates.detectable(3, negative=True).passed  # 3 seeds: d_z* 2.30 > 2.0, a null result unreadable
    assert gates.detectable(3, negative=False).passed  # a detected effect stands
    assert gates.detectable(5, negative=True).passed


def _record(gate_list, held):
    tests = {h[0]: {"holds": ok, "p_holm": 0.01 if ok else 0.5} for h, ok in zip(HYPOTHESES, held)}
    ci = {"mean": 1.0, "low": 0.5, "high": 1.5}
    return {
        "numbers": {
            "strata": {},
            "influence": {
                "main": {"real": {c: {"useful": ci, "useless": ci} for c in ("direct", "precached", "shared")}}
            },
        },
        "tests": {"hypotheses": tests, "gates": [g.to_dict() for g in gate_list], "detectable_dz": 1.36},
        "quality": {"legal_acc": {"mean": 0.96}},
        "scale": {"model": "4 layers", "attribution": "strata", "deviations": []},
        "seeds": [0, 1, 2, 3, 4],
    }


def test_verdict_rules_behind_the_gates():
    ok = [gates.learned(True, "x"), gates.control(True, "y"), gates.detectable(5, negative=False)]
    n = len(HYPOTHESES)
    assert judge(_record(ok, [True] * n)).verdict == "reproduced"
    assert judge(_record(ok, [True] + [False] * (n - 1))).verdict == "partial"
    assert judge(_record(ok, [False] * n)).verdict == "not reproduced"
    for bad in (gates.learned(False, "r 0.2 vs 0.26"), gates.control(False, "p 0.87")):
        v = judge(_record([bad, *ok[1:]], [True] * n))
        assert v.verdict == "not tested" and bad.reason in v.ours


def test_the_earlier_prefix_design_is_judged_not_tested():
    """A results file of the prefix design (updates 1..200, no strata) reads as not tested, its reason — the
    window, the probes against their untrained null, the control — in the row."""
    probe = {"pearson": {"trained": {"mean": 0.55}, "initial": {"mean": 0.26}}}
    rec = {
        "numbers": {"influence": {}},
        "quality": {"probes": {"1": probe, "4": {"pearson": {"trained": {"mean": 0.38}, "initial": {"mean": 0.25}}}}},
        "tests": {"null": {"direct": {"p_t": 0.87}}},
        "scale": {
            "model": "4 layers, d = 128",
            "attribution": "Adam variant, updates 1..200",
            "deviations": ["influence integrated over updates 1..200 (paper: all of training)"],
        },
        "seeds": [0, 1, 2],
    }
    v = judge(rec)
    assert v.verdict == "not tested" and "1..200" in v.ours and "0.38–0.55" in v.ours and "p 0.87" in v.ours
