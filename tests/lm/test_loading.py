"""Format registry, load_adapter / load_tokenizer dispatch, and ``originlens lm generate``/``export`` for
every supported format."""

from __future__ import annotations

import json

import pytest
import torch

from originlens.errors import CompatibilityError, ConfigError, InputError
from originlens.lm.codecs import TextCodec
from originlens.lm.loading import (
    MODEL_FORMATS,
    detect_format,
    load_adapter,
    load_gpt_checkpoint,
    load_model,
    load_tokenizer,
    open_tokenizer,
    parse_hub_spec,
)
from originlens.lm.native import GPTAdapter, Llama2cAdapter
from originlens.models.gpt import GPT, GPTConfig
from originlens.paths import data_path

MODEL_DIR = data_path("models", "stories260K", required=False)
needs_model = pytest.mark.skipif(
    not (MODEL_DIR / "stories260K.bin").is_file(), reason="stories260K not found (set ORIGINLENS_DATA)"
)
DOCS = ["the cat sat on the mat .", "the dog sat on the log .", "a cat and a dog ran ."]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from originlens.data.build import build_corpus

    d = tmp_path_factory.mktemp("corpus")
    (d / "docs.txt").write_text("\n".join(DOCS) + "\n")
    return build_corpus([d / "docs.txt"], d / "store", tokenizer="words", vocab_size=50, seq_len=4, windows="pack")


def _gpt(vocab):
    torch.manual_seed(0)
    g = GPT(GPTConfig(vocab_size=vocab, seq_len=16, n_layer=2, d_model=16, n_head=4))
    with torch.no_grad():
        for p in g.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    return g.eval()


def _run_cli(argv):
    from originlens.cli.main import main

    return main(argv)


def test_registry_names():
    assert [f.name for f in MODEL_FORMATS] == ["llama2c", "originlens-gpt", "hf"]


def test_gpt_checkpoints_and_tokenizer_discovery(tmp_path, corpus):
    g = _gpt(corpus.vocab_size)
    run = tmp_path / "run"
    g.save(run / "model.safetensors", metadata={"step": 3})
    assert detect_format(run / "model.safetensors").name == "originlens-gpt"
    ad = load_adapter(run / "model.safetensors")
    assert isinstance(ad, GPTAdapter) and isinstance(load_model(run / "model.safetensors"), GPT)
    toks = torch.randint(0, corpus.vocab_size, (2, 6))
    torch.testing.assert_close(ad.run(toks), g(toks), rtol=0, atol=0)
    # trainer checkpoint (kind "ntp-checkpoint": model.* tensors, Adam state, gpt_config metadata)
    from originlens.train.ntp import NTPConfig, save_checkpoint

    opt = torch.optim.Adam(g.parameters())
    save_checkpoint(run / "checkpoints" / "step-000003.safetensors", g, opt, 3, NTPConfig())
    ck = run / "checkpoints" / "step-000003.safetensors"
    assert detect_format(ck).name == "originlens-gpt"
    torch.testing.assert_close(load_gpt_checkpoint(ck)(toks), g(toks), rtol=0, atol=0)
    # no tokenizer anywhere yet
    with pytest.raises(InputError, match="no tokenizer found"):
        load_tokenizer(run / "model.safetensors")
    # the run's config.json names the corpus: found for the final model and for checkpoints
    (run / "config.json").write_text(json.dumps({"corpus": str(corpus.path)}))
    for path in (run / "model.safetensors", ck):
        codec = load_tokenizer(path)
        assert codec.vocab_size == corpus.vocab_size
        assert codec.decode(codec.encode("the cat sat")) == "the cat sat"
    # a tokenizer saved next to the checkpoint wins
    corpus.tokenizer().save(run)
    assert load_tokenizer(ck).source == str(run)
    # vocab.json word list next to a bare checkpoint
    bare = tmp_path / "bare"
    g.save(bare / "m.safetensors")
    (bare / "vocab.json").write_text(json.dumps(corpus.vocab))
    assert load_tokenizer(bare / "m.safetensors").encode("the dog") == corpus.tokenizer().encode("the dog")


def test_load_adapter_with_tokenizer_checks_vocab(tmp_path, corpus):
    g = _gpt(corpus.vocab_size)
    g.save(tmp_path / "m.safetensors")
    ad = load_adapter(tmp_path / "m.safetensors", tokenizer=corpus.path)
    codec = ad.tokenizer
    assert isinstance(codec, TextCodec) and ad.bos_id == codec.bos_id == corpus.tokenizer().eot_id
    small = _gpt(corpus.vocab_size - 1)
    small.save(tmp_path / "s.safetensors")
    with pytest.raises(CompatibilityError, match="tokens but the model"):
        load_adapter(tmp_path / "s.safetensors", tokenizer=corpus.path)
    assert load_adapter(ad) is ad


def test_recorded_vocabulary_hash_must_match_the_tokenizer(tmp_path, corpus, capsys):
    """A model file that records the vocabulary hash of its training data (as ``ntp train`` writes) is
    refused with a tokenizer of the same size but other token strings; the right tokenizer passes."""
    from originlens.storage import vocab_hash

    g = _gpt(corpus.vocab_size)
    vocab = list(corpus.vocab)
    g.save(tmp_path / "ok.safetensors", metadata={"vocab_hash": vocab_hash(vocab, len(vocab))})
    assert load_adapter(tmp_path / "ok.safetensors", tokenizer=corpus.path).tokenizer is not None
    swapped = vocab[:-2] + [vocab[-1], vocab[-2]]  # same size, two ids swapped
    g.save(tmp_path / "other.safetensors", metadata={"vocab_hash": vocab_hash(swapped, len(swapped))})
    with pytest.raises(CompatibilityError, match="not the model's"):
        load_adapter(tmp_path / "other.safetensors", tokenizer=corpus.path)
    assert (
        _run_cli(
            [
                "lm",
                "generate",
                "--model",
                str(tmp_path / "other.safetensors"),
                "--tokenizer",
                str(corpus.path),
                "--prompt",
                "the cat",
                "--max-new-tokens",
                "2",
            ]
        )
        == 2
    )
    assert "not the model's" in capsys.readouterr().err


def test_cli_generate_gpt_and_exported_hf_agree(tmp_path, corpus, capsys):
    pytest.importorskip("transformers")
    g = _gpt(corpus.vocab_size)
    g.save(tmp_path / "m.safetensors")
    corpus.tokenizer().save(tmp_path)
    # greedy continuation recomputed here from the model directly (prefix re-run, argmax)
    tok = corpus.tokenizer()
    ids = [tok.eot_id] + tok.encode("the cat")
    for _ in range(5):
        nxt = int(g(torch.tensor([ids]))[0, -1].argmax())
        if nxt == tok.eot_id:
            break
        ids.append(nxt)
    expect = tok.decode([i for i in ids if i != tok.eot_id])
    assert (
        _run_cli(
            [
                "lm",
                "generate",
                "--model",
                str(tmp_path / "m.safetensors"),
                "--prompt",
                "the cat",
                "--max-new-tokens",
                "5",
                "--greedy",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out == expect + "\n"
    # export to a Hugging Face GPT-2 directory, then generate through HFAdapter with the same tokenizer
    assert _run_cli(["lm", "export", "--model", str(tmp_path / "m.safetensors"), "--out", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    assert detect_format(tmp_path / "hf").name == "hf"
    assert type(load_adapter(tmp_path / "hf")).__name__ == "HFAdapter"
    assert (
        _run_cli(
            [
                "lm",
                "generate",
                "--model",
                str(tmp_path / "hf"),
                "--tokenizer",
                str(corpus.path),
                "--prompt",
                "the cat",
                "--max-new-tokens",
                "5",
                "--greedy",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == out
    # a Hugging Face directory without tokenizer and without --tokenizer: clear error
    assert _run_cli(["lm", "generate", "--model", str(tmp_path / "hf")]) == 2
    assert "no tokenizer" in capsys.readouterr().err


def test_hf_dir_tokenizer_json(tmp_path):
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    from originlens.lm.export import gpt_to_hf

    vocab = {w: i for i, w in enumerate(["<|endoftext|>", "the", "cat", "sat", "[UNK]"])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens(["<|endoftext|>"])
    tk.save(str(tmp_path / "tokenizer.json"))
    gpt_to_hf(_gpt(5), tmp_path / "hf", tokenizer=tmp_path / "tokenizer.json", bos_id=0, eos_id=0)
    codec = load_tokenizer(tmp_path / "hf")
    assert codec.encode("the cat sat") == [1, 2, 3] and codec.bos_id == 0
    assert codec.decode([0, 1, 2]).split() == ["the", "cat"]  # special tokens dropped
    ad = load_adapter(tmp_path / "hf")
    assert ad.bos_id == 0 and ad.stop_ids == (0,)


@needs_model
def test_llama2c_dispatch_and_tokenizer_autodiscovery():
    ad = load_adapter(MODEL_DIR / "stories260K.bin")
    assert isinstance(ad, Llama2cAdapter)
    codec = load_tokenizer(MODEL_DIR / "stories260K.bin")  # tok512.bin found next to it
    assert codec.vocab_size == 512 and codec.bos_id == 1
    ids = codec.encode("Once upon a time")
    assert ids and ids[0] != 1
    assert codec.decode([1] + ids) == "Once upon a time"
    explicit = open_tokenizer(MODEL_DIR / "tok512.bin")  # size counted from the file
    assert explicit.encode("a big dog") == codec.encode("a big dog")


def test_hub_specs_and_errors(monkeypatch, tmp_path):
    assert parse_hub_spec("hf:EleutherAI/pythia-70m@step1000") == ("EleutherAI/pythia-70m", "step1000")
    assert parse_hub_spec("hf:gpt2", "main") == ("gpt2", "main")
    with pytest.raises(ConfigError, match="two revisions"):
        parse_hub_spec("hf:a/b@x", "y")
    with pytest.raises(ConfigError):
        parse_hub_spec("hf:../etc")
    with pytest.raises(ConfigError, match="revisions only apply"):
        load_adapter(tmp_path, revision="step1")
    with pytest.raises(InputError, match="hf:EleutherAI/pythia-70m"):
        load_adapter("EleutherAI/pythia-70m")  # not a path: hint at the hub spec
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for call in (
        lambda: load_adapter("hf:originlens-test/nope@step1"),
        lambda: load_tokenizer("hf:originlens-test/nope", revision="step1"),
    ):
        with pytest.raises(InputError, match="hub could not be reached"):
            call()
    assert _run_cli(["lm", "generate", "--model", "hf:originlens-test/nope@step1", "--max-new-tokens", "1"]) == 2


def test_unknown_files(tmp_path):
    (tmp_path / "x.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(InputError, match="unrecognised model format"):
        load_adapter(tmp_path / "x.safetensors")
    with pytest.raises(InputError, match="does not exist"):
        open_tokenizer(tmp_path / "nope.json")
    (tmp_path / "t.bin").write_bytes(b"\x00" * 7)
    with pytest.raises(InputError, match="llama2.c tokenizer"):
        open_tokenizer(tmp_path / "t.bin")


def test_load_adapter_attaches_the_tokenizer_next_to_the_model(tmp_path, corpus):
    """A library caller gets the tokenizer that sits next to the model (as the commands find it) as
    ``adapter.tokenizer``; None when there is none, or when not asked to look."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    from originlens.lm.export import gpt_to_hf

    vocab = {w: i for i, w in enumerate(["<|endoftext|>", "the", "cat", "sat", "[UNK]"])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.save(str(tmp_path / "tokenizer.json"))
    gpt_to_hf(_gpt(5), tmp_path / "hf", tokenizer=tmp_path / "tokenizer.json", bos_id=0, eos_id=0)
    ad = load_adapter(tmp_path / "hf")
    assert ad.tokenizer is not None and ad.tokenizer.encode("the cat sat") == [1, 2, 3]
    assert load_adapter(tmp_path / "hf", find_tokenizer=False).tokenizer is None
    gpt_to_hf(_gpt(5), tmp_path / "bare", bos_id=0, eos_id=0)
    assert load_adapter(tmp_path / "bare").tokenizer is None
    run = tmp_path / "run"
    _gpt(corpus.vocab_size).save(run / "model.safetensors")
    assert load_adapter(run / "model.safetensors").tokenizer is None
    corpus.tokenizer().save(run)
    codec = load_adapter(run / "model.safetensors").tokenizer
    assert codec is not None and codec.source == str(run)
