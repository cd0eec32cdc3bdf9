"""The TinyStories experiment (arXiv 2603.14087 §6.4, §8) end to end at the ``ci`` scale on a temporary data
root of storyworld stories with their gold tags: both regimes, two seeds, initial-model nulls, attribution,
the results file, the per-group aggregation against a brute-force sum over the attribution store, the
structural zeros of pre-caching (k = L, myopic training), continuations, the verdict rules, and bad input
refused before anything is written."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from originlens.data import generate_stories
from originlens.errors import ConfigError
from originlens.experiments import language_config as lang
from originlens.experiments.language import run_language_experiment
from originlens.experiments.language_analysis import COMPONENTS, LOSS_TEST, SHARE_TEST, SYNTAX_TEST, influence_by_group
from originlens.experiments.language_config import LanguageExperimentConfig
from originlens.experiments.language_continuations import continuations
from originlens.experiments.language_report import judge_features, judge_loss, render_section
from originlens.experiments.results import read_results

SEEDS = [0, 1]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    (root / "tinystories").mkdir()
    (root / "tinystories" / "stories-000.txt").write_text("\n".join(generate_stories(240, seed=5)) + "\n")
    return root


def _opts(root):
    return {"data_root": str(root), "cache_dir": str(root / "cache")}


@pytest.fixture(scope="module")
def experiment(data_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("exp")
    cfg = LanguageExperimentConfig(scale="ci", seeds=SEEDS, annotator="gold", task_options=_opts(data_root))
    summary = run_language_experiment(cfg, out / "exp", results=out / "res.json", command="originlens test")
    return cfg, out, summary, read_results(out / "res.json")


def test_results_file_records_what_ran(experiment):
    cfg, out, summary, rec = experiment
    assert rec["experiment"] == "language" and rec["name"] == "tinystories-ci"
    assert rec["command"] == "originlens test" and rec["seeds"] == SEEDS
    assert cfg.attribute_positions == [8, 12] and cfg.attribute_layers == [1, 2]
    assert cfg.attribute_regimes == ["standard", "myopic"] and cfg.syntax_labels == "all"
    dev = rec["scale"]["deviations"]
    assert "n_layer 2 (paper 4)" in dev and "2 seeds (paper 10)" in dev and "window T = 24 (paper 64)" in dev
    assert any(d.startswith("tokenizer: a 256-id BPE") for d in dev)
    assert any(d.startswith("data: the 240 stories") for d in dev)
    assert rec["config"]["ntp"]["task"] == "tinystories" and rec["config"]["ntp"]["task_options"]["annotator"] == "gold"
    h = rec["data_hashes"]
    assert len(h["standard/seed-0"]["eval_tokens_sha256"]) == 64
    assert h["standard/seed-0"] == h["myopic/seed-0"] != h["standard/seed-1"]  # paired by seed
    assert len(h["tinystories"]["tokenisation_key"]) == 64 and h["tinystories"]["files"][0]["name"] == "stories-000.txt"
    for regime in ("standard", "myopic"):
        q = rec["quality"][regime]["eval_loss"]
        assert q["n"] == 2 and q["low"] <= q["mean"] <= q["high"]
        # 4 updates on a 256-id vocabulary: the loss is near ln V and below the untrained model's
        assert rec["quality"][regime]["initial_eval_loss"]["mean"] > q["mean"] - 0.05
        probes = rec["numbers"]["probes"][regime]
        assert set(probes["probe"]) == {"tags", "deps", "position"}
        assert all(-1 <= c["low"] <= c["high"] <= 1 for c in probes["probe"].values())
        assert set(probes["initial_probe"]) == {"tags", "deps", "position"}
        assert set(rec["numbers"]["influence"][regime]["influence"]) == {"syntax", "position"}
    t = rec["tests"]["loss"][LOSS_TEST]
    assert t["n"] == 2 and t["alternative"] == "greater" and t["scale"] == "raw" and "power" in t and "holds" in t
    for k in (SYNTAX_TEST, SHARE_TEST):
        v = rec["tests"]["features"][k]
        assert v["n"] == 2 and (v["p_holm"] is None or v["p_holm"] >= v["p_t"]) and "power" in v
    assert len(rec["runs"]) == 4 and all(r["attribution"] is not None for r in rec["runs"])
    exp = out / "exp"
    assert (exp / "report.html").is_file() and (exp / "experiment.json").is_file()
    assert (exp / "initial" / "myopic" / "seed-1" / "probe_metrics.npz").is_file()


def _brute_force(store, n_layer):
    """Σ over steps per (layer, position, feature, component), straight from the Parquet rows."""
    sums: dict[tuple, float] = {}
    for f in sorted(store.glob("segment-*.parquet")):
        for r in pq.read_table(f).to_pylist():
            if r["type"] is not None or r["influence"] is None:
                continue
            key = (r["site_layer"], r["site_position"], r["feature"], r["component"])
            sums[key] = sums.get(key, 0.0) + r["influence"]
    return sums


def _group(feature):
    return "syntax" if feature.startswith(("tag_", "dep_")) else "position"


def test_group_influence_equals_a_brute_force_sum_over_the_store(experiment):
    cfg, out, _, rec = experiment
    L = 2
    for run in rec["runs"]:
        sums = _brute_force(out / "exp" / "trained" / run["regime"] / f"seed-{run['seed']}" / "attribution", L)
        assert {k[0] for k in sums} == {1, 2} and {k[1] for k in sums} == {8, 12}
        assert len({k[2] for k in sums}) == 22  # 10 tags, 10 labels, 2 positions
        got = run["attribution"]
        for g in ("syntax", "position"):
            for c in COMPONENTS:
                layers = (1,) if c == "precached" else (1, 2)
                vals = [v for (k, i, f, comp), v in sums.items() if comp == c and _group(f) == g and k in layers]
                assert got["influence"][g][c] == pytest.approx(sum(vals) / len(vals), rel=1e-9, abs=1e-300)
                last = [v for (k, i, f, comp), v in sums.items() if comp == c and _group(f) == g and k == L]
                assert got["last_layer"][g][c] == pytest.approx(sum(last) / len(last), rel=1e-9, abs=1e-300)
            b = {
                c: sum(v for (k, i, f, comp), v in sums.items() if comp == c and _group(f) == g and k < L)
                / sum(1 for (k, i, f, comp) in sums if comp == c and _group(f) == g and k < L)
                for c in ("direct", "precached", "shared")
            }
            share = b["precached"] / (abs(b["direct"]) + abs(b["precached"]) + abs(b["shared"]))
            assert got["precached_share"][g] == pytest.approx(share, rel=1e-9, abs=1e-300)
        # G_pre ≡ 0 at k = L (nothing but the loss at i reads r^L_i), and everywhere under myopic training
        scale = max(abs(v) for (k, i, f, comp), v in sums.items() if comp == "direct")
        zero = [
            v for (k, i, f, comp), v in sums.items() if comp == "precached" and (k == L or run["regime"] == "myopic")
        ]
        assert zero and all(abs(v) <= 1e-12 * scale for v in zero)
        if run["regime"] == "standard":  # pre-caching does act below the last layer
            assert any(abs(v) > 1e-9 * scale for (k, i, f, comp), v in sums.items() if comp == "precached" and k < L)
    # over seeds: the interval is of the per-seed values
    for regime in ("standard", "myopic"):
        ci = rec["numbers"]["influence"][regime]["influence"]["syntax"]["direct"]
        per_seed = [r["attribution"]["influence"]["syntax"]["direct"] for r in rec["runs"] if r["regime"] == regime]
        assert ci["values"] == pytest.approx(per_seed) and ci["n"] == 2
    myo = rec["numbers"]["influence"]["myopic"]
    assert myo["precached_share"]["position"]["mean"] == pytest.approx(0.0, abs=1e-12)


def test_influence_by_group_on_hand_made_rows():
    def row(k, f, c, v, ty=None):
        return {"site_layer": k, "site_position": 5, "feature": f, "type": ty, "component": c, "integrated": v}

    rows = [
        row(1, "tag_NN", "direct", 4.0),
        row(2, "tag_NN", "direct", 2.0),
        row(1, "tag_NN", "precached", -1.0),
        row(2, "tag_NN", "precached", 0.0),
        row(1, "tag_NN", "shared", 1.0),
        row(2, "tag_NN", "shared", 5.0),
        row(1, "pos_int", "direct", 1.0),
        row(1, "pos_int", "precached", 3.0),
        row(1, "pos_int", "shared", 0.0),
        row(1, "tag_NN~random0", "direct", 99.0),
        row(1, "tag_NN", "direct", 99.0, ty=1),
        row(1, "dep_det", "direct", None),
    ]
    agg = influence_by_group(rows, n_layer=2)
    assert agg["influence"]["syntax"]["direct"] == 3.0  # mean over k = 1, 2 (nulls, randoms, typed rows out)
    assert agg["influence"]["syntax"]["precached"] == -1.0  # k < L only
    assert agg["last_layer"]["syntax"] == {"direct": 2.0, "precached": 0.0, "shared": 5.0, "full": None}
    assert agg["precached_share"]["syntax"] == pytest.approx(-1.0 / (4.0 + 1.0 + 1.0))
    assert agg["precached_share"]["position"] == pytest.approx(3.0 / 4.0)
    assert agg["influence"]["position"]["shared"] == 0.0 and agg["last_layer"]["position"]["direct"] is None
    assert agg["n_items"]["syntax"] == {"all": 2, "below": 1, "last": 1}
    assert agg["by_feature"]["tag_NN"] == {"direct": 3.0, "precached": -1.0, "shared": 3.0}
    assert "tag_NN~random0" not in agg["by_feature"] and "dep_det" not in agg["by_feature"]


def test_continuations_are_stored_and_reproducible(experiment):
    cfg, out, summary, rec = experiment
    conts = rec["continuations"]
    assert len(conts) == 2 and all(c["seed"] == 0 and c["new_tokens"] == 12 for c in conts)
    for c in conts:
        assert c["prompt"].strip() and c["prompt_tokens"] == 12
        assert set(c["continuations"]) == {"standard", "myopic"}
        for v in c["continuations"].values():
            assert v["greedy"].strip() and v["sampled"].strip()
    assert continuations(cfg, out / "exp") == conts  # greedy and seeded sampling
    md = (out / "exp" / "report.md").read_text()
    assert "Continuations of held-out stories" in md and conts[0]["continuations"]["myopic"]["sampled"] in md


def test_rerun_trains_nothing_and_the_cli_reproduces_the_numbers(experiment, data_root, capsys, monkeypatch):
    import sys

    from originlens.cli.main import main

    cfg, out, first, rec = experiment
    argv = [
        "ntp",
        "experiment",
        "tinystories",
        "--scale",
        "ci",
        "--seeds",
        "0-1",
        "--annotator",
        "gold",
        "--out",
        str(out / "exp"),
        "--results",
        str(out / "cli.json"),
        "--task-option",
        f"data_root={data_root}",
        "--task-option",
        f"cache_dir={data_root / 'cache'}",
    ]
    monkeypatch.setattr(sys, "argv", ["originlens", *argv])  # the command line the results file records
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "syntax: direct > precached" in printed and "report.html" in printed
    again = read_results(out / "cli.json")
    assert again["command"].startswith("originlens ntp experiment tinystories --scale ci")
    assert again["tests"] == rec["tests"] and again["numbers"] == rec["numbers"]
    assert again["continuations"] == rec["continuations"]
    s = run_language_experiment(cfg, out / "exp", results=out / "res3.json", command="x")
    assert s["done_this_call"] == []


def test_a_stored_attribution_of_other_sites_is_refused(experiment, data_root):
    from originlens.errors import CompatibilityError

    cfg, out, _, _ = experiment
    other = LanguageExperimentConfig(
        scale="ci", seeds=SEEDS, annotator="gold", task_options=_opts(data_root), attribute_layers=[1]
    )
    with pytest.raises(CompatibilityError, match="at sites"):
        run_language_experiment(other, out / "exp", results=out / "other.json")
    assert not (out / "other.json").exists()


def test_render_section_lists_tables_tests_and_continuations(experiment):
    _, _, _, rec = experiment
    lines = render_section("language/tinystories-ci", rec)
    text = "\n".join(lines)
    assert lines[0] == "### tinystories-ci (`results/language/tinystories-ci.json`)"
    assert "- command: `originlens test`" in lines and "- seeds: 0, 1" in lines
    assert any(x.startswith("- deviations from the paper: n_layer 2 (paper 4)") for x in lines)
    for needle in (
        "| standard | ",
        "| myopic | ",
        "| standard | syntax | ",
        "| myopic | position | ",
        f"| {LOSS_TEST} | loss | ",
        f"| {SYNTAX_TEST} | features | ",
        f"| {SHARE_TEST} | features | ",
        "| prompt | regime | greedy | sampled |",
        "2.53 ± 0.10",
    ):
        assert needle in text, needle
    assert render_section("language/tinystories-ci", rec) == lines  # deterministic


def _record(loss_holds, syntax_holds, share_holds, with_attr=True):
    ci = {"n": 3, "mean": 1.0, "low": 0.5, "high": 1.5}

    def test(h):
        return {"n": 3, "p_t": 0.01 if h else 0.4, "p_holm": 0.02 if h else 0.4, "holds": h, "power": 0.9}

    rec = {
        "seeds": [0, 1, 2],
        "scale": {"model": "4 layers", "training": "Adam", "deviations": ["3 seeds (paper 10)"]},
        "quality": {"standard": {"eval_loss": ci}, "myopic": {"eval_loss": {**ci, "mean": 2.0}}},
        "tests": {"loss": {LOSS_TEST: test(loss_holds)}, "features": {}},
        "numbers": {"influence": {}},
    }
    if with_attr:
        rec["tests"]["features"] = {SYNTAX_TEST: test(syntax_holds), SHARE_TEST: test(share_holds)}
        rec["numbers"]["influence"]["standard"] = {
            "influence": {"syntax": {"direct": ci, "precached": ci}},
            "precached_share": {"syntax": ci, "position": ci},
        }
    return rec


def test_judges_on_hand_made_records():
    assert judge_loss(_record(True, True, True)).verdict == "reproduced"
    v = judge_loss(_record(False, True, True))
    assert v.verdict == "not reproduced" and "myopic" in v.ours and "3 seeds" in v.scale
    assert judge_features(_record(True, True, True)).verdict == "reproduced"
    assert judge_features(_record(True, True, False)).verdict == "partial"
    assert judge_features(_record(True, False, True)).verdict == "partial"
    assert judge_features(_record(True, False, False)).verdict == "not reproduced"
    assert judge_features(_record(True, True, True, with_attr=False)).verdict == "not yet run"
    no_myopic = _record(True, True, True)
    del no_myopic["quality"]["myopic"], no_myopic["tests"]["loss"][LOSS_TEST]
    assert judge_loss(no_myopic).verdict == "not yet run"


def _spacy_installed() -> bool:
    try:
        import spacy  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"annotator": "lingua", "syntax_labels": "all"}, "gives no dependency labels|not installed|perl"),
        ({"annotator": "spacy", "spacy_model": "no_such_pipeline_xyz"}, "spaCy|spacy"),
        ({"annotator": "treebank"}, "unknown syntax annotator"),
        ({"annotator": "gold", "syntax_labels": "nouns"}, "unknown syntax label set"),
        ({"annotator": "gold", "attribute_positions": [30]}, "outside 1..23"),
        ({"annotator": "gold", "attribute_layers": [3]}, "outside 0..2"),
        ({"annotator": "gold", "attribute_steps": 5}, "outside 1..4"),
        ({"annotator": "gold", "overrides": {"probe_positions": [3]}}, "set by the experiment"),
        ({"annotator": "gold", "task_options": {"annotator": "spacy"}}, "set by the experiment"),
        ({"annotator": "gold", "regimes": ["standard", "untied"]}, "unknown regime"),
        ({"annotator": "gold", "overrides": {"stepz": 3}}, "stepz"),
    ],
)
def test_bad_input_is_one_config_error_before_anything_is_written(kw, match, data_root, tmp_path):
    opts = {**_opts(data_root), **kw.pop("task_options", {})}
    with pytest.raises(ConfigError, match=match):
        LanguageExperimentConfig(scale="ci", seeds=[0], task_options=opts, **kw)
    if kw.get("annotator") == "spacy" and not _spacy_installed():
        with pytest.raises(ConfigError, match="needs spaCy, which is not installed"):
            LanguageExperimentConfig(scale="ci", seeds=[0], annotator="spacy", task_options=_opts(data_root))
    assert not any(tmp_path.iterdir())


def test_cli_refuses_bad_input_in_one_line_and_writes_nothing(data_root, tmp_path, capsys):
    from originlens.cli.main import main

    out = tmp_path / "exp"
    rc = main(
        [
            "ntp",
            "experiment",
            "tinystories",
            "--scale",
            "ci",
            "--seeds",
            "0",
            "--out",
            str(out),
            "--annotator",
            "lingua",
            "--syntax-labels",
            "all",
            "--task-option",
            f"data_root={data_root}",
            "--task-option",
            f"cache_dir={data_root / 'cache'}",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "fix:" in err
    assert not out.exists() and not (tmp_path / "results").exists()


def test_scales_are_documented():
    assert set(lang.SCALES) == {"paper", "cpu", "ci"}
    paper = lang.SCALES["paper"]["ntp"]
    assert (
        paper["n_layer"],
        paper["d_model"],
        paper["n_head"],
        paper["batch_size"],
        paper["steps"],
        paper["eval_size"],
    ) == (4, 128, 4, 256, 1000, 30000)
    cpu = lang.SCALES["cpu"]["ntp"]
    assert (cpu["n_layer"], cpu["d_model"], cpu["n_head"]) == (4, 128, 4) and not lang.SCALES["cpu"]["task"]
    assert 0 < cpu["steps"] < paper["steps"] and 0 < cpu["eval_size"] < paper["eval_size"]
    assert all(s in lang.SCALE_NOTES for s in lang.SCALES)
