"""The leading-term horizon experiment: the log–log fit against a direct least-squares computation,
horizons from the logged series, early stop, censoring, reuse of finished runs, results and verdict."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from originlens.errors import ConfigError
from originlens.experiments import horizon as H
from originlens.experiments.horizon_analysis import fit_horizon
from originlens.experiments.horizon_config import HorizonConfig
from originlens.experiments.horizon_report import judge, render_section
from originlens.experiments.persistence_cosines import KINDS, THRESHOLDS
from originlens.experiments.results import read_results


def test_fit_recovers_a_power_law_and_matches_least_squares():
    rng = np.random.default_rng(0)
    pts = [
        (v, t, 0.3 * v**0.8 * t**-0.5 * math.exp(0.05 * rng.standard_normal()))
        for v in (100, 200, 400, 800)
        for t in (16, 32)
        for _ in range(3)
    ]
    fit = fit_horizon(pts)
    X = np.array([[1, math.log(v), math.log(t)] for v, t, _ in pts])
    y = np.log([h for *_, h in pts])
    beta = np.linalg.solve(X.T @ X, X.T @ y)
    resid = y - X @ beta
    se = np.sqrt(np.diag(resid @ resid / (len(y) - 3) * np.linalg.inv(X.T @ X)))
    for c, b, e in zip(("intercept", "ln |V|", "ln T"), beta, se):
        assert math.isclose(fit["coef"][c]["estimate"], b, rel_tol=1e-9)
        assert math.isclose(fit["coef"][c]["se"], e, rel_tol=1e-9)
    assert (
        abs(fit["coef"]["ln |V|"]["estimate"] - 0.8) < 0.05
        and fit["coef"]["ln |V|"]["low"] < 0.8 < fit["coef"]["ln |V|"]["high"]
    )
    pred = fit["prediction_paper_point"]
    assert pred["low"] < 0.3 * 3000**0.8 * 200**-0.5 < pred["high"]
    # one T: only the |V| exponent; censored (None) points are left out; too few points: no fit
    one = fit_horizon([(v, 16, 2.0 * v) for v in (10, 20, 40)] + [(80, 16, None)])
    assert one["terms"] == ["intercept", "ln |V|"] and one["n"] == 3
    assert math.isclose(one["coef"]["ln |V|"]["estimate"], 1.0, rel_tol=1e-9)
    assert fit_horizon([(10, 16, 1.0), (20, 16, 2.0)])["coef"] is None


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("hz")
    cfg = HorizonConfig(scale="ci", seeds=[0, 1], overrides={"seq_lens": [8], "max_steps": 20})
    return cfg, out, H.run_horizon(cfg, out / "exp", results=out / "res.json", command="originlens test")


@pytest.mark.slow
def test_horizons_come_from_the_logged_cosines_and_runs_stop_when_all_dropped(ci_run):
    cfg, out, s = ci_run
    assert len(s["runs"]) == 4
    for r in s["runs"]:
        d = out / "exp" / f"V{r['requested_vocab']}-T{r['seq_len']}" / f"seed-{r['seed']}"
        recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
        cos = [q for q in recs if q.get("event") == "cosines"]
        assert [q["step"] for q in cos] == list(range(1, r["steps_run"] + 1))
        for k in KINDS:
            for th in THRESHOLDS:
                below = [q["step"] for q in cos if q["lt"][k] is not None and q["lt"][k] < th]
                assert r["horizon"][k][f"{th:g}"] == (below[0] if below else None)
                vals = [(q["step"], q["lt"][k]) for q in cos if q["lt"][k] is not None]
                stay = [s for i, (s, _) in enumerate(vals) if all(c < th for _, c in vals[i:])]
                assert r["sustained"][k][f"{th:g}"] == (stay[0] if stay else None)
        last = cos[-1]["lt"]
        if r["steps_run"] < cfg.settings["max_steps"]:  # stopped early: everything below 0.7 ...
            assert all(last[k] < min(THRESHOLDS) for k in KINDS)
            prev = cos[-2]["lt"]  # ... for the first time at that step
            assert not all(prev[k] is not None and prev[k] < min(THRESHOLDS) for k in KINDS)
    rec = read_results(out / "res.json")
    assert rec["name"] == "horizon-ci" and rec["experiment"] == "leading-terms"
    fit = rec["numbers"]["fits"]["W_O"]["0.9"]
    assert fit["n"] + fit["censored"] == 4
    assert set(rec["numbers"]["fits_sustained"]) == set(KINDS)
    for k in KINDS:  # per-seed exponents: one fit per seed with enough uncensored cells
        per = rec["numbers"]["fits"][k]["0.9"]["per_seed"]["ln |V|"]
        assert per["n"] <= 2 and (per["n"] < 2 or per["low"] <= per["mean"] <= per["high"])
    text = "\n".join(render_section("leading-terms/horizon-ci", rec))
    assert "| weight | θ | runs fitted |" in text and "| V40-T8 |" in text
    assert judge(rec).verdict in ("reproduced", "partial", "not reproduced")


@pytest.mark.slow
def test_finished_runs_are_reused(ci_run):
    cfg, out, s = ci_run
    again = H.run_horizon(cfg, out / "exp", results=out / "res2.json", command="t")
    assert again["runs"] == s["runs"]


def test_sustained_horizon_ignores_a_dip_that_recovers():
    from originlens.experiments.persistence_cosines import horizon, sustained_horizon

    series = [(1, None), (2, 0.98), (3, 0.995), (4, 0.97), (5, None), (6, 0.95)]
    assert horizon(series, 0.99) == 2 and sustained_horizon(series, 0.99) == 4
    assert sustained_horizon(series, 0.9) is None and sustained_horizon([(1, 0.5), (2, 0.95)], 0.9) is None
    assert sustained_horizon([(1, 0.5), (2, 0.4)], 0.9) == 1


def test_verdict_and_bad_configurations():
    def rec(lows, per_seed=True):
        def fit(lo):
            f = {"coef": {"ln |V|": {"estimate": -5.0, "low": -6.0, "high": -4.0}}}  # pooled: ignored
            if per_seed:
                f["per_seed"] = {"ln |V|": {"n": 3, "mean": lo + 0.1, "low": lo, "high": lo + 0.2}}
            else:
                f["coef"]["ln |V|"] = {"estimate": lo + 0.1, "low": lo, "high": lo + 0.2}
            return f

        return {
            "numbers": {"fits": {k: {"0.9": fit(lo)} for k, lo in zip(KINDS, lows)}},
            "scale": {"model": "m", "training": "t", "grid": "g"},
        }

    for per_seed in (True, False):  # per-seed intervals decide; records without them fall back to the pooled fit
        assert judge(rec([0.1, 0.2, 0.3], per_seed)).verdict == "reproduced"
        assert judge(rec([0.1, -0.2, 0.3], per_seed)).verdict == "partial"
        assert judge(rec([-0.1, -0.2, -0.3], per_seed)).verdict == "not reproduced"
    with pytest.raises(ConfigError, match="vocab_sizes"):
        HorizonConfig(overrides={"vocab_sizes": [1]})
    with pytest.raises(ConfigError, match="lr"):
        HorizonConfig(overrides={"lr": -1.0})
    with pytest.raises(ConfigError, match="override"):
        HorizonConfig(overrides={"width": 2})


def test_grid_filled_a_few_cells_at_a_time_combines_from_records(ci_run, tmp_path):
    """Cells run in separate calls (one |V| each) write unit records; from_records fits the whole grid from
    them with the numbers of the run that trained it at once."""
    from originlens.errors import InputError

    cfg, out, s = ci_run
    res = tmp_path / "res.json"
    for V in cfg.settings["vocab_sizes"]:
        part = HorizonConfig(scale="ci", seeds=[0, 1], overrides={"seq_lens": [8], "max_steps": 20, "vocab_sizes": [V]})
        H.run_horizon(part, out / "exp", results=res, command="part")  # finished runs are reused, not retrained
    comb = H.run_horizon(cfg, tmp_path / "comb", results=res, command="combine", from_records=True)
    assert comb["cells"] == s["cells"] and comb["fits"] == s["fits"]
    # a record written before the sustained horizon existed: filled in from its run directory, if present
    from originlens.experiments.records import record_path
    from originlens.storage import atomic_write_json, read_json

    p = record_path(res, H.unit_name(cfg.settings["vocab_sizes"][0], 8, 0))
    old = read_json(p)
    del old["values"]["sustained"]
    atomic_write_json(p, old)
    again = H.run_horizon(cfg, out / "exp", results=res, command="combine", from_records=True)
    assert again["fits_sustained"] == s["fits_sustained"]
    with pytest.raises(InputError, match="sustained"):
        H.run_horizon(cfg, tmp_path / "elsewhere", results=res, command="combine", from_records=True)
    with pytest.raises(InputError, match="another configuration"):
        H.run_horizon(
            HorizonConfig(scale="ci", seeds=[0, 1], overrides={"seq_lens": [8], "max_steps": 21}),
            tmp_path / "x",
            results=res,
            from_records=True,
        )
