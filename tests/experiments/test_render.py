"""Claims, verdicts and the docs generated from results files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from originlens.cli.main import main as cli_main
from originlens.errors import InputError
from originlens.experiments import inference as inf
from originlens.experiments.claims import CLAIMS, claim_status, judge_cond_majority, judge_majority
from originlens.experiments.render import BEGIN, END, render
from originlens.experiments.results import read_results, write_results
from originlens.experiments.toy_grid import HYPOTHESES
from originlens.experiments.verdicts import VERDICTS

REPO = Path(__file__).resolve().parents[2]
REGIMES = ("standard", "myopic", "untied", "myopic+untied")


def fake_grid(task: str, means: dict[str, float], initial: float = 0.4, sd: float = 0.01, seed: int = 0) -> dict:
    """A toy-grid results record with per-seed values around ``means`` (the real aggregation functions)."""
    rng = np.random.default_rng(seed)
    vals = {r: np.clip(m + sd * rng.standard_normal(5), -0.99, 0.99).tolist() for r, m in means.items()}
    init = np.clip(initial + sd * rng.standard_normal(5), -0.99, 0.99).tolist()
    numbers = {
        r: {
            "useless_r": inf.correlation_ci(v),
            "useless_r_bootstrap": inf.bootstrap_ci(v),
            "initial_useless_r": inf.correlation_ci(init),
            "useful_r": inf.correlation_ci(v),
            "useless_r_by_layer": {},
        }
        for r, v in vals.items()
    }
    orderings = {f"{a} > {b}": inf.paired_test(vals[a], vals[b]) for a, b in HYPOTHESES[task]}
    adj = inf.holm({k: v["p_t"] for k, v in orderings.items()})
    for k, v in orderings.items():
        v.update(p_holm=adj[k], holds=adj[k] is not None and adj[k] < 0.05)
    learned = {}
    for r, v in vals.items():
        t = inf.paired_test(v, init)
        learned[f"{r} > initial"] = {**t, "holds": (t["p_t"] or 1) < 0.05}
    q = {
        "eval_loss": inf.mean_ci([0.7] * 5),
        "initial_eval_loss": inf.mean_ci([1.6] * 5),
        "legal_output_acc": inf.mean_ci([0.99] * 5),
        "first_output_token_acc": inf.mean_ci([0.9] * 5),
    }
    return {
        "format": "originlens-results/1",
        "experiment": "toy-grid",
        "name": f"{task}-cpu",
        "command": "originlens ntp experiment grid",
        "created": "2026-01-01T00:00:00+00:00",
        "git_commit": "abc",
        "versions": {"torch": "x", "numpy": "y"},
        "machine": {"cpus": 2},
        "config": {},
        "seeds": [0, 1, 2, 3, 4],
        "scale": {"summary": "test", "model": "2 layers", "training": "t", "deviations": ["d_model 64 (paper 128)"]},
        "numbers": numbers,
        "quality": {r: q for r in vals},
        "metric": "m",
        "tests": {"orderings": orderings, "learned": learned, "alpha": 0.05, "expected": "e"},
        "runs": [{"regime": r, "seed": s, "seconds": 1.0} for r in vals for s in range(5)],
    }


def grid_from_runs(task: str, means: dict[str, float], initial: float = 0.4, sd: float = 0.01, seed: int = 0) -> dict:
    """A toy-grid record as this version writes it: synthetic per-seed runs through
    :func:`~originlens.experiments.toy_grid.summarise_runs` (gains, orderings on gains, the readings)."""
    from originlens.experiments.toy_grid import ToyGridConfig, summarise_runs

    rng = np.random.default_rng(seed)
    init = np.clip(initial + sd * rng.standard_normal(5), -0.99, 0.99)
    runs = [
        {
            "regime": r,
            "seed": s,
            "useless_r": float(np.clip(m + sd * rng.standard_normal(), -0.99, 0.99)),
            "initial_useless_r": float(init[s]),
            "useful_r": 0.9,
            "useless_by_layer": {},
            "eval_loss": 0.7,
            "initial_eval_loss": 1.6,
            "legal_output_acc": 0.99,
            "first_output_token_acc": 0.9,
            "seconds": 1.0,
        }
        for r, m in means.items()
        for s in range(5)
    ]
    summ = summarise_runs(ToyGridConfig(task=task, seeds=[0, 1, 2, 3, 4], regimes=list(means)), runs)
    rec = fake_grid(task, means, initial, sd, seed)
    keys = ("useless_r", "useless_r_bootstrap", "initial_useless_r", "gain", "useful_r", "useless_r_by_layer")
    rec["numbers"] = {r: {k: summ["per_regime"][r][k] for k in keys} for r in means}
    rec["tests"].update(orderings=summ["orderings"], learned=summ["learned"], readings=summ["readings"])
    rec["runs"] = summ["runs"]
    return rec


def test_cond_majority_verdicts_follow_the_written_rules():
    ok = grid_from_runs("cond-majority", {"standard": 0.9, "untied": 0.9, "myopic": 0.4, "myopic+untied": 0.4})
    v = judge_cond_majority(ok)
    assert v.verdict == "reproduced" and "reading A (not learned, gain ≡ 0 ± 0.1): holds" in v.ours
    # gains: standard ≈ 0.83, myopic ≈ 0.33 — not zero (A fails), under half of standard's (B holds)
    less = grid_from_runs("cond-majority", {"standard": 0.9, "untied": 0.9, "myopic": 0.6, "myopic+untied": 0.6})
    v = judge_cond_majority(less)
    assert v.verdict == "partial" and "reading A" in v.ours and ": fails" in v.ours and "reading B" in v.ours
    assert less["tests"]["readings"]["B_holds"] and not less["tests"]["readings"]["A_holds"]
    # myopic gain ≈ 0.67 > half of standard's: neither reading
    most = grid_from_runs("cond-majority", {"standard": 0.9, "untied": 0.9, "myopic": 0.8, "myopic+untied": 0.8})
    assert judge_cond_majority(most).verdict == "not reproduced"
    # standard not above its null: the design cannot test the claim
    flat = grid_from_runs("cond-majority", {r: 0.4 for r in ("standard", "untied", "myopic", "myopic+untied")})
    assert judge_cond_majority(flat).verdict == "not tested"
    # a record written before the readings existed: the earlier rule
    old = fake_grid("cond-majority", {"standard": 0.9, "untied": 0.9, "myopic": 0.6, "myopic+untied": 0.6})
    v = judge_cond_majority(old)
    assert v.verdict == "partial" and "still beat" in v.ours
    bad = fake_grid("cond-majority", {"standard": 0.6, "untied": 0.6, "myopic": 0.6, "myopic+untied": 0.6})
    assert judge_cond_majority(bad).verdict == "not reproduced"
    assert "d_model 64 (paper 128)" in v.scale and "5 seeds" in v.scale


def test_majority_verdicts():
    full = fake_grid("majority", {"standard": 0.9, "myopic": 0.8, "untied": 0.8, "myopic+untied": 0.6})
    assert judge_majority(full).verdict == "reproduced"
    some = fake_grid("majority", {"standard": 0.8, "myopic": 0.8, "untied": 0.8, "myopic+untied": 0.6})
    assert judge_majority(some).verdict == "partial"
    none = fake_grid("majority", {r: 0.8 for r in REGIMES})
    assert judge_majority(none).verdict == "not reproduced"


def test_claims_without_results_are_blocked_never_numbered():
    for c in CLAIMS:
        v, key = claim_status(c, {})
        assert key is None and v.verdict == c.blocked and v.verdict in VERDICTS and v.ours == "—"


def _root(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(f"# x\n\nintro\n\n{BEGIN}\nstale\n{END}\n\n## after\n")
    return tmp_path


def test_render_writes_readme_block_and_results_page_then_check_passes(tmp_path, capsys):
    root = _root(tmp_path)
    rec = fake_grid("cond-majority", {"standard": 0.9, "untied": 0.9, "myopic": 0.4, "myopic+untied": 0.4})
    (root / "results" / "toy-grid").mkdir(parents=True)
    (root / "results" / "toy-grid" / "cond-majority-cpu.json").write_text(json.dumps(rec))
    assert read_results(root / "results" / "toy-grid" / "cond-majority-cpu.json")["name"] == "cond-majority-cpu"
    changed = render(root)
    assert sorted(p.name for p in changed) == ["README.md", "results.md"]
    readme = (root / "README.md").read_text()
    assert "stale" not in readme and readme.startswith("# x\n\nintro") and readme.endswith("## after\n")
    assert "**reproduced**" in readme and "(results/toy-grid/cond-majority-cpu.json)" in readme
    page = (root / "docs" / "results.md").read_text()
    assert "../results/toy-grid/cond-majority-cpu.json" in page and "standard > myopic" in page
    assert "d_model 64 (paper 128)" in page
    assert render(root, check=True) == []
    assert cli_main(["results", "render", "--root", str(root), "--check"]) == 0
    # a hand edit, or a results file that changed, is caught
    (root / "docs" / "results.md").write_text(page.replace("0.9", "0.95", 1))
    assert cli_main(["results", "render", "--root", str(root), "--check"]) == 1
    assert "out of date" in capsys.readouterr().out


def test_render_refuses_a_readme_without_markers_and_foreign_files(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# no markers\n")
    with pytest.raises(InputError, match="markers"):
        render(tmp_path)
    (tmp_path / "results" / "toy-grid").mkdir(parents=True)
    (tmp_path / "results" / "toy-grid" / "x.json").write_text('{"format": "other"}')
    with pytest.raises(InputError, match="not an originlens results file"):
        render(tmp_path)


def test_write_results_records_provenance(tmp_path):
    p = write_results(
        tmp_path / "e" / "n.json",
        experiment="e",
        name="n",
        command="originlens x",
        config={"a": 1},
        seeds=[0, 1],
        scale={"summary": "s"},
        numbers={"v": 1.0},
    )
    rec = read_results(p)
    assert rec["versions"]["numpy"] and rec["machine"]["cpus"] >= 1 and rec["created"].endswith("+00:00")
    assert rec["git_commit"] is None or len(rec["git_commit"].split("+")[0]) == 40


def test_committed_docs_agree_with_committed_results_files():
    """README's reproduction status and docs/results.md are exactly what results/ generates."""
    assert render(REPO, check=True) == [], "run `originlens results render` and commit the result"
    for p in sorted((REPO / "results").glob("*/*.json")):
        rec = read_results(p)
        assert rec["git_commit"] and not rec["git_commit"].endswith("+dirty"), f"{p}: run from committed code"
        absolute = [s for s in _strings(rec) if ABSOLUTE_PATH.search(s)]
        assert not absolute, f"{p} names absolute paths of the machine it ran on: {absolute[:3]}"


def test_committed_unit_records_name_no_path_of_the_machine():
    """Unit records (``results/<experiment>/<name>/<unit>.json``) are committed too."""
    records = sorted((REPO / "results").glob("*/*/*.json"))
    for p in records:
        rec = json.loads(p.read_text())
        absolute = [s for s in _strings(rec) if ABSOLUTE_PATH.search(s)]
        assert not absolute, f"{p} names absolute paths of the machine it ran on: {absolute[:3]}"


def test_the_recorded_command_names_no_path_of_the_machine(tmp_path):
    from originlens.experiments.results import command_line

    here = (tmp_path / "repo").resolve()
    line = command_line(
        ["x", "--out", "/srv/runs/cpu0", f"--data={here}/d/f.txt", str(here), "rel/p", "--seeds", "0"], cwd=here
    )
    assert line == "originlens x --out '<elsewhere>/cpu0' --data=d/f.txt . rel/p --seeds 0"
    assert not ABSOLUTE_PATH.search(line)


# "/dir/..." at the start of a string or after a space, quote, "=" or "(" (not "train / 709 held-out")
ABSOLUTE_PATH = re.compile(r"(?:^|[\s'\"=(])/[^\s/]+/")


def test_absolute_path_detector():
    assert ABSOLUTE_PATH.search("/home/x/data") and ABSOLUTE_PATH.search("--out /tmp/run/a")
    assert ABSOLUTE_PATH.search("path='/work/main/x'")
    assert not ABSOLUTE_PATH.search("6,378 train / 709 held-out") and not ABSOLUTE_PATH.search("runs/a/b")


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def test_unit_records_not_yet_combined_are_listed_apart(tmp_path):
    """Records of units whose results file does not exist (or was made from other units) are listed in their
    own section with each unit's quality, never in the status table; once combined they disappear."""
    from originlens.experiments.records import record_path, write_unit_record
    from originlens.experiments.render import pending_markdown, pending_records
    from originlens.experiments.results import write_results

    res = tmp_path / "results" / "othello" / "othello-x.json"
    values = {"train": {"trained": {"final_eval": {"legal_acc": 0.9612, "eval_loss": 2.3456}}}}
    for seed in (0, 1):
        write_unit_record(
            record_path(res, f"seed-{seed}"),
            experiment="othello",
            name="othello-x",
            unit=f"seed-{seed}",
            config_key={"a": {}},
            values=values,
            command="c",
        )
    pending = pending_records(tmp_path / "results")
    assert list(pending) == ["othello/othello-x"] and [r["unit"] for r in pending["othello/othello-x"]] == [
        "seed-0",
        "seed-1",
    ]
    md = "\n".join(pending_markdown(pending))
    assert "legal-move accuracy 0.961, eval loss 2.346" in md and "seed-1" in md
    # a results file made from other units (an older run) keeps them pending ...
    write_results(
        res,
        experiment="othello",
        name="othello-x",
        command="c",
        config={},
        seeds=[0],
        scale={},
        numbers={},
        runs=[{"seed": 0, "commits": {"record": "another"}}],
    )
    assert pending_records(tmp_path / "results")
    # ... one made from these units does not
    commit = pending["othello/othello-x"][0]["git_commit"]
    write_results(
        res,
        experiment="othello",
        name="othello-x",
        command="c",
        config={},
        seeds=[0, 1],
        scale={},
        numbers={},
        runs=[{"seed": s, "commits": {"record": commit}} for s in (0, 1)],
    )
    assert pending_records(tmp_path / "results") == {}
    assert pending_markdown({}) == []
