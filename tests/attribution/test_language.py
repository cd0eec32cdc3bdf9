"""Pathway attribution of the TinyStories language task with its per-token syntax and position
features (arXiv 2603.14087 §6.4): a run trained with task options is replayed exactly and attributed;
features the task does not define are one clear error."""

from __future__ import annotations

import pytest
import torch

from originlens.attribution.replay import attribute_run
from originlens.data import generate_stories
from originlens.errors import ConfigError
from originlens.train.ntp import NTPConfig, Trainer


@pytest.fixture(scope="module")
def story_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    (root / "tinystories").mkdir()
    (root / "tinystories" / "stories-000.txt").write_text("\n".join(generate_stories(240, seed=5)) + "\n")
    opts = {
        "data_root": str(root),
        "cache_dir": str(root / "cache"),
        "syntax_features": True,
        "annotator": "gold",
        "bpe_vocab_size": 300,
        "window": 40,
    }
    cfg = NTPConfig(
        task="tinystories",
        task_options=opts,
        n_layer=2,
        d_model=16,
        n_head=2,
        batch_size=8,
        steps=3,
        eval_size=60,
        probe_every=0,
        eval_every=0,
        checkpoint_every=1,
        probe_positions=[10, 11],
        dtype="float64",
    )
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        Trainer(cfg, root / "run").run()
    finally:
        torch.set_num_threads(old)
    return root / "run"


def test_language_task_with_syntax_features_is_attributed(story_run, tmp_path):
    res = attribute_run(
        story_run,
        sites=[(1, 10), (2, 11)],
        features=["tag_DT", "dep_nsubj", "pos_int"],
        segment=(0, 3),
        out=tmp_path / "a",
    )
    rows = res.table.to_pylist()
    assert {r["feature"] for r in rows} == {"tag_DT", "dep_nsubj", "pos_int"}
    assert {r["component"] for r in rows} >= {"direct", "precached", "shared", "full"}
    assert all(r["type"] is None for r in rows)  # the task types no features
    # G_pre vanishes at the last layer (nothing but λ_i reads r^L_i)
    last = [r for r in rows if r["site_layer"] == 2 and r["component"] == "precached"]
    assert last and all(abs(r["influence"]) < 1e-15 for r in last)


def test_features_the_task_does_not_define_are_refused(story_run, tmp_path):
    with pytest.raises(ConfigError, match="is_majority_<0>"):
        attribute_run(story_run, sites=[(1, 10)], features=["is_majority_<0>"], segment=(0, 3), out=tmp_path / "b")
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").rglob("*.parquet"))
