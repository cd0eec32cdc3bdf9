"""Every example of the generated API reference runs (``originlens.cli.api_examples``)."""

from __future__ import annotations

import contextlib
import io

import pytest

from originlens.cli.api_examples import EXAMPLES
from originlens.cli.reference import api_reference


@pytest.mark.parametrize("module", sorted(EXAMPLES))
def test_example_runs(module, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(EXAMPLES[module], f"<example {module}>", "exec"), {"__name__": "__example__"})
    assert out.getvalue().strip(), f"the {module} example prints nothing"


def test_examples_are_in_the_reference():
    text = api_reference()
    for module, code in EXAMPLES.items():
        assert f"## `{module}`" in text and code.strip() in text, module
