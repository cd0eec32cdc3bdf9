"""LM commands that do not split their work over ranks refuse to run under a multi-process torchrun (each
rank would repeat the whole job and write the same files) with one error line, before touching ``--out``."""

from __future__ import annotations

import pytest

from originlens.cli.main import main


@pytest.mark.parametrize(
    "argv",
    [
        ["lm", "steer", "--model", "M", "--sae", "S", "--features", "1", "--out", "{out}"],
        ["lm", "lookahead", "--model", "M", "--sae", "S", "--corpus", "C", "--out", "{out}"],
        ["sae", "train", "--model", "M", "--corpus", "C", "--site", "resid.1", "--out", "{out}"],
        ["lm", "compare", "--checkpoints", "a,b", "--corpus", "C", "--out", "{out}"],
        ["lm", "generate", "--model", "M"],
        ["lm", "export", "--model", "M", "--out", "{out}"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_refused_under_multi_process_torchrun(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    out = tmp_path / "out"
    assert main([a.replace("{out}", str(out)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "does not split its work over torchrun" in err and "Traceback" not in err, err
    assert not out.exists()


def test_one_process_torchrun_is_allowed(monkeypatch):
    from originlens.distributed import single_process

    monkeypatch.setenv("WORLD_SIZE", "1")
    single_process("lm steer")  # no error
