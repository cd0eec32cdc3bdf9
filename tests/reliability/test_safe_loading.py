"""Safe loading: nothing the project reads from outside can execute code; artefacts are checked."""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest

from originlens.errors import CompatibilityError, InputError, OriginlensError
from originlens.storage import load_tensors, save_tensors

SRC = Path(__file__).resolve().parents[2] / "src" / "originlens"


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {_Evil.marker}",))


def _write_evil(path: Path, marker: Path) -> None:
    _Evil.marker = marker
    path.write_bytes(pickle.dumps({"W_O": _Evil()}))


def test_malicious_pickle_disguised_as_checkpoint_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    bad = tmp_path / "model.safetensors"
    _write_evil(bad, marker)
    with pytest.raises(InputError, match="not a readable safetensors"):
        load_tensors(bad)
    assert not marker.exists()


def test_malicious_pickle_disguised_as_tokens_is_refused(tmp_path):
    from originlens.data import load_token_array

    marker = tmp_path / "pwned"
    # an object-dtype .npy file: loading it would need pickle
    arr = np.empty(2, dtype=object)
    arr[0] = _Evil()
    _Evil.marker = marker
    np.save(tmp_path / "tokens.npy", arr, allow_pickle=True)
    with pytest.raises(OriginlensError):
        load_token_array(tmp_path / "tokens.npy", 10)
    assert not marker.exists()
    _write_evil(tmp_path / "raw.npy", marker)
    with pytest.raises(OriginlensError):
        load_token_array(tmp_path / "raw.npy", 10)
    assert not marker.exists()


def test_malicious_pickle_as_statistics_and_probes(tmp_path):
    from originlens.probes import ProbeSet
    from originlens.stats import load_statistics

    marker = tmp_path / "pwned"
    (tmp_path / "s").mkdir()
    _write_evil(tmp_path / "s" / "statistics.safetensors", marker)
    with pytest.raises(OriginlensError):
        load_statistics(tmp_path / "s")
    _write_evil(tmp_path / "p.safetensors", marker)
    with pytest.raises(OriginlensError):
        ProbeSet.load(tmp_path / "p.safetensors")
    assert not marker.exists()


def test_kind_and_format_version_are_checked(tmp_path):
    save_tensors(tmp_path / "a.safetensors", {"x": np.zeros(2)}, kind="probes")
    with pytest.raises(CompatibilityError, match="expected 'corpus-statistics'"):
        load_tensors(tmp_path / "a.safetensors", kind="corpus-statistics")
    from safetensors.numpy import save_file

    save_file({"x": np.zeros(2)}, str(tmp_path / "b.safetensors"), metadata={"format_version": "999"})
    with pytest.raises(CompatibilityError, match="format version 999"):
        load_tensors(tmp_path / "b.safetensors")


def test_source_never_unpickles_or_evals():
    """Static guard: no pickle, eval/exec, unsafe torch.load or trust_remote_code=True in the package."""
    bad = []
    for p in SRC.rglob("*.py"):
        text = p.read_text(encoding="utf-8")
        for i, line in enumerate(text.splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"\bimport pickle\b|\bpickle\.loads?\(|\bcloudpickle\b|\bdill\b", code):
                bad.append(f"{p}:{i}: pickle")
            if re.search(r"(?<![\w.])(eval|exec)\(", code):
                bad.append(f"{p}:{i}: eval/exec")
            if "allow_pickle=True" in code:
                bad.append(f"{p}:{i}: allow_pickle=True")
            if re.search(r"torch\.load\(", code) and "weights_only=True" not in code:
                bad.append(f"{p}:{i}: torch.load without weights_only=True")
            if "trust_remote_code=True" in code:
                bad.append(f"{p}:{i}: trust_remote_code=True")
    assert not bad, "\n".join(bad)


# ------------------------------------------------------------------------------------------------------
# Every reader of outside artefacts, fed a malicious pickle under the name it expects.


def test_malicious_pickle_as_ntp_checkpoint_on_resume(tmp_path, capsys):
    from originlens.cli.main import main

    run = tmp_path / "run"
    args = [
        "-q",
        "ntp",
        "train",
        "--task",
        "cond-majority",
        "--d-model",
        "8",
        "--heads",
        "2",
        "--batch-size",
        "4",
        "--steps",
        "2",
        "--eval-size",
        "16",
        "--eval-every",
        "0",
        "--probe-every",
        "0",
        "--checkpoint-every",
        "1",
        "--out",
        str(run),
    ]
    assert main(args) == 0
    marker = tmp_path / "pwned"
    _write_evil(run / "checkpoints" / "step-000002.safetensors", marker)
    (run / "summary.json").unlink()
    capsys.readouterr()
    assert main([*args, "--resume"]) == 2
    err = capsys.readouterr().err
    assert "step-000002.safetensors is not a readable safetensors file" in err and err.count("\n") == 1, err
    assert not marker.exists()


def test_malicious_pickle_as_models_sae_tokenizers_and_configs(tmp_path):
    from originlens.config import load_config
    from originlens.data.tokenizers import load_tokenizer
    from originlens.lm.llama2c import load_llama2c
    from originlens.lm.llama2c_tokenizer import Llama2cTokenizer
    from originlens.models import GPT, load_assoc
    from originlens.train.ntp import NTPConfig, load_probe_metrics

    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.bin"
    _write_evil(evil, marker)
    loaders = {
        "GPT.load": lambda: GPT.load(evil),
        "load_assoc": lambda: load_assoc(evil),
        "load_llama2c": lambda: load_llama2c(evil),
        "Llama2cTokenizer": lambda: Llama2cTokenizer.from_file(evil, 32),
        "tokenizer.json": lambda: load_tokenizer(evil),
        "config.json": lambda: load_config(NTPConfig, evil),
    }
    for name, load in loaders.items():
        with pytest.raises(OriginlensError):
            load()
        assert not marker.exists(), name
    # probe metrics (.npz, np.load(allow_pickle=False)): refused, but with numpy's ValueError rather than an
    # InputError (train/ntp.py load_probe_metrics does not wrap it; reported)
    arr = np.empty(1, dtype=object)
    arr[0] = _Evil()
    np.savez(tmp_path / "pm.npz", pearson=arr)
    for f in (evil, tmp_path / "pm.npz"):
        with pytest.raises((OriginlensError, ValueError)):
            load_probe_metrics(f)
    assert not marker.exists()


def test_malicious_pickle_as_sae_weights(tmp_path):
    import json

    from originlens.sae.format import read_sae

    marker = tmp_path / "pwned"
    d = tmp_path / "sae"
    d.mkdir()
    (d / "cfg.json").write_text(
        json.dumps(
            {
                "d_in": 4,
                "d_sae": 8,
                "architecture": "standard",
                "dtype": "float32",
                "hook_name": "blocks.0.hook_resid_post",
            }
        )
    )
    _write_evil(d / "sae_weights.safetensors", marker)
    with pytest.raises(InputError, match="not a readable safetensors"):
        read_sae(d)
    assert not marker.exists()


@pytest.mark.slow
def test_malicious_pickle_in_a_hugging_face_directory(tmp_path, capsys):
    """A local Hugging Face directory whose only weights are a pickled pytorch_model.bin is refused with a
    one-line InputError (convert to safetensors) before anything is unpickled (lm/hf.py)."""
    pytest.importorskip("transformers")
    import json

    from originlens.cli.main import main
    from originlens.lm.hf import load_hf
    from originlens.lm.hf_hub import load_hf_model

    marker = tmp_path / "pwned"
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(
            {
                "model_type": "gpt2",
                "n_layer": 1,
                "n_head": 2,
                "n_embd": 8,
                "vocab_size": 11,
                "n_positions": 16,
                "architectures": ["GPT2LMHeadModel"],
            }
        )
    )
    _write_evil(d / "pytorch_model.bin", marker)
    for load in (load_hf_model, load_hf):
        with pytest.raises(InputError, match="only pickled PyTorch weights.*convert them to safetensors") as ei:
            load(d)
        assert "\n" not in ei.value.one_line()
    assert not marker.exists()
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]")).save(str(d / "tokenizer.json"))
    capsys.readouterr()
    assert main(["-q", "lm", "generate", "--model", str(d), "--prompt", "a", "--max-new-tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "only pickled PyTorch weights" in err, err
    assert not marker.exists()


def test_everything_written_is_safetensors_or_plain_arrays():
    """Static guard: no torch.save, no pickle-capable writers anywhere in the package."""
    bad = []
    for p in SRC.rglob("*.py"):
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"\btorch\.save\(|\bjoblib\b|\.dump\(.*pickle|np\.save\(.*allow_pickle=True", code):
                bad.append(f"{p}:{i}")
    assert not bad, "\n".join(bad)


# ------------------------------------------------------------------------------------------------------
# GPT checkpoints carry the vocabulary hash; a model is never used with data of another vocabulary.


def _word_corpus(path: Path, words: list[str], tmp: Path):
    """A corpus whose vocabulary is exactly ``words`` (+ <unk>), in a fixed frequency order."""
    from originlens.data import build_corpus

    rng = np.random.default_rng(0)
    p = np.arange(len(words), 0, -1, dtype=float)
    lines = [" ".join(rng.choice(words, size=12, p=p / p.sum())) for _ in range(200)]
    src = tmp / f"{path.name}-{words[0]}.txt"
    src.write_text("\n".join(lines), encoding="utf-8")
    return build_corpus(src, path, vocab_size=len(words) + 1, seq_len=8, oov="unk")


def _strip_vocab_hash(path: Path) -> None:
    """Rewrite a safetensors file as written before the vocabulary hash was recorded."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    with safe_open(str(path), framework="numpy") as f:
        meta = {k: v for k, v in (f.metadata() or {}).items() if k != "vocab_hash"}
        arrays = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (a safetensors handle)
    save_file(arrays, str(path), metadata=meta)


def test_gpt_checkpoints_carry_the_vocabulary_hash_and_refuse_other_data(tmp_path):
    from originlens.lm.checkpoints import load_gpt_adapter
    from originlens.lm.compare_statistics import VocabIdentity, check_vocab, model_identity
    from originlens.models import GPT
    from originlens.storage import vocab_hash
    from originlens.tasks import get_task
    from originlens.train.ntp import CHECKPOINT_KIND, NTPConfig, Trainer, checkpoint_metadata

    corpus = tmp_path / "corpus"
    store = _word_corpus(corpus, [f"w{chr(97 + i)}x" for i in range(20)], tmp_path)
    h = store.vocab_hash
    tiny = dict(
        task="language",
        corpus=str(corpus),
        n_layer=1,
        d_model=8,
        n_head=2,
        batch_size=8,
        eval_size=16,
        log_every=1,
        checkpoint_every=1,
    )
    run = tmp_path / "run"
    Trainer(NTPConfig(**tiny, steps=2), run).run()
    for f in (run / "checkpoints" / "step-000002.safetensors", run / "model.safetensors"):
        assert checkpoint_metadata(f)["vocab_hash"] == h
    assert GPT.load(run / "model.safetensors", expect_vocab_hash=h).config.vocab_size == 21
    with pytest.raises(CompatibilityError, match="trained on another vocabulary"):
        GPT.load(run / "model.safetensors", expect_vocab_hash=vocab_hash(["x"] * 21, 21))
    # analysis commands (lm compare, lm features) compare the model's hash with the corpus's
    adapter = load_gpt_adapter(run / "model.safetensors")
    assert check_vocab(model_identity(adapter), VocabIdentity(21, h), "corpus") == []
    with pytest.raises(CompatibilityError, match="another vocabulary"):
        check_vocab(model_identity(adapter), VocabIdentity(21, vocab_hash(["y"] * 21, 21)), "corpus")
    # checkpoints written before the hash was recorded still resume (and are not checked)
    for f in (*(run / "checkpoints").iterdir(), run / "model.safetensors"):
        _strip_vocab_hash(f)
    (run / "summary.json").unlink()
    Trainer(NTPConfig(**tiny, steps=3), run, resume=True).run()
    assert checkpoint_metadata(run / "checkpoints" / "step-000003.safetensors")["vocab_hash"] == h
    assert GPT.load(run / "model.safetensors").config.vocab_size == 21
    # the corpus rebuilt in place with another vocabulary of the same size: resuming is refused (before,
    # the weights loaded and training went on with every token id meaning another word)
    other = _word_corpus(corpus, [f"v{chr(97 + i)}x" for i in range(20)], tmp_path)
    assert other.vocab_size == 21 and other.vocab_hash != h
    (run / "summary.json").unlink()
    with pytest.raises(CompatibilityError, match="step-000003.safetensors was trained on another vocabulary"):
        Trainer(NTPConfig(**tiny, steps=4), run, resume=True)
    # synthetic tasks record the task's vocabulary
    syn = tmp_path / "syn"
    Trainer(
        NTPConfig(
            task="majority",
            n_layer=1,
            d_model=8,
            n_head=2,
            batch_size=4,
            steps=1,
            eval_size=16,
            eval_every=0,
            probe_every=0,
        ),
        syn,
    ).run()
    task = get_task("majority")
    _, meta = load_tensors(syn / "checkpoints" / "step-000001.safetensors", kind=CHECKPOINT_KIND)
    assert meta["vocab_hash"] == vocab_hash(list(task.vocab), task.vocab_size)
