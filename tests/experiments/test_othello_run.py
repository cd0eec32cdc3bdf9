"""The Othello experiment end to end at a tiny scale (train → probe → attribute → human games → report),
and the probe evaluation on recorded games against a plain per-site computation written here."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from originlens.cli.main import main as cli_main
from originlens.experiments.othello_run import OthelloExperimentConfig, evaluate_games, run_othello_experiment
from originlens.tasks import generate_games, get_task
from originlens.tasks.othello import CENTRAL_CELLS
from originlens.tasks.othello_records import read_game_records, write_wthor

TINY = dict(
    n_layer=2,
    d_model=16,
    n_head=2,
    batch_size=8,
    steps=4,
    eval_size=60,
    othello_pool=200,
    checkpoint_every=2,
    positions=[8],
    compare_games=30,
)


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    root = tmp_path_factory.mktemp("oth")
    games = root / "human.wtb"
    write_wthor(games, generate_games(30, 77, feature_types=False).moves)
    cfg = OthelloExperimentConfig(**TINY, human_games=str(games))
    record = run_othello_experiment(cfg, root / "exp", log=lambda *_: None)
    return root, cfg, record


@pytest.mark.slow
def test_experiment_end_to_end(experiment):
    root, cfg, record = experiment
    out = root / "exp"
    assert json.loads((out / "experiment.json").read_text())["train"]["steps"] == cfg.steps
    assert "integrated influence" in (out / "report.md").read_text()
    assert (out / "run" / "attribution" / "report.html").is_file()
    at = record["attribution"]
    assert at["sites"] == [[1, 8], [2, 8]]
    checks = at["checks"]  # the replay reproduced the training run
    assert checks["checkpoints_verified"] == [2, 4] and checks["losses_checked"] >= 1
    assert checks["adam_sum_max_rel_err"] < 1e-6
    groups = {(s["component"], s["type"]) for s in at["summary"]}
    assert {("direct", 2), ("precached", 1), ("shared", 1), ("full", 2)} <= groups
    # per item and type, the integrated full influence is the sum of the three components
    from originlens.attribution.store import integrate, load_observables

    integ = integrate(load_observables(out / "run" / "attribution")).to_pylist()
    by = {}
    for r in integ:
        by.setdefault((r["site_layer"], r["site_position"], r["feature"], r["type"]), {})[r["component"]] = r[
            "integrated"
        ]
    assert len(by) >= 16
    for comps in by.values():
        if comps.get("full") is not None:
            assert comps["full"] == pytest.approx(
                comps["direct"] + comps["precached"] + comps["shared"], rel=1e-9, abs=1e-15
            )
    assert {k[2] for k in by} == set(CENTRAL_CELLS)
    probes = record["probes"]["per_layer"]
    assert set(probes) == {0, 1, 2} and all(-1 <= v["pearson"] <= 1 for v in probes.values())
    hg = record["human_games"]
    assert hg["n_records"] == 30 and hg["human"]["n_games"] == 30 and hg["synthetic"]["n_games"] == 30
    assert 0 <= hg["human"]["legal_acc"] <= 1 and set(hg["human"]["per_layer"]) == {0, 1, 2}


@pytest.mark.slow
def test_rerun_skips_finished_stages_and_cli(experiment, capsys):
    root, cfg, record = experiment
    args = [
        "-q",
        "ntp",
        "experiment",
        "othello-run",
        "--out",
        str(root / "exp"),
        "--n-layers",
        "2",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--batch-size",
        "8",
        "--steps",
        "4",
        "--eval-size",
        "60",
        "--othello-pool",
        "200",
        "--checkpoint-every",
        "2",
        "--positions",
        "8",
        "--human-games",
        str(root / "human.wtb"),
        "--compare-games",
        "30",
    ]
    assert cli_main(args) == 0
    again = json.loads((root / "exp" / "experiment.json").read_text())
    assert again["train"]["skipped"]
    assert again["attribution"]["summary"] == json.loads(json.dumps(record["attribution"]["summary"]))
    assert "NTP-useful" in capsys.readouterr().out


def test_evaluate_games_matches_plain_per_site_pearson(tmp_path):
    """Probe predictions and Pearson r per (layer, position, cell), written out with numpy here."""
    from originlens.models import GPT, GPTConfig
    from originlens.probes import fit_probes

    torch.manual_seed(0)
    task = get_task("othello")
    model = GPT(GPTConfig(vocab_size=67, seq_len=61, n_positions=62, n_layer=1, d_model=8, n_head=2))
    fit = task.sample(80, np.random.default_rng(1))
    with torch.no_grad():
        _, res = model(torch.from_numpy(fit.tokens), return_residuals=True)
    R = torch.stack(res, 1).numpy()
    probes, _ = fit_probes(R, fit.features, feature_names=fit.feature_names, positions=[8, 20])
    write_wthor(tmp_path / "g.wtb", generate_games(40, 3, feature_types=False).moves)
    batch = task.batch_from_games(read_game_records(tmp_path / "g.wtb").games())
    got = evaluate_games(model, probes, batch)
    with torch.no_grad():
        logits, res = model(torch.from_numpy(batch.tokens), return_residuals=True)
    acc = np.mean(
        [batch.legal[b, t, int(logits[b, t].argmax())] for b in range(40) for t in range(60) if batch.legal[b, t].any()]
    )
    assert got["legal_acc"] == pytest.approx(acc)
    for k in (0, 1):
        rs, r1 = [], []
        for pi, pos in enumerate([8, 20]):
            for cell in CENTRAL_CELLS:
                f = batch.feature_names.index(cell)
                w, b = probes.weights[k, pi, f], probes.intercepts[k, pi, f]
                pred = res[k][:, pos].double().numpy() @ w + b
                y = batch.features[:, pos, f]
                if y.std() > 0 and pred.std() > 0:  # r undefined otherwise: skipped
                    rs.append(np.corrcoef(y, pred)[0, 1])
                m = batch.feature_types[:, pos, f] == 1
                if m.sum() > 1 and y[m].std() > 0 and pred[m].std() > 0:
                    r1.append(np.corrcoef(y[m], pred[m])[0, 1])
        assert got["per_layer"][k]["pearson"] == pytest.approx(np.mean(rs), rel=1e-6)
        assert got["per_layer"][k]["pearson_type1"] == pytest.approx(np.mean(r1), rel=1e-6)
