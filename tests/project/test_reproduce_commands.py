"""docs/reproduce.md's commands are ones that parse and run.

Every backticked command in its tables is checked: ``originlens …`` lines are parsed by the real argument
parser; ``scripts/paper_scale.py`` lines by the script's own parser (and the smoke line is run by
``tests/experiments/test_paper_scale.py``); ``python examples/….py … --device cuda`` lines are run on a
machine without CUDA and must end in one line naming the missing GPU (status 2, no traceback): they parse,
and they fail where a user without a GPU would, cleanly.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from originlens.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reproduce.md"


def commands() -> list[str]:
    out = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("|"):
            out += [
                c for c in re.findall(r"`([^`]+)`", line) if re.match(r"(PYTHONPATH=\S+ )?(originlens|python3?) ", c)
            ]
    return out


def argv(cmd: str) -> list[str]:
    words = shlex.split(cmd)
    return words[1:] if words[0].startswith("PYTHONPATH=") else words


def test_the_tables_hold_the_gpu_commands():
    cmds = commands()
    assert any("scripts/paper_scale.py" in c and "--smoke" in c for c in cmds)
    assert any("paper-scale" in c and c.startswith("originlens") for c in cmds)
    assert sum("--device cuda" in c for c in cmds) >= 5


def test_originlens_and_script_lines_parse(monkeypatch):
    from originlens.cli.paper_scale_cmd import _configure

    monkeypatch.setenv("ORIGINLENS_DATA", os.environ.get("ORIGINLENS_DATA", "../shared/data"))
    for cmd in commands():
        words = [os.path.expandvars(w) for w in argv(cmd)]
        if words[0] == "originlens":
            args = build_parser().parse_args(words[1:])
            assert getattr(args, "func", None) is not None, cmd
        elif words[1] == "scripts/paper_scale.py":
            p = argparse.ArgumentParser()
            _configure(p)
            p.parse_args(words[2:])


@pytest.mark.slow
def test_example_gpu_lines_fail_cleanly_without_cuda(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the lines would run at the papers' scale")
    lines = [c for c in commands() if "examples/" in c and "--device cuda" in c]
    assert lines
    for cmd in lines:
        words = argv(cmd)
        p = subprocess.run(
            [sys.executable, str(ROOT / words[1]), *words[2:]],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env={
                **os.environ,
                "ORIGINLENS_DATA": os.environ.get("ORIGINLENS_DATA", str(ROOT.parent / "shared" / "data")),
            },
        )
        assert p.returncode == 2, (cmd, p.stderr[-2000:])
        assert "CUDA is unavailable" in p.stderr and "Traceback" not in p.stderr, cmd
