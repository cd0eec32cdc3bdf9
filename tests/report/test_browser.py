"""Reports open in a real headless browser (Debian chromium through Selenium and chromedriver):
the page renders, every image decodes, the console stays clean, and a small screenshot is not blank.

CI installs chromium and chromium-driver (``.ci/run``) and sets ORIGINLENS_REQUIRE_BROWSER=1, so a
missing browser fails there; elsewhere the test is skipped with the reason.
"""

import io
import os
import shutil

import numpy as np
import pytest

from originlens.report import Report, combine_reports, setup_matplotlib
from originlens.runs import RunDir

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _require_browser():
    missing = [n for n, p in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)) if not p]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install selenium)")
    if missing:
        msg = f"browser test needs {', '.join(missing)} (apt-get install chromium chromium-driver)"
        if os.environ.get("ORIGINLENS_REQUIRE_BROWSER") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture(scope="module")
def browser():
    _require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    for a in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=640,480",
    ):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    yield driver
    driver.quit()


def check_page(driver, path, title):
    """Open ``path``; assert it is our report (h1), all images decode, no console errors."""
    driver.get(path.resolve().as_uri())
    state = driver.execute_script(
        "return {ready: document.readyState, h1: (document.querySelector('h1')||{}).textContent,"
        " imgs: Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight]),"
        " tables: document.querySelectorAll('table').length}"
    )
    assert state["ready"] == "complete"
    assert state["h1"] == title, f"page did not render our report: {state['h1']!r}"
    assert state["imgs"], "no images in the report"
    broken = [i for i, (ok, w, h) in enumerate(state["imgs"]) if not ok or w == 0 or h == 0]
    assert not broken, f"images {broken} did not load"
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, errors
    return state


def _run(path, name, loss):
    run = RunDir(path)
    run.write_config({"regime": name})
    run.log_metrics({"loss": loss})
    plt = setup_matplotlib()
    rep = Report(f"run {name}")
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot(np.arange(5), np.arange(5) * loss)
    rep.section("Curves").figure(fig, "A line.", "line.png")
    rep.table(["a", "b"], [[1, 2.5]])
    rep.write(run.path)
    return run.path


def test_report_and_combined_report_render(browser, tmp_path):
    a, b = _run(tmp_path / "a", "standard", 1.0), _run(tmp_path / "b", "myopic", 2.0)
    st = check_page(browser, a / "report.html", "run standard")
    assert st["tables"] >= 2  # the table and the run record
    out = combine_reports([a, b], tmp_path / "both", title="both runs")
    st = check_page(browser, out, "both runs")
    assert len(st["imgs"]) == 4


def test_small_screenshot_is_not_blank(browser, tmp_path):
    a = _run(tmp_path / "a", "standard", 1.0)
    check_page(browser, a / "report.html", "run standard")
    browser.set_window_size(480, 360)
    png = browser.get_screenshot_as_png()
    from matplotlib.image import imread

    img = imread(io.BytesIO(png), format="png")
    assert img.shape[0] > 100 and img.shape[1] > 100
    grey = img[..., :3].mean(axis=2)
    assert grey.std() > 0.05, "screenshot is blank"
    assert (grey < 0.3).mean() > 0.002, "no dark (text) pixels in the screenshot"
    (tmp_path / "screenshot.png").write_bytes(png)


@pytest.mark.slow
def test_quick_demo_all_stages_report_opens_in_browser(browser, tmp_path):
    """The README's demo, all four stages at --quick scale (about a minute on 2 idle cores), finishes and
    its report renders with every stage's figures (the full-scale demo runs the same commands, longer)."""
    from originlens.cli.main import main

    out = tmp_path / "demo"
    assert main(["-q", "demo", "--quick", "--out", str(out)]) == 0
    assert (out / "leading-terms" / "report.html").exists()
    assert (out / "regimes" / "report.html").exists()
    assert list((out / "othello").rglob("segment-*.parquet")), "the Othello stage wrote no attribution"
    st = check_page(browser, out / "report.html", "originlens demo: where do transformer features come from?")
    assert len(st["imgs"]) >= 6 and st["tables"] >= 4
    html = (out / "report.html").read_text()
    for heading in ("1. Corpus statistics", "2. Leading terms", "3. ", "4. Gradient pathways"):
        assert heading in html
    # the report opens with the reproduction status of the committed results files, and labels its own
    # runs as illustrations
    from originlens.experiments.claims import CLAIMS

    assert "Reproduction status (from the committed results files)" in html
    assert html.index("Reproduction status") < html.index("1. Corpus statistics")
    import html as html_lib

    assert all(html_lib.escape(c.claim.split(":")[0]) in html for c in CLAIMS)
    assert html.count("illustration") >= 4
