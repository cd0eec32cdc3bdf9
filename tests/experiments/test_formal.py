"""The formal-feature experiment (Q(w) section of arXiv 2603.14087): the labelling rule against a brute-force
computation, the code / punctuation criteria on hand-written text, σ(ln Q) and its bootstrap against NumPy,
the end-to-end ci run recomputed from its stored per-feature arrays, resumption, verdict rules, and the
refusal of a corpus that lacks a domain."""

from __future__ import annotations

import json
import math
import string

import numpy as np
import pytest
from scipy import stats

from originlens.errors import ConfigError, InputError
from originlens.experiments import formal_metrics as fm
from originlens.experiments.formal import run_formal
from originlens.experiments.formal_config import FormalConfig
from originlens.experiments.formal_corpus import build_mixed_corpus
from originlens.experiments.formal_report import judge_formal_share, judge_lookahead, judge_steering, render_section
from originlens.experiments.results import read_results
from originlens.experiments.verdicts import VERDICTS

# ----------------------------------------------------------------------------------------------------
# labels


def test_labels_equal_a_brute_force_computation():
    rng = np.random.default_rng(3)
    acts = np.maximum(rng.normal(size=(40, 7)), 0.0)
    domain = np.array([0] * 20 + [1] * 20)
    acts[:, 0] = 0.0  # dead
    acts[:20, 1], acts[20:, 1] = 0.0, 1.0  # python only
    acts[:20, 2], acts[20:, 2] = 1.0, 0.0  # story only
    acts[:20, 3], acts[20:, 3] = 1.0, 4.0  # share exactly 0.8: formal at θ = 0.8
    acts[:20, 4], acts[20:, 4] = 1.0, 1.0  # share 0.5: other
    theta = 0.8
    masses = fm.domain_masses(acts, domain)
    share = fm.python_shares(masses)
    labels = fm.label_features(share, theta)
    for f in range(acts.shape[1]):
        py = sum(acts[t, f] for t in range(40) if domain[t] == 1)
        total = sum(acts[t, f] for t in range(40))
        if total == 0:
            assert math.isnan(share[f]) and labels[f] == fm.DEAD
            continue
        assert share[f] == pytest.approx(py / total, rel=1e-12)
        assert labels[f] == (fm.FORMAL if py / total >= theta else fm.OTHER)
    assert labels[:5].tolist() == [fm.DEAD, fm.FORMAL, fm.OTHER, fm.FORMAL, fm.OTHER]
    # batch-wise accumulation (as the pipeline does) equals the whole-matrix masses
    parts = sum(fm.domain_masses(acts[a : a + 7], domain[a : a + 7]) for a in range(0, 40, 7))
    np.testing.assert_allclose(parts, masses, rtol=1e-12)
    h = fm.share_histogram(share)
    assert sum(h["counts"]) == 6 and h["dead"] == 1


# ----------------------------------------------------------------------------------------------------
# generated text

CODE = [
    "def area(self, radius):\n    return 3.14 * radius ** 2",
    "for key, value in sorted(kwargs.items()):\n    if isinstance(value, dict):\n        self._cache[key] = value",
    "class Foo(Bar):\n    @property\n    def name(self) -> str:\n        return self._name",
]
PROSE = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun!",
    '"Mom, can you help me?" asked Tom. His mom said: "Yes; of course."',
]


def test_code_fraction_on_hand_written_text():
    for s in CODE:
        assert fm.code_fraction(s) > 0.25, s
    for s in PROSE:
        assert fm.code_fraction(s) == 0.0, s
        assert fm.punctuation_fraction(s) < 0.2
    assert fm.code_fraction("!!! ... ,,, ??? --") == 0.0
    assert fm.punctuation_fraction("!!! ... ,,, ??? --") == 1.0
    assert math.isnan(fm.code_fraction("   \n "))
    # brute force on one string: code pieces are "def", "(", "self", "):" out of all pieces
    s = "def f(self): pass"
    assert fm.code_fraction(s) == pytest.approx((3 + 1 + 4 + 2) / (3 + 1 + 1 + 4 + 2 + 4))
    punct = sum(ch in string.punctuation for ch in s)
    assert fm.punctuation_fraction(s) == pytest.approx(punct / len(s.replace(" ", "")))
    # the criterion sees what the BPE decoder gives back (whitespace dropped, pieces joined by spaces)
    for s in CODE + PROSE:
        assert fm.code_fraction(" ".join(fm.text_pieces(s))) == pytest.approx(fm.code_fraction(s))
    pooled = fm.pooled_fractions(CODE[:1] + PROSE[:1])
    c0, n0 = fm.code_chars(CODE[0])
    c1, n1 = fm.code_chars(PROSE[0])
    assert pooled["code_frac"] == pytest.approx((c0 + c1) / (n0 + n1))


def test_python_token_share_and_fraction():
    tokens = np.array([[0, 0, 1, 1], [0, 2, 2, 2], [3, 3, 3, 1]])
    domain = np.array([0, 1, 1])
    share = fm.python_token_share(tokens, domain, 5)
    story = (np.bincount(tokens[0], minlength=5) + 1) / (4 + 5)
    py = (np.bincount(tokens[1:].ravel(), minlength=5) + 1) / (8 + 5)
    np.testing.assert_allclose(share, py / (py + story))
    assert fm.python_token_fraction([[2, 2, 0]], share, 0.7) == pytest.approx(2 / 3)


# ----------------------------------------------------------------------------------------------------
# σ(ln Q)


def test_sigma_and_bootstrap_against_numpy():
    rng = np.random.default_rng(0)
    q = np.exp(rng.normal(size=60) * np.r_[np.full(25, 2.0), np.full(35, 1.0)])
    labels = np.r_[np.full(25, fm.FORMAL), np.full(35, fm.OTHER)].astype(np.int8)
    q[3], q[40], labels[50] = np.nan, -1.0, fm.DEAD  # unscored, non-positive and dead features are left out
    b = fm.bootstrap_sigma(q, labels, n_boot=500, seed=11)
    lf = np.log(q[:25][np.isfinite(q[:25])])
    lo = np.log(np.delete(q[25:], [15, 25]))  # q[40] ≤ 0, feature 50 dead
    assert b["n_formal"] == lf.size == 24 and b["n_other"] == lo.size == 33
    assert b["formal"]["estimate"] == pytest.approx(np.std(lf, ddof=1))
    assert b["other"]["estimate"] == pytest.approx(np.std(lo, ddof=1))
    assert fm.sigma_log(q[:25]) == pytest.approx(np.std(lf, ddof=1))
    r = np.random.default_rng(11)
    bf = lf[r.integers(0, lf.size, (500, lf.size))].std(axis=1, ddof=1)
    bo = lo[r.integers(0, lo.size, (500, lo.size))].std(axis=1, ddof=1)
    for key, draws in (("formal", bf), ("other", bo), ("difference", bf - bo)):
        assert [b[key]["low"], b[key]["high"]] == pytest.approx(np.quantile(draws, [0.025, 0.975]).tolist())
    assert b["difference"]["low"] < b["difference"]["estimate"] < b["difference"]["high"]
    # the permutation null separates a real spread difference from none
    assert fm.permutation_sigma(q, labels, n_perm=400, seed=1)["p"] < 0.01
    same = np.exp(rng.normal(size=60))
    assert fm.permutation_sigma(same, labels, n_perm=400, seed=1)["p"] > 0.05


def test_spearman_permutation_matches_scipy():
    rng = np.random.default_rng(5)
    x = rng.normal(size=50)
    y = -x + rng.normal(size=50) * 0.5
    y[7] = np.nan
    r = fm.spearman_permutation(x, y, n_perm=300, seed=2)
    m = np.isfinite(y)
    assert r["rho"] == pytest.approx(stats.spearmanr(x[m], y[m]).statistic) and r["n"] == 49
    assert r["p"] == pytest.approx(1 / 301)
    z, half = math.atanh(r["rho"]), 1.96 * math.sqrt(1.06 / 46)
    assert [r["low"], r["high"]] == pytest.approx([math.tanh(z - half), math.tanh(z + half)], rel=1e-3)
    assert fm.spearman_permutation(x, rng.normal(size=50), n_perm=300, seed=2)["p"] > 0.05


# ----------------------------------------------------------------------------------------------------
# the corpus


def _stories(n: int) -> list[str]:
    return [
        f"Story {i}: once upon a time a little dog named Max ran to the park and played with a red ball. " * 3
        for i in range(n)
    ]


def test_a_corpus_without_python_or_without_windows_is_refused(tmp_path):
    with pytest.raises(InputError, match="python documents") as e:
        build_mixed_corpus(tmp_path / "a", _stories(6), [], heldout_frac=0.2, vocab_size=200, seq_len=16)
    assert e.value.fix
    with pytest.raises(InputError, match="story documents"):
        build_mixed_corpus(
            tmp_path / "b", ["  ", ""], ["def f(x):\n    return x\n"] * 3, heldout_frac=0.2, vocab_size=200, seq_len=16
        )
    with pytest.raises(InputError, match="python documents") as e:  # too short for one window of T + 1 tokens
        build_mixed_corpus(
            tmp_path / "c", _stories(6), ["x = 1", "y = 2"], heldout_frac=0.5, vocab_size=200, seq_len=16
        )
    assert "lower seq_len" in e.value.fix


def test_config_is_checked():
    with pytest.raises(ConfigError, match="unknown override"):
        FormalConfig(scale="ci", overrides={"stepz": 3})
    with pytest.raises(ConfigError, match="unknown scale"):
        FormalConfig(scale="paper")
    with pytest.raises(ConfigError, match="la_max_offset"):
        FormalConfig(scale="ci", overrides={"la_max_offset": 1})
    cfg = FormalConfig(scale="ci", seeds=[0], overrides={"steps": 7})
    assert any(d.startswith("steps 7") for d in cfg.deviations())


# ----------------------------------------------------------------------------------------------------
# end to end at the ci scale


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("formal")
    cfg = FormalConfig(scale="ci", seeds=[0, 1])
    s = run_formal(cfg, out / "exp", results=out / "res.json", command="originlens test")
    return cfg, out, s, read_results(out / "res.json")


@pytest.mark.slow
def test_corpus_windows_carry_their_domain_and_split(ci_run):
    cfg, out, _, rec = ci_run
    exp = out / "exp"
    docs = [json.loads(x) for x in (exp / "corpus-data" / "documents.jsonl").read_text(encoding="utf-8").splitlines()]
    w = np.load(exp / "corpus-data" / "windows.npz")
    doc = np.load(exp / "corpus" / "window_documents.npy")
    assert w["domain"].tolist() == [fm.DOMAINS.index(docs[i]["domain"]) for i in doc]
    assert w["heldout"].tolist() == [docs[i]["heldout"] for i in doc]
    n_h = int(w["heldout"].sum())
    assert w["heldout"][-n_h:].all() and not w["heldout"][:-n_h].any()  # the trainer's eval set
    counts = rec["scale"]["corpus"]["counts"]
    for name in fm.DOMAINS:
        assert counts[f"{name}_train_windows"] > 0 and counts[f"{name}_heldout_windows"] > 0
    assert (
        "TinyStories" in rec["scale"]["corpus"]["story_source"]
        or "storyworld" in rec["scale"]["corpus"]["story_source"]
    )


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Mean of empty slice:RuntimeWarning")
def test_results_are_recomputed_from_the_stored_arrays(ci_run):
    cfg, out, s, rec = ci_run
    s_ = cfg.settings
    assert rec["experiment"] == "formal" and rec["seeds"] == [0, 1] and rec["command"] == "originlens test"
    for r in ("standard", "myopic"):
        diffs, rhos = [], []
        for seed in cfg.seeds:
            d = out / "exp" / f"seed-{seed}" / r
            lab, q = np.load(d / "labels.npz"), np.load(d / "qscore.npz")["q"]
            assert (fm.label_features(lab["share"], s_["threshold"]) == lab["label"]).all()
            np.testing.assert_allclose(fm.python_shares(lab["masses"]), lab["share"], equal_nan=True)
            ok = np.isfinite(q) & (q > 0)
            f, o = np.log(q[ok & (lab["label"] == 1)]), np.log(q[ok & (lab["label"] == 0)])
            got = rec["numbers"]["sigma_lnq"][r]["per_seed"][str(seed)]["sigma"]
            assert got["n_formal"] == f.size and got["n_other"] == o.size and f.size >= 2 and o.size >= 2
            assert got["formal"]["estimate"] == pytest.approx(np.std(f, ddof=1), rel=1e-9)
            assert got["other"]["estimate"] == pytest.approx(np.std(o, ddof=1), rel=1e-9)
            diffs.append(np.std(f, ddof=1) - np.std(o, ddof=1))
            al = np.load(d / "lookahead.npz")["alignment"]
            a = np.nanmean(al[1:], axis=0)
            m = ok & np.isfinite(a)
            rho = stats.spearmanr(a[m], q[m]).statistic
            assert rec["numbers"]["lookahead"][r]["per_seed"][str(seed)]["rho"] == pytest.approx(rho, abs=1e-9)
            rhos.append(rho)
        diff = rec["numbers"]["sigma_lnq"][r]["difference"]
        assert diff["mean"] == pytest.approx(np.mean(diffs)) and diff["low"] < diff["mean"] < diff["high"]
        t = rec["tests"]["formal_share"][r]
        assert t["p_t"] == pytest.approx(stats.ttest_1samp(diffs, 0.0, alternative="greater").pvalue)
        z = np.arctanh(rhos)
        assert rec["tests"]["lookahead"][r]["p_t"] == pytest.approx(
            stats.ttest_1samp(z, 0.0, alternative="less").pvalue
        )
    # held-out losses per domain, recomputed from the model and the corpus
    import torch

    from originlens.data.store import TokenStore
    from originlens.models.gpt import GPT

    toks = np.asarray(TokenStore.open(out / "exp" / "corpus").tokens)
    w = np.load(out / "exp" / "corpus-data" / "windows.npz")
    model = GPT.load(out / "exp" / "seed-1" / "standard" / "run" / "model.safetensors").eval()
    for dom, name in enumerate(fm.DOMAINS):
        x = torch.from_numpy(
            toks[np.nonzero(w["heldout"] & (w["domain"] == dom))[0][: s_["eval_windows"]]].astype(np.int64)
        )
        with torch.no_grad():
            ce = torch.nn.functional.cross_entropy(model(x)[:, :-1].transpose(1, 2).double(), x[:, 1:]).item()
        assert rec["quality"]["held_out_loss"]["standard"][name]["values"][1] == pytest.approx(ce, rel=1e-6)
        init = rec["quality"]["held_out_loss"]["initial"][name]["mean"]
        assert rec["quality"]["held_out_loss"]["standard"][name]["mean"] < init  # some learning, even at ci
    # steering: per-seed means recomputed from the stored cells
    st = json.loads((out / "exp" / "seed-0" / "standard" / "steering.json").read_text(encoding="utf-8"))
    top = [c["code_frac"] for c in st["cells"] if c["group"] == "top" and c["code_frac"] is not None]
    per_prompt = [
        np.mean([c["code_frac"] for c in st["cells"] if c["group"] == "top" and c["prompt"] == p])
        for p in sorted({c["prompt"] for c in st["cells"]})
    ]
    assert top and rec["numbers"]["steering"]["code_frac"]["seed_means"]["top"]["values"][0] == pytest.approx(
        np.mean(per_prompt)
    )
    assert set(st["features"]) == {"top", "bottom", "random"}
    assert (out / "exp" / "report.html").is_file()


@pytest.mark.slow
def test_a_rerun_resumes_and_other_settings_are_refused(ci_run):
    cfg, out, s, rec = ci_run
    exp = out / "exp"
    stamps = {p: p.stat().st_mtime_ns for p in exp.glob("seed-*/*/*.npz")}
    again = run_formal(cfg, exp, results=out / "res2.json", command="originlens test")
    assert {p: p.stat().st_mtime_ns for p in exp.glob("seed-*/*/*.npz")} == stamps
    assert again["numbers"]["sigma_lnq"] == s["numbers"]["sigma_lnq"]
    with pytest.raises(ConfigError, match="other settings"):
        run_formal(FormalConfig(scale="ci", seeds=[0], overrides={"steps": 3}), exp, results=out / "res3.json")


@pytest.mark.slow
def test_verdicts_and_docs_section(ci_run):
    _, _, _, rec = ci_run
    for j in (judge_formal_share, judge_steering, judge_lookahead):
        v = j(rec)
        assert v.verdict in VERDICTS and v.ours and v.scale
    lines = render_section("formal/formal-ci", rec)
    assert lines[0].startswith("### formal-ci") and any("σ(ln Q)" in x for x in lines)
    # whatever the tests say, models that did not learn both domains cannot reproduce a claim
    fake = json.loads(json.dumps(rec))
    fake["quality"]["learned"]["standard"] = False
    for t in [
        fake["tests"]["formal_share"]["standard"],
        fake["tests"]["lookahead"]["standard"],
        *fake["tests"]["steering"].values(),
    ]:
        t["holds"] = True
    assert {j(fake).verdict for j in (judge_formal_share, judge_steering, judge_lookahead)} == {"partial"}
    fake["quality"]["learned"]["standard"] = True
    assert {j(fake).verdict for j in (judge_formal_share, judge_steering, judge_lookahead)} == {"partial"}  # 2 seeds
    fake["seeds"] = [0, 1, 2]
    assert {j(fake).verdict for j in (judge_formal_share, judge_steering, judge_lookahead)} == {"reproduced"}
    for t in [
        fake["tests"]["formal_share"]["standard"],
        fake["tests"]["lookahead"]["standard"],
        *fake["tests"]["steering"].values(),
    ]:
        t["holds"], t["permutation_significant"] = False, 0
    assert {j(fake).verdict for j in (judge_formal_share, judge_steering, judge_lookahead)} == {"not reproduced"}


def test_cli_parses_the_command():
    from originlens.cli.formal_experiment_cmd import cmd_formal
    from originlens.cli.main import build_parser

    args = build_parser().parse_args(
        [
            "ntp",
            "experiment",
            "formal",
            "--scale",
            "ci",
            "--seeds",
            "0-1",
            "--out",
            "x",
            "--set",
            "steps=5",
            "--set",
            "steer_alphas=[1, 2]",
        ]
    )
    assert args.func is cmd_formal and args.seeds == [0, 1] and args.set == [("steps", 5), ("steer_alphas", [1, 2])]
