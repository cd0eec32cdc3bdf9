"""The Pythia protocol of docs/reproduce.md, run offline against a faked Hugging Face hub cache of a tiny
GPT-NeoX model with three revisions (step1, step2, step4): the tokenizer is resolved next to the
checkpoints, ``--tokenizer hf:ID`` works, the resolved commit of every revision is recorded, per-head
layers are the paper's (1-based), and ``hf:`` dataset specs carry a config, a revision and a split."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[2]
REPO = "org/tiny-neox"
REVS = {"step1": "1" * 40, "step2": "2" * 40, "step4": "4" * 40}


def _texts(n=60):
    from originlens.data import generate_stories

    return generate_stories(n, 0)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """HF_HUB_CACHE holding models--org--tiny-neox with refs step1/2/4 → snapshots of different weights,
    each with config.json, model.safetensors and tokenizer.json."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("hub")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(_texts(), trainers.BpeTrainer(vocab_size=80, special_tokens=["<|endoftext|>", "<unk>"]))
    V = tok.get_vocab_size()
    repo = root / "cache" / ("models--" + REPO.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    for i, (rev, sha) in enumerate(REVS.items()):
        torch.manual_seed(i)
        cfg = transformers.GPTNeoXConfig(
            vocab_size=V,
            hidden_size=16,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=32,
            max_position_embeddings=64,
            bos_token_id=0,
            eos_token_id=0,
        )
        snap = repo / "snapshots" / sha
        transformers.GPTNeoXForCausalLM(cfg).save_pretrained(snap)
        tok.save(str(snap / "tokenizer.json"))
        (repo / "refs" / rev).write_text(sha)
    text = root / "texts.txt"
    text.write_text("".join(f"{t}\nthe end.\n" for t in _texts(200)))  # every other text is short
    return root, V, text


def _run(hub, *args):
    root, _, _ = hub
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(root / "cache"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONPATH": str(ROOT / "src"),
    }
    return subprocess.run(
        [sys.executable, "-m", "originlens", *args], capture_output=True, text=True, env=env, timeout=600
    )


def _docs_command() -> list[str]:
    text = (ROOT / "docs" / "reproduce.md").read_text(encoding="utf-8")
    m = re.search(r"`(originlens lm compare --model hf:EleutherAI/pythia[^`]*)`", text)
    assert m, "docs/reproduce.md lost the Pythia command"
    return m.group(1).split()[1:]


def _scaled(argv: list[str], out: Path, text: Path) -> list[str]:
    """The documented command at tiny scale: only the model, the step count, the corpus, the sizes, the
    per-head layer, the device and the output change."""
    sub = {
        "--model": f"hf:{REPO}",
        "--log-steps": "4",
        "--corpus": str(text),
        "--max-windows": "40",
        "--window": "24",
        "--top-tokens": "30",
        "--min-chars": "40",
        "--heads-layers": "2",
        "--device": "cpu",
        "--out": str(out),
    }
    out_args, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a in sub:
            out_args += [a, sub[a]]
            i += 2
        else:
            out_args.append(a)
            i += 1
    return out_args


@pytest.mark.slow
def test_the_documented_pythia_command_runs_offline_at_tiny_scale(hub, tmp_path):
    argv = _docs_command()
    assert argv[argv.index("--heads-layers") + 1] == "2,13,24"  # the paper's Fig. 7 layers, 1-based
    assert argv[argv.index("--min-chars") + 1] == "512"  # the paper's OpenWebText filter
    r = _run(hub, *_scaled(argv, tmp_path / "run", hub[2]))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    assert res["labels"] == ["step1", "step2", "step4"]
    assert res["config"]["texts"]["kept"] == 40 and res["config"]["texts"]["skipped_short"] == 39  # "the end." lines
    text = json.dumps(res)
    for sha in REVS.values():  # resolved commits recorded
        assert sha in text
    assert res["grid"]["commits"] == {rev: sha for rev, sha in REVS.items()}
    assert res["config"]["tokenizer_source"].endswith(f"snapshots/{REVS['step1']}/tokenizer.json")


@pytest.mark.slow
def test_tokenizer_from_the_hub_and_explicit_hf_tokenizer_agree(hub, tmp_path):
    base = [
        "lm",
        "compare",
        "--model",
        f"hf:{REPO}",
        "--checkpoints",
        "step1",
        "--corpus",
        str(hub[2]),
        "--max-windows",
        "30",
        "--window",
        "16",
        "--top-tokens",
        "20",
        "--no-null-baseline",
    ]
    a = _run(hub, *base, "--out", str(tmp_path / "a"))
    b = _run(hub, *base, "--tokenizer", f"hf:{REPO}@step1", "--out", str(tmp_path / "b"))
    assert a.returncode == 0 and b.returncode == 0, (a.stderr[-2000:], b.stderr[-2000:])
    ra, rb = (json.loads((tmp_path / d / "results.json").read_text()) for d in "ab")
    assert ra["cosines"] == rb["cosines"]


@pytest.mark.slow
def test_a_local_hugging_face_directory_brings_its_tokenizer(hub, tmp_path):
    snap = hub[0] / "cache" / ("models--" + REPO.replace("/", "--")) / "snapshots" / REVS["step2"]
    r = _run(
        hub,
        "lm",
        "compare",
        "--model",
        str(snap),
        "--corpus",
        str(hub[2]),
        "--max-windows",
        "20",
        "--window",
        "16",
        "--top-tokens",
        "20",
        "--no-null-baseline",
        "--min-tokens",
        "12",
        "--out",
        str(tmp_path / "d"),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "d" / "results.json").read_text())
    assert res["config"]["tokenizer_source"] == str(snap / "tokenizer.json")
    assert res["config"]["texts"]["kept"] == 20 and res["config"]["texts"]["skipped_short"] > 0
    assert res["config"]["corpus_sources"][0]["sha256"] and res["grid"]["commits"] == {}


def test_a_tokenizer_revision_missing_from_the_cache_is_one_line(hub, tmp_path):
    r = _run(
        hub,
        "lm",
        "compare",
        "--model",
        f"hf:{REPO}",
        "--checkpoints",
        "step1",
        "--corpus",
        str(hub[2]),
        "--tokenizer",
        f"hf:{REPO}@step999",
        "--out",
        str(tmp_path / "x"),
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "step999" in r.stderr and len(r.stderr.strip().splitlines()) <= 2


def test_hf_dataset_specs():
    from originlens.data.readers import HFDataset, parse_hf

    assert parse_hf("hf:roneneldan/TinyStories") == HFDataset("roneneldan/TinyStories", None, None, "train")
    fw = parse_hf("hf:HuggingFaceFW/fineweb/sample-10BT@v1.2.0:train")
    assert fw == HFDataset("HuggingFaceFW/fineweb", "sample-10BT", "v1.2.0", "train")
    assert parse_hf(fw.spec) == fw and fw.spec == "hf:HuggingFaceFW/fineweb/sample-10BT@v1.2.0:train"
    assert parse_hf("hf:Skylion007/openwebtext:train[:1%]").split == "train[:1%]"
    assert parse_hf("hf:openwebtext").name == "openwebtext"
    from originlens.errors import ConfigError

    for bad in ("hf:", "hf:a/b/c/d", "hf:a/b@", "hf:/x", "hf:a b"):
        with pytest.raises(ConfigError, match="Hugging Face source"):
            parse_hf(bad)


def test_hf_datasets_get_config_and_revision_and_record_the_commit(monkeypatch, tmp_path):
    import datasets
    from huggingface_hub import constants

    from originlens.data import iter_documents, source_fingerprint

    seen = {}

    def fake_load(path, name=None, **kw):
        seen.update(name=path, config=name, **kw)
        return [{"text": "one story"}, {"text": "two"}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    docs = list(iter_documents("hf:HuggingFaceFW/fineweb/sample-10BT@step5:train"))
    assert docs == ["one story", "two"]
    assert seen == {
        "name": "HuggingFaceFW/fineweb",
        "config": "sample-10BT",
        "revision": "step5",
        "split": "train",
        "streaming": True,
    }
    refs = tmp_path / "datasets--HuggingFaceFW--fineweb" / "refs"
    refs.mkdir(parents=True)
    (refs / "step5").write_text("ab" * 20)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    rec = source_fingerprint("hf:HuggingFaceFW/fineweb/sample-10BT@step5:train")[0]
    assert rec["resolved_commit"] == "ab" * 20 and rec["config"] == "sample-10BT" and rec["revision"] == "step5"
    assert source_fingerprint("hf:HuggingFaceFW/fineweb@other")[0]["resolved_commit"] is None


def test_min_tokens_keeps_only_long_texts_and_max_texts_counts_kept():
    from originlens.lm.compare_statistics import windows_from_texts

    texts = ["a b c d e", "a b", "a b c d", "a", "a b c d e f g"]
    enc = lambda t: [ord(c) - 96 for c in t.split()]
    counts = {}
    w, valid = windows_from_texts(texts, enc, bos_id=0, window_tokens=4, max_texts=2, min_tokens=4, counts=counts)
    assert w.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]] and counts == {"read": 3, "kept": 2, "skipped_short": 1}
    w, _ = windows_from_texts(texts, enc, bos_id=None, window_tokens=3)
    assert len(w) == 4  # "a" alone gives one token: no pair
    w, _ = windows_from_texts(texts, enc, bos_id=None, window_tokens=3, min_chars=9, counts=counts)
    assert len(w) == 2 and counts["skipped_short"] == 3  # "a b c d e" (9 chars) and the longest
