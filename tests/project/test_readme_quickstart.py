"""The README's Python quick start runs as written, and it shows what its comments claim: the printed top
context associations of "fish" are the ones its comment lists, and the direct, pre-cached and shared parts
add up to the full gradient (checked on the objects the block leaves behind)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def _quick_start() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"## Quick start \(Python\)\s+```python\n(.*?)```", text, re.S)
    assert m, "README.md lost its Python quick start"
    return m.group(1)


def test_readme_quick_start_runs_and_prints_what_its_comments_say(tmp_path, monkeypatch):
    block = _quick_start()
    monkeypatch.chdir(tmp_path)
    env: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md quick start", "exec"), env)
    lines = out.getvalue().splitlines()
    claimed = re.search(r'"fish", k=8\)\)\s+#\s*(.+)', block).group(1)
    words = [w.strip() for w in claimed.split(",")]
    assert [w for w, _ in eval(lines[0])] == words  # the comment lists the printed associations
    assert [ln.split()[0] for ln in lines[1:4]] == ["direct", "precached", "shared"]
    g = env["g"]
    for name, full in g.full.items():  # the three parts add up to the full gradient
        parts = g.direct[name] + g.precached[name] + g.shared[name]
        assert torch.allclose(parts, full, rtol=1e-4, atol=1e-6), name
