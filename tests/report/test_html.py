"""Reports: JSON round trip, run record, rebuild and combination of several runs."""

import json

import numpy as np
import pytest

from originlens.cli.main import main
from originlens.errors import InputError
from originlens.report import Report, combine_reports, load_report, rebuild_report, setup_matplotlib
from originlens.runs import RunDir


def _make_run(path, regime, loss, seed=0):
    run = RunDir(path)
    run.write_config({"task": "majority", "regime": regime, "seed": seed, "model": {"d_model": 32}})
    run.write_environment(seeds={"train": seed}, data_hashes={"data.txt": "ab" * 32})
    run.log_metrics({"step": 1, "loss": loss + 1.0})
    run.log_metrics({"step": 2, "loss": loss, "flag": True})
    plt = setup_matplotlib()
    rep = Report(f"run {regime}")
    rep.section("Loss").text(f"final loss {loss}")
    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([1, 2], [loss + 1, loss])
    rep.figure(fig, "Loss over training.", "loss.png")
    rep.table(["k", "v"], [["loss", np.float64(loss)], ["steps", np.int64(2)]], caption="numbers")
    rep.code("originlens ntp train ...")
    return rep.write(run.path)


def test_json_round_trip_and_run_record(tmp_path):
    html = _make_run(tmp_path / "a", "standard", 0.5)
    text = html.read_text()
    assert "Run record" in text and "d_model" in text and "ab" * 32 in text and "seed: train" in text
    data = json.loads((tmp_path / "a" / "report.blocks.json").read_text())
    assert [b["kind"] for b in data["blocks"]] == ["h2", "p", "fig", "table", "pre"]
    assert all(b["kind"] != "h2" or b["value"] != "Run record" for b in data["blocks"])
    rep = load_report(tmp_path / "a")
    assert rep.to_html() == Report.to_html(rep)  # deterministic
    before = html.read_text()
    rebuild_report(tmp_path / "a")
    assert html.read_text() == before  # rebuilding reproduces the same bytes
    assert text.count("Run record") == 1


def test_combine_lists_differing_keys_and_puts_figures_side_by_side(tmp_path):
    _make_run(tmp_path / "std", "standard", 0.5)
    _make_run(tmp_path / "myo", "myopic", 0.7)
    out = combine_reports([tmp_path / "std", tmp_path / "myo"], tmp_path / "both")
    html = out.read_text()
    data = json.loads((tmp_path / "both" / "report.blocks.json").read_text())
    table = data["blocks"][1]
    assert table["kind"] == "table"
    assert "regime" in table["header"] and "seed" not in table["header"] and "loss" in table["header"]
    li = table["header"].index("loss")
    assert [r[li] for r in table["rows"]] == [0.5, 0.7]
    assert [r[table["header"].index("regime")] for r in table["rows"]] == ["standard", "myopic"]
    rows = [b for b in data["blocks"] if b["kind"] == "figrow"]
    assert len(rows) == 1 and [i["label"] for i in rows[0]["items"]] == ["std", "myo"]
    assert html.count("<img") == 4  # side-by-side pair + each run's own figure
    for item in rows[0]["items"]:
        assert (tmp_path / "both" / "figures" / item["name"]).exists()


def test_cli_and_errors(tmp_path, capsys):
    _make_run(tmp_path / "a", "standard", 0.5)
    _make_run(tmp_path / "b", "untied", 0.6)
    assert main(["report", str(tmp_path / "a")]) == 0
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c" / "report.html").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="report.blocks.json"):
        load_report(tmp_path / "empty")
    (tmp_path / "a" / "figures" / "loss.png").unlink()
    with pytest.raises(InputError, match="missing"):
        load_report(tmp_path / "a")


def test_reports_render_inline_in_notebooks(tmp_path):
    """_repr_html_: the page's body (title, blocks, embedded figures) in a div whose styles are scoped to it,
    so a notebook's own page style is untouched; a loaded report renders the same way."""
    plt = setup_matplotlib()
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    rep = Report("Inline <1>").section("S").text("t").table(["a"], [[0.5]]).figure(fig, "a line")
    out = rep._repr_html_()
    assert out.startswith("<div class='originlens-report'>") and out.endswith("</div>")
    assert "<h1>Inline &lt;1&gt;</h1>" in out and "data:image/png;base64," in out and "<td>0.5</td>" in out
    assert "<html" not in out and "body{" not in out
    assert all(
        rule.startswith(".originlens-report ") for rule in out.split("<style>")[1].split("</style>")[0].split("}")[:-1]
    )
    rep.write(tmp_path, run_record=False)
    assert load_report(tmp_path)._repr_html_() == out
