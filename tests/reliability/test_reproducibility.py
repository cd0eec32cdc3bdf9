"""Reproducibility: every command that trains or analyses, run twice with the same seed
and inputs into two directories, gives bit-identical outputs on CPU; every run records what is needed to
reproduce it.

Compared: safetensors tensors bytewise (all of them, including the RNG states in NTP checkpoints),
``.npy``/``.npz`` arrays and tokenizer files bytewise, Parquet tables row by row, JSON/JSONL files after
:func:`_helpers.normalise` removes the legitimately non-deterministic fields and replaces the output
directory by a placeholder.

Legitimately non-deterministic (and therefore ignored):

* wall-clock fields: ``time``, ``seconds``, ``wall_seconds``, ``train_seconds``, ``build_seconds``,
  ``seconds_per_attributed_step``, ``seconds_breakdown`` and the like (``_helpers.NONDETERMINISTIC_KEYS``
  plus ``seconds_per_attributed_step``, ``seconds_breakdown`` and ``timings`` below);
* ``environment.json``: ``time`` and ``argv`` (the output path is part of the command line);
* paths that contain the output directory (replaced by ``<OUT>``);
* rendered reports (``.html``, ``.md``, ``.png``, ``*.blocks.json``, which holds a timings table): they
  are built from the compared JSON numbers;
* safetensors string metadata with timings (``train_seconds`` in NTP checkpoints, ``meta.seconds`` in
  statistics), so files are compared tensor by tensor, not as raw bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _helpers import NONDETERMINISTIC_KEYS, assert_ok, assert_same_tensors, jsonl, normalise, run_cli, tensors

from originlens.cli.main import main as cli_main

EXTRA_TIMERS = {"seconds_per_attributed_step", "seconds_breakdown", "timings"}  # dicts of wall times


def run(*args) -> int:
    return cli_main(["-q", *map(str, args)])


def norm(obj, a: Path, b: Path):
    """Normalise a JSON value from run A or B (their roots become <OUT>)."""

    def strip(o):
        if isinstance(o, dict):
            return {k: strip(v) for k, v in o.items() if k not in EXTRA_TIMERS}
        if isinstance(o, list):
            return [strip(v) for v in o]
        return o

    return strip(normalise(obj, {str(a): "<OUT>", str(b): "<OUT>"}))


def assert_same_json(fa: Path, fb: Path, a: Path, b: Path) -> None:
    load = jsonl if fa.suffix == ".jsonl" else (lambda p: json.loads(p.read_text(encoding="utf-8")))
    assert norm(load(fa), a, b) == norm(load(fb), a, b), (fa, fb)


def assert_same_tree(a: Path, b: Path, skip: tuple[str, ...] = (), roots: tuple[Path, Path] | None = None) -> None:
    """Every file under A has an identical counterpart under B (by kind), and no file is missing; paths
    under ``roots`` (default: A and B) count as equal."""
    ra, rb = roots or (a, b)
    fa = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    fb = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert fa == fb, (a, b)
    for rel in fa:
        if any(part in skip for part in rel.parts) or rel.name in skip:
            continue
        pa, pb = a / rel, b / rel
        if rel.name.endswith(".blocks.json") or rel.suffix in (".html", ".md", ".png"):
            continue  # rendered reports (incl. a timings table): built from the compared numbers
        if rel.suffix == ".safetensors":
            assert_same_tensors(pa, pb)
        elif rel.suffix in (".json", ".jsonl"):
            if rel.name == "environment.json":
                ea, eb = (json.loads(p.read_text()) for p in (pa, pb))
                for e in (ea, eb):
                    e.pop("argv"), e.pop("time")
                assert norm(ea, ra, rb) == norm(eb, ra, rb), rel
            else:
                assert_same_json(pa, pb, ra, rb)
        elif rel.suffix == ".npz":
            with np.load(pa, allow_pickle=False) as za, np.load(pb, allow_pickle=False) as zb:
                assert za.files == zb.files and all(za[k].tobytes() == zb[k].tobytes() for k in za.files), rel
        elif rel.suffix == ".parquet":
            import pyarrow.parquet as pq

            assert pq.read_table(pa).equals(pq.read_table(pb)), rel
        else:
            assert pa.read_bytes() == pb.read_bytes(), rel


def assert_records_environment(env_file: Path, *, seeds: tuple[str, ...], data_hash: bool) -> None:
    env = json.loads(env_file.read_text())
    for k in ("python", "numpy", "torch", "originlens"):
        assert env["versions"].get(k), k
    assert "git_commit" in env
    if (Path(__file__).resolve().parents[2] / ".git").exists():
        assert env["git_commit"], "a git checkout must record its commit"
    assert all(s in env["seeds"] for s in seeds), env["seeds"]
    assert bool(env["data_hashes"]) == data_hash
    assert (env_file.parent / "config.json").is_file()


@pytest.fixture(scope="module")
def twice(tmp_path_factory):
    """Corpus build → stats → assoc train → assoc report, twice into A and B (shared by the tests)."""
    base = tmp_path_factory.mktemp("repro")
    src = base / "input.txt"
    src.write_text(
        "\n".join(
            f"the cat saw a bird number {i % 7} and the bird sat on the red mat near the "
            f"{'big' if i % 3 else 'small'} tree"
            for i in range(200)
        ),
        encoding="utf-8",
    )
    out = {}
    for side in ("A", "B"):
        d = base / side
        assert (
            run("corpus", "build", src, "--vocab-size", "40", "--seq-len", "10", "--oov", "unk", "--out", d / "corpus")
            == 0
        )
        assert run("stats", d / "corpus", "--out", d / "stats") == 0
        assert (
            run(
                "assoc",
                "train",
                d / "corpus",
                "--n-layers",
                "2",
                "--lr",
                "0.5",
                "--steps",
                "4",
                "--batch-size",
                "32",
                "--checkpoint-every",
                "2",
                "--holdout",
                "10",
                "--dtype",
                "float64",
                "--threads",
                "1",
                "--out",
                d / "assoc",
            )
            == 0
        )
        out[side] = d
    return base, out["A"], out["B"]


@pytest.mark.slow  # builds the shared fixture: corpus, stats and assoc runs, twice
def test_corpus_build(twice):
    _, a, b = twice
    assert_same_tree(a / "corpus", b / "corpus", roots=(a, b))
    m = json.loads((a / "corpus" / "manifest.json").read_text())
    assert m["sources"][0]["sha256"] and m["tokens_sha256"] and m["vocab_hash"]
    assert m["environment"]["versions"]["numpy"] and "git_commit" in m["environment"]


def test_stats(twice):
    _, a, b = twice
    assert_same_tree(a / "stats", b / "stats", roots=(a, b))
    m = json.loads((a / "stats" / "manifest.json").read_text())
    assert m["corpus"]["tokens_sha256"] and m["environment"]["versions"]["numpy"]


def test_assoc_train(twice):
    _, a, b = twice
    assert_same_tree(a / "assoc", b / "assoc", roots=(a, b))
    assert_records_environment(a / "assoc" / "environment.json", seeds=("init", "data_order"), data_hash=True)


def test_assoc_report_json(twice, capsys):
    _, a, b = twice
    outs = []
    for d in (a, b):
        capsys.readouterr()
        assert (
            run(
                "assoc",
                "report",
                d / "assoc",
                "--json",
                "--eval-windows",
                "32",
                "--null-windows",
                "32",
                "--batch-size",
                "32",
                "--threads",
                "1",
                "--out",
                d / "report",
            )
            == 0
        )
        outs.append(json.loads(capsys.readouterr().out))
    assert norm(outs[0], a, b) == norm(outs[1], a, b)
    assert_same_tree(a / "report", b / "report", roots=(a, b))


NTP = [
    "--task",
    "cond-majority",
    "--d-model",
    "16",
    "--heads",
    "2",
    "--batch-size",
    "16",
    "--steps",
    "6",
    "--eval-size",
    "64",
    "--log-every",
    "1",
    "--eval-every",
    "3",
    "--probe-every",
    "3",
    "--checkpoint-every",
    "2",
    "--threads",
    "1",
]


@pytest.fixture(scope="module")
def ntp_twice(tmp_path_factory):
    base = tmp_path_factory.mktemp("ntp")
    for side in ("A", "B"):
        assert run("ntp", "train", *NTP, "--seed", "3", "--out", base / side / "run") == 0
    return base / "A", base / "B"


def test_ntp_train(ntp_twice):
    a, b = ntp_twice
    assert_same_tree(a / "run", b / "run")
    assert_records_environment(
        a / "run" / "environment.json", seeds=("seed", "eval_seed", "model_init"), data_hash=True
    )  # the fixed training set and the eval tokens are hashed


@pytest.mark.slow  # two subprocesses (torch import each)
def test_ntp_checkpoints_are_identical_across_processes(tmp_path):
    """Two processes, same command: every checkpoint tensor is identical, including the recorded state of
    NumPy's legacy global RNG (seeded by the trainer; unseeded it differs between processes)."""
    for side in ("A", "B"):
        assert_ok(
            run_cli(
                [
                    "ntp",
                    "train",
                    *NTP[: NTP.index("--steps")],
                    "--steps",
                    "2",
                    "--eval-size",
                    "16",
                    "--eval-every",
                    "0",
                    "--probe-every",
                    "0",
                    "--checkpoint-every",
                    "2",
                    "--threads",
                    "1",
                    "--out",
                    tmp_path / side,
                ]
            )
        )
    ck = Path("checkpoints") / "step-000002.safetensors"
    assert "rng.numpy" in tensors(tmp_path / "A" / ck)
    assert_same_tensors(tmp_path / "A" / ck, tmp_path / "B" / ck)
    env = json.loads((tmp_path / "A" / "environment.json").read_text())
    assert env["seeds"]["numpy_global"] == "numpy.random.seed(0)"


def test_ntp_attribute(ntp_twice):
    a, b = ntp_twice
    for d in (a, b):
        assert (
            run(
                "ntp",
                "attribute",
                d / "run",
                "--sites",
                "1:3,2:10",
                "--features",
                "all",
                "--check-identity",
                "--threads",
                "1",
                "--out",
                d / "attr",
            )
            == 0
        )
    assert any((a / "attr").glob("*.parquet"))
    assert_same_tree(a / "attr", b / "attr", roots=(a, b))


@pytest.mark.slow
def test_ntp_grid(tmp_path):
    for side in ("A", "B"):
        assert (
            run(
                "ntp",
                "grid",
                "--task",
                "cond-majority",
                "--regimes",
                "standard,myopic",
                "--seeds",
                "0,1",
                "--d-model",
                "16",
                "--heads",
                "2",
                "--batch-size",
                "16",
                "--steps",
                "6",
                "--eval-size",
                "64",
                "--checkpoint-every",
                "3",
                "--threads",
                "1",
                "--out",
                tmp_path / side,
            )
            == 0
        )
    assert_same_tree(tmp_path / "A", tmp_path / "B")


def test_nondeterministic_keys_are_only_timings():
    """Guard against hiding real differences: the ignored keys are wall-clock measurements only."""
    assert {
        "time",
        "seconds",
        "wall_seconds",
        "train_seconds",
        "build_seconds",
        "elapsed",
        "timestamp",
        "created",
        "duration",
        "seconds_per_attributed_step",
        "seconds_breakdown",
        "timings",
    } >= NONDETERMINISTIC_KEYS | EXTRA_TIMERS


def test_identical_tensors_give_identical_bytes_in_different_processes(tmp_path):
    """The safetensors writer orders the metadata by a per-process hash; save_tensors canonicalises the
    header, so three processes writing the same content produce byte-identical files that still load."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np; from originlens.storage import save_tensors; "
        "save_tensors(sys.argv[1], {'w': np.arange(6.0).reshape(2, 3), 'b': np.ones(3, np.float32)}, "
        "kind='test', metadata={k: i for i, k in enumerate('zyxwvutsrq')})"
    )
    files = [tmp_path / f"t{i}.safetensors" for i in range(3)]
    for f in files:
        subprocess.run([sys.executable, "-c", code, str(f)], check=True)
    blobs = {f.read_bytes() for f in files}
    assert len(blobs) == 1
    from originlens.storage import load_tensors

    arrays, meta = load_tensors(files[0], kind="test")
    assert arrays["w"].tolist() == [[0, 1, 2], [3, 4, 5]] and meta["q"] == "9"
