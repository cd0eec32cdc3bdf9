"""The notebooks under ``notebooks/`` run from top to bottom at their tiny scale (executed with nbclient on a
fresh kernel, in a scratch directory), print what their text says they show, and are committed without
outputs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_is_a_notebook_per_paper():
    assert {p.name for p in NOTEBOOKS} >= {"leading_terms.ipynb", "gradient_pathways.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_are_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip the outputs"


def _data_present() -> bool:
    from originlens.paths import data_path, tinystories_files

    return bool(tinystories_files()) and data_path("models", "stories260K", required=False).is_dir()


def _run(path: Path, tmp_path: Path, figures: int) -> str:
    """The notebook's printed text, after checking that it drew ``figures`` figures (PNG outputs)."""
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    images = [out for out in outputs if out.output_type == "display_data" and "image/png" in out.get("data", {})]
    assert len(images) == figures, f"{path.name}: {len(images)} figures, expected {figures}"
    return "\n".join(out.get("text", "") for out in outputs if out.output_type == "stream")


@pytest.mark.slow
def test_gradient_pathways_notebook_runs(tmp_path):
    if not _data_present():
        pytest.skip("the data root (TinyStories, stories260K) is absent")
    text = _run(ROOT / "notebooks" / "gradient_pathways.ipynb", tmp_path, figures=2)
    gap = float(text.split("max |direct + pre-cached + shared - full| =")[1].split()[0])
    assert gap < 1e-5  # the three pathways add up to the full gradient
    assert "prev_is_<0>" in text and "Q = " in text and "offset 1" in text
    assert (tmp_path / "runs" / "notebook-pathways" / "cm" / "model.safetensors").is_file()


@pytest.mark.slow
def test_leading_terms_notebook_runs(tmp_path):
    if not _data_present():
        pytest.skip("the data root (TinyStories, stories260K) is absent")
    text = _run(ROOT / "notebooks" / "leading_terms.ipynb", tmp_path, figures=2)
    cosines = [
        float(v)
        for line in text.splitlines()
        if line.startswith("s = ")
        for v in [line.split("'W_O': ")[1].split(",")[0]]
    ]
    assert len(cosines) == 6 and min(cosines) > 0.99  # W_O follows its leading term over the whole run
    assert "the paper's statistic" in text and "permuted" in text
    # internal variant names ("spec", "token_centred") do not leak into what a reader sees
    assert not re.search(r"^(spec|null|token_centred|token_centred_null)\s{2,}", text, re.M)
