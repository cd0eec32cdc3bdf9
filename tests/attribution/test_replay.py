"""Tests for originlens.attribution.replay / .store and ``originlens attribute``.

References written here in float64 on tiny runs trained by the NTP trainer: the batches are redrawn with
the documented data-order rule (``default_rng([seed, 7, b])``), the pathway components come from the
stop-gradient definition of arXiv 2603.14087 Prop. 3.1 (own hook, own per-position losses), Adam's component moments from an
explicit loop, ∇R from an explicit backward of the mismatch against a forward of the final model.
"""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.nn.functional as F

from originlens.attribution import store as ostore
from originlens.attribution.replay import attribute_run
from originlens.cli.main import main as cli_main
from originlens.errors import CompatibilityError, ConfigError, InputError, NumericalError
from originlens.models import GPT
from originlens.probes import ProbeSet
from originlens.storage import load_tensors, save_tensors
from originlens.tasks import get_task
from originlens.train.ntp import NTPConfig, Trainer

from tolerances import reduction_rtol

SITES = [(1, 3), (2, 10)]  # Majority: position 3 NTP-useless, 10 NTP-useful; k = 2 = L
FEATURE = "is_majority_<0>"


@pytest.fixture(autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


TRAIN_SIZE = 64  # the toy runs' fixed training set (the paper's protocol, scaled down)


def _train(path, **kw):
    base = dict(
        task="majority",
        n_layer=2,
        d_model=8,
        n_head=2,
        batch_size=8,
        steps=4,
        eval_size=40,
        train_size=TRAIN_SIZE,
        log_every=1,
        eval_every=0,
        probe_every=0,
        checkpoint_every=1,
        dtype="float64",
    )
    base.update(kw)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        Trainer(NTPConfig(**base), path).run()
    finally:
        torch.set_num_threads(old)
    return path


@pytest.fixture(scope="module")
def maj(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("maj") / "run")


@pytest.fixture(scope="module")
def oth(tmp_path_factory):
    return _train(
        tmp_path_factory.mktemp("oth") / "run",
        task="othello",
        train_size=0,
        n_layer=1,
        d_model=16,
        batch_size=6,
        steps=2,
        othello_pool=30,
        eval_size=30,
    )


def rows_of(table: pa.Table, **where) -> list[dict]:
    return [r for r in table.to_pylist() if all(r[k] == v for k, v in where.items())]


# ----------------------------------------------------------------------------------------------------
# float64 references


def params_at(run, step: int) -> GPT:
    """θ_step: the initialisation rule for step 0, else the checkpoint's weights."""
    final = GPT.load(run / "model.safetensors")
    torch.manual_seed(json.loads((run / "config.json").read_text())["seed"])
    model = GPT(final.config)
    if step:
        arrays, _ = load_tensors(run / "checkpoints" / f"step-{step:06d}.safetensors")
        model.load_state_dict({k[6:]: torch.from_numpy(v.copy()) for k, v in arrays.items() if k.startswith("model.")})
    return model


def majority_batch(seed: int, b: int, n: int, train_size: int = TRAIN_SIZE) -> torch.Tensor:
    """Batch b of the trainer's data order: rows of the fixed training set task.sample(N, rng([seed, 11]))."""
    pool = get_task("majority").sample(train_size, np.random.default_rng([seed, 11])).tokens
    rows = np.sort(np.random.default_rng([seed, 7, b]).integers(0, train_size, n))
    return torch.from_numpy(pool[rows])


def brute_components(model: GPT, x: torch.Tensor, k: int, i: int) -> dict[str, list[torch.Tensor]]:
    """G_dir, G_pre, G_sh and ∇L by the stop-gradient definition (arXiv 2603.14087 Prop. 3.1)."""
    params = list(model.parameters())
    B, T = x.shape

    def lambdas(hooks=None):
        logits = model(x, hooks=hooks)
        ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="none")
        return ce.view(B, T - 1).sum(0) / (B * (T - 1))  # λ_t

    def sg(h, site):
        m = torch.zeros(1, h.shape[1], 1, dtype=h.dtype)
        m[:, i] = 1.0
        return h + m * (h.detach() - h)

    def grad(scalar):
        g = torch.autograd.grad(scalar, params, retain_graph=True, allow_unused=True)
        return [torch.zeros_like(p) if gi is None else gi for gi, p in zip(g, params)]

    lam, lam_sg = lambdas(), lambdas({f"resid.{k}": sg})
    full, sh = grad(lam.sum()), grad(lam_sg.sum())
    direct = [a - b for a, b in zip(grad(lam[i]), grad(lam_sg[i]))]
    pre = [f - s - d for f, s, d in zip(full, sh, direct)]
    return {"direct": direct, "precached": pre, "shared": sh, "full": full}


def grad_R(model: GPT, final: GPT, x: torch.Tensor, k: int, i: int, w: torch.Tensor, rows=None) -> list[torch.Tensor]:
    """∇R, R = ½ mean_b(⟨w, r^k_{b,i}(θ)⟩ − ⟨w, r^k_{b,i}(θ*)⟩)² over ``rows``."""
    with torch.no_grad():
        ref = final(x, return_residuals=True)[1][k][:, i] @ w
    cur = model(x, return_residuals=True)[1][k][:, i] @ w
    d = cur - ref
    if rows is not None:
        d = d[rows]
    R = 0.5 * d.pow(2).mean()
    return list(torch.autograd.grad(R, list(model.parameters()), allow_unused=True))


def mismatch_value(model: GPT, final: GPT, x: torch.Tensor, k: int, i: int, w: torch.Tensor) -> float:
    with torch.no_grad():
        d = model(x, return_residuals=True)[1][k][:, i] @ w - final(x, return_residuals=True)[1][k][:, i] @ w
    return float(0.5 * d.pow(2).mean())


def dot(a, b) -> float:
    return float(sum((x * y).sum() for x, y in zip(a, b) if x is not None and y is not None))


def close(got: float, want: float, scale: float, rtol: float = 1e-7) -> bool:
    return abs(got - want) <= rtol * max(abs(want), 1e-6 * scale)


# ----------------------------------------------------------------------------------------------------
# replay exactness and the influences against brute force


def test_replay_checks_losses_and_every_checkpoint(maj, tmp_path):
    res = attribute_run(maj, sites=SITES, features=[FEATURE], segment=(0, 4), out=tmp_path / "a")
    c = res.info["checks"]
    assert c["losses_checked"] == 4 and c["checkpoints_verified"] == [1, 2, 3, 4]
    assert c["adam_sum_max_rel_err"] < 1e-12  # Σ_c Δ_c = real Adam update (float64)
    # a tampered checkpoint or loss log is detected
    bad = tmp_path / "bad"
    shutil.copytree(maj, bad)
    ck = bad / "checkpoints" / "step-000002.safetensors"
    arrays, meta = load_tensors(ck)
    key = next(k for k in arrays if k.startswith("model.blocks"))
    arrays[key] = arrays[key] + 1e-12
    save_tensors(ck, arrays, kind=meta["kind"], metadata={k: v for k, v in meta.items() if k not in ("kind",)})
    with pytest.raises(NumericalError, match="checkpoint step 2"):
        attribute_run(bad, sites=SITES, features=[FEATURE], segment=(0, 3), out=tmp_path / "b", optimizer="sgd")
    shutil.rmtree(bad)
    shutil.copytree(maj, bad)
    lines = (bad / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(s) for s in lines]
    for r in recs:
        if r.get("event") == "train" and r["step"] == 3:
            r["last_loss"] += 1e-9
    (bad / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(NumericalError, match="logged loss"):
        attribute_run(
            bad, sites=SITES, features=[FEATURE], segment=(0, 3), out=tmp_path / "c", optimizer="sgd", verify="none"
        )


def test_adam_and_sgd_influences_equal_bruteforce(maj, tmp_path):
    cfg = json.loads((maj / "config.json").read_text())
    adam = attribute_run(
        maj, sites=SITES, features=[FEATURE], segment=(0, 3), out=tmp_path / "adam", check_identity=True, half=True
    ).table
    sgd = attribute_run(
        maj, sites=SITES, features=[FEATURE], segment=(0, 3), out=tmp_path / "sgd", optimizer="sgd", half=False
    ).table
    final = GPT.load(maj / "model.safetensors")
    probes = ProbeSet.load(maj / "probes.safetensors")
    lr, (b1, b2), eps = cfg["lr"], cfg["betas"], cfg["eps"]
    m = {s: {c: None for c in ("direct", "precached", "shared")} for s in SITES}
    v = None
    for s in (1, 2, 3):
        model = params_at(maj, s - 1)
        x = majority_batch(cfg["seed"], s - 1, cfg["batch_size"])
        comps = {site: brute_components(model, x, *site) for site in SITES}
        g2 = [t * t for t in comps[SITES[0]]["full"]]  # ∇L is the same at every site
        v = [(1 - b2) * c for c in g2] if s == 1 else [b2 * a + (1 - b2) * c for a, c in zip(v, g2)]
        for k, i in SITES:
            G = comps[(k, i)]
            w = torch.from_numpy(probes.direction(k, i, FEATURE))
            gR = grad_R(model, final, x, k, i, w)
            denom = [(a / (1 - b2**s)).sqrt() + eps for a in v]
            total = 0.0
            for c in ("direct", "precached", "shared"):
                prev = m[(k, i)][c]
                m[(k, i)][c] = [
                    (1 - b1) * g if prev is None else b1 * p + (1 - b1) * g
                    for p, g in zip(prev or [None] * len(G[c]), G[c])
                ]
                delta = [lr * (mc / (1 - b1**s)) / dn for mc, dn in zip(m[(k, i)][c], denom)]
                want = dot(delta, gR)
                total += want
                (row,) = rows_of(adam, step=s, site_layer=k, site_position=i, type=None, component=c)
                assert close(row["influence"], want, scale=1e-3), (s, k, i, c, row["influence"], want)
                # SGD variant with the reference code's factor (no ½): 2× the ½-convention value
                (row,) = rows_of(sgd, step=s, site_layer=k, site_position=i, type=None, component=c)
                assert close(row["influence"], 2.0 * lr * dot(G[c], gR), scale=1e-6), (s, k, i, c)
            (row,) = rows_of(adam, step=s, site_layer=k, site_position=i, type=None, component="full")
            assert close(row["influence"], total, scale=1e-3)
            # the real step θ_{s−1} − θ_s is what the components sum to
            step = [a.detach() - b.detach() for a, b in zip(model.parameters(), params_at(maj, s).parameters())]
            assert close(row["influence"], dot(step, gR), scale=1e-3, rtol=1e-6)
            # mismatch columns: R(θ_{s−1}) and R(θ_{s−1} − Σ_c Δ_c) = R(θ_s) on the same batch (the two-run protocol's check)
            assert close(row["mismatch"], mismatch_value(model, final, x, k, i, w), scale=1e-12, rtol=1e-9)
            assert close(
                row["mismatch_after"], mismatch_value(params_at(maj, s), final, x, k, i, w), scale=1e-12, rtol=1e-6
            )
    # G_pre(L, i) = 0: the site at k = L has no pre-caching influence
    assert all(r["influence"] == 0.0 for r in rows_of(adam, site_layer=2, component="precached"))


def test_othello_per_type_influences_equal_explicit_gradients(oth, tmp_path):
    from originlens.tasks.othello import replay, tokens_to_moves

    cfg = json.loads((oth / "config.json").read_text())
    feats = ["c3", "d4", "e5", "f6"]
    res = attribute_run(oth, sites=[(1, 8)], features=feats, out=tmp_path / "a", half=True)
    from originlens.train.ntp import othello_pool

    pool = othello_pool(cfg["othello_pool"], cfg["seed"])  # the whole pool the batches index
    final = GPT.load(oth / "model.safetensors")
    probes = ProbeSet.load(oth / "probes.safetensors")
    n_checked = 0
    for s in (1, 2):
        idx = np.sort(np.random.default_rng([cfg["seed"], 7, s - 1]).integers(0, len(pool), cfg["batch_size"]))
        x = torch.from_numpy(pool[idx].astype(np.int64))
        types = replay(tokens_to_moves(x[:, 1:].numpy())).feature_types[:, 7]  # position 8 = move 7
        before, after = params_at(oth, s - 1), params_at(oth, s)
        step = [a.detach() - b.detach() for a, b in zip(before.parameters(), after.parameters())]
        for f in feats:
            col = types[:, probes.feature_names.index(f)]
            w = torch.from_numpy(probes.direction(1, 8, f))
            stored = {r["type"]: r for r in rows_of(res.table, step=s, feature=f, component="full")}
            assert set(stored) == {None, *map(int, np.unique(col))}
            for tau, r in stored.items():
                rows = None if tau is None else torch.from_numpy(col == tau)
                want = dot(step, grad_R(before, final, x, 1, 8, w, rows))
                assert r["n_rows"] == (len(col) if tau is None else int((col == tau).sum()))
                assert close(r["influence"], want, scale=1e-4, rtol=1e-6), (s, f, tau)
                n_checked += 1
    assert n_checked >= 8


# ----------------------------------------------------------------------------------------------------
# segments


def _sorted(table: pa.Table) -> list[tuple]:
    return sorted(
        (
            r["step"],
            r["site_layer"],
            r["site_position"],
            r["feature"],
            -1 if r["type"] is None else r["type"],
            r["component"],
            r["influence"],
            r["mismatch"],
        )
        for r in table.to_pylist()
    )


def test_two_segments_equal_one_pass_and_adam_needs_moments(maj, tmp_path):
    kw = dict(sites=SITES, features="all")
    one = attribute_run(maj, segment=(0, 4), out=tmp_path / "one", **kw)
    attribute_run(maj, segment=(0, 2), out=tmp_path / "two", **kw)
    attribute_run(maj, segment=(2, 4), out=tmp_path / "two", **kw)
    assert _sorted(ostore.load_observables(tmp_path / "two")) == _sorted(one.table)
    # Adam: the second segment alone needs the persisted component moments ...
    with pytest.raises(ConfigError, match="moments"):
        attribute_run(maj, segment=(2, 4), out=tmp_path / "alone", **kw)
    # ... or recomputes them (warm) from update 1
    warm = attribute_run(maj, segment=(2, 4), out=tmp_path / "alone", warm=True, **kw)
    assert _sorted(warm.table) == [r for r in _sorted(one.table) if r[0] > 2]
    # SGD segments are independent, also when the checkpoint at their start is missing (replay from step 1)
    sgd_one = attribute_run(maj, segment=(0, 4), out=tmp_path / "sgd", optimizer="sgd", **kw)
    gap = tmp_path / "gap"
    shutil.copytree(maj, gap)
    (gap / "checkpoints" / "step-000002.safetensors").unlink()
    sgd_seg = attribute_run(gap, segment=(2, 4), out=tmp_path / "sgd2", optimizer="sgd", **kw)
    assert sgd_seg.info["replay_from_checkpoint"] == 1
    assert _sorted(sgd_seg.table) == [r for r in _sorted(sgd_one.table) if r[0] > 2]
    # settings must agree within a store; overlapping segments are refused
    with pytest.raises(CompatibilityError, match="other settings"):
        attribute_run(maj, segment=(4 - 1, 4), out=tmp_path / "two", sites=[(1, 3)], features="all")
    with pytest.raises(CompatibilityError, match="overlaps"):
        attribute_run(maj, segment=(1, 3), out=tmp_path / "sgd", optimizer="sgd", **kw)


def test_a_carried_segment_equals_the_contiguous_replay_with_its_carried_part(tmp_path):
    """A segment started at a checkpoint with carry=True (no earlier moments) records, at every update,
    direct + pre-cached + shared + carried influences whose sum ("full") equals the contiguous replay's
    full influence; each of its components falls short of the contiguous one by what the carried moment
    holds, so the summed shortfall over the three is the carried influence; the carried share decays."""
    run = _train(tmp_path / "run", steps=12, checkpoint_every=4)
    kw = dict(sites=SITES, features="all", types=False)
    whole = attribute_run(run, segment=(0, 12), out=tmp_path / "whole", **kw)
    part = attribute_run(run, segment=(4, 12), out=tmp_path / "part", carry=True, steps=range(7, 13), **kw)
    assert part.info["carry"] and part.info["replay_from_checkpoint"] == 4
    share = part.info["checks"]["carried_share"]
    assert 0 < share["last_recorded"] < share["first_recorded"] < 1
    assert part.info["checks"]["adam_sum_max_rel_err"] < 1e-12

    def by(table):
        return {
            (r["step"], r["site_layer"], r["site_position"], r["feature"], r["component"]): r["influence"]
            for r in table.to_pylist()
            if r["type"] is None
        }

    a, b = by(whole.table), by(part.table)
    keys = {k[:4] for k in b}
    assert {k[0] for k in keys} == set(range(7, 13))
    for k in keys:
        scale = max(abs(a[(*k, c)]) for c in ("direct", "precached", "shared", "full")) + 1e-300
        assert abs(b[(*k, "full")] - a[(*k, "full")]) <= 1e-9 * scale
        short = sum(a[(*k, c)] - b[(*k, c)] for c in ("direct", "precached", "shared"))
        assert abs(short - b[(*k, "carried")]) <= 1e-9 * scale
    with pytest.raises(ConfigError, match="Adam"):
        attribute_run(run, segment=(4, 8), out=tmp_path / "sgd", carry=True, optimizer="sgd", **kw)


# ----------------------------------------------------------------------------------------------------
# store


def _synthetic(steps, rng, null_every=7) -> pa.Table:
    cols = {f.name: [] for f in ostore.SCHEMA}
    j = 0
    for s in steps:
        for k, i in ((1, 2), (2, 5)):
            for f in ("a", "b"):
                for ty in (None, 1, 2):
                    for c in ostore.COMPONENT_ORDER:
                        j += 1
                        cols["step"].append(s)
                        cols["site_layer"].append(k)
                        cols["site_position"].append(i)
                        cols["feature"].append(f)
                        cols["type"].append(ty)
                        cols["component"].append(c)
                        cols["influence"].append(None if j % null_every == 0 else float(rng.normal()))
                        cols["mismatch"].append(float(rng.random()))
                        cols["n_rows"].append(4)
                        cols["optimizer"].append("adam")
                        cols["half"].append(True)
    return ostore.observables_table(cols)


def test_store_roundtrip_integrate_and_intervals(tmp_path):
    from scipy import stats

    rng = np.random.default_rng(0)
    t1, t2 = _synthetic(range(1, 4), rng), _synthetic(range(4, 6), rng)
    info = {
        "run_config": {"x": 1},
        "sites": [[1, 2], [2, 5]],
        "features": ["a", "b"],
        "optimizer": "adam",
        "types": True,
        "half": True,
    }
    ostore.write_segment(tmp_path, t2, start=3, end=5, info=info)
    ostore.write_segment(tmp_path, t1, start=0, end=3, info=info)
    loaded = ostore.load_observables(tmp_path)
    assert loaded.equals(pa.concat_tables([t1, t2]))
    assert [i["start"] for i in ostore.read_segment_infos(tmp_path)] == [0, 3]
    with pytest.raises(CompatibilityError, match="overlaps"):
        ostore.write_segment(tmp_path, t1, start=2, end=4, info=info)
    with pytest.raises(CompatibilityError, match="other settings"):
        ostore.write_segment(tmp_path, t2, start=5, end=7, info={**info, "half": False})
    ostore.write_segment(tmp_path / "y", t1, start=0, end=3, info=info)
    ostore.write_segment(tmp_path / "z", t2, start=3, end=5, info={**info, "half": False})
    shutil.copy(ostore.segment_path(tmp_path / "z", 3, 5), tmp_path / "y")
    with pytest.raises(CompatibilityError, match="other settings"):
        ostore.load_observables(tmp_path / "y")
    # integration = Σ over steps, nulls skipped (brute force over the rows)
    integ = ostore.integrate(loaded)
    want: dict[tuple, list] = {}
    for r in loaded.to_pylist():
        key = (r["site_layer"], r["site_position"], r["feature"], r["type"], r["component"])
        want.setdefault(key, [])
        if r["influence"] is not None:
            want[key].append(r["influence"])
    got = {(r["site_layer"], r["site_position"], r["feature"], r["type"], r["component"]): r for r in integ.to_pylist()}
    assert set(got) == set(want)
    for key, vals in want.items():
        assert got[key]["n_steps"] == len(vals)
        assert (
            (got[key]["integrated"] is None)
            if not vals
            else math.isclose(got[key]["integrated"], sum(vals), rel_tol=1e-12, abs_tol=1e-12)
        )
    # per-(type, component) t-interval over the 4 items (2 sites × 2 features), written out here
    summ = {(s.group["type"], s.group["component"]): s for s in ostore.summarize(integ)}
    for (ty, comp), s in summ.items():
        x = np.array(
            [got[k]["integrated"] for k in got if k[3] == ty and k[4] == comp and got[k]["integrated"] is not None]
        )
        half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
        assert s.n_items == len(x) and math.isclose(s.mean, x.mean(), rel_tol=1e-12)
        assert math.isclose(s.lo, x.mean() - half, rel_tol=1e-9) and math.isclose(s.hi, x.mean() + half, rel_tol=1e-9)
    boot = ostore.summarize(integ, ci="bootstrap", n_boot=2000)
    for s in boot:
        x = [
            got[k]["integrated"]
            for k in got
            if k[3] == s.group["type"] and k[4] == s.group["component"] and got[k]["integrated"] is not None
        ]
        assert min(x) <= s.lo <= s.mean <= s.hi <= max(x)
    with pytest.raises(ConfigError):
        ostore.summarize(integ, ci="wald")


def test_sign_pattern_reads_the_paper_table():
    def mk(comp, ty, mean, lo, hi):
        return ostore.Summary({"type": ty, "component": comp}, mean, lo, hi, 10, 1.0, "t", 0.95)

    # the paper's Othello bar midpoints / CIs (arXiv 2603.14087)
    summ = [
        mk("direct", 2, 7.61, 2.85, 12.38),
        mk("direct", 1, -0.97, -4.69, 2.74),
        mk("precached", 2, -0.66, -1.99, 0.66),
        mk("precached", 1, 1.80, 0.55, 3.05),
        mk("shared", 2, 8.64, 4.80, 12.48),
        mk("shared", 1, 6.42, 2.93, 9.91),
    ]
    pat = ostore.sign_pattern(summ)
    assert len(pat) == 5 and all(p["holds"] for p in pat)
    assert [p["significant"] for p in pat] == [True, False, True, True, True]
    summ[1] = mk("direct", 1, 1.0, 0.5, 1.5)
    assert not ostore.sign_pattern(summ)[1]["holds"]


# ----------------------------------------------------------------------------------------------------
# CLI and errors


def test_cli_attribute_and_report(maj, tmp_path, capsys):
    out = tmp_path / "store"
    assert (
        cli_main(
            [
                "ntp",
                "attribute",
                str(maj),
                "--layers",
                "1-2",
                "--positions",
                "3,10",
                "--features",
                "all",
                "--segment",
                "0:2",
                "--out",
                str(out),
                "--threads",
                "1",
            ]
        )
        == 0
    )
    assert "2 updates" in capsys.readouterr().out
    assert (
        cli_main(
            [
                "ntp",
                "attribute",
                str(maj),
                "--sites",
                "1:3,1:10,2:3,2:10",
                "--features",
                "all",
                "--segment",
                "2:4",
                "--out",
                str(out),
                "--report",
            ]
        )
        == 0
    )
    html = (out / "report.html").read_text()
    assert "no ½" in html and "toward its final value" in html and "pre-cached" in html
    assert "<img" in html and "NTP-useful" in html
    assert "Sign pattern" not in html  # the Othello pattern is not checked on Majority
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sign_pattern"] == []
    assert {s["component"] for s in summary["summaries"]} == set(ostore.COMPONENT_ORDER)
    meta = json.loads((out / "meta.json").read_text())
    assert [s["file"] for s in meta["segments"]] == ["segment-000000-000002.parquet", "segment-000002-000004.parquet"]
    assert cli_main(["ntp", "attribute", str(maj)]) == 2  # nothing to do
    assert cli_main(["ntp", "attribute", str(maj), "--sites", "1:3", "--features", "nope", "--out", str(out)]) == 2
    assert "unknown feature" in capsys.readouterr().err


def test_report_shows_no_interval_over_fewer_than_three_items(maj, tmp_path):
    out = tmp_path / "store"
    assert (
        cli_main(
            [
                "-q",
                "ntp",
                "attribute",
                str(maj),
                "--sites",
                "1:3,1:10",
                "--features",
                FEATURE,
                "--segment",
                "0:2",
                "--out",
                str(out),
                "--report",
            ]
        )
        == 0
    )
    html = (out / "report.html").read_text()
    summary = json.loads((out / "summary.json").read_text())
    few = [s for s in summary["summaries"] if s["n_items"] < 3]
    assert few, "the test needs groups of fewer than 3 items"
    assert f"— (n = {few[0]['n_items']} &lt; 3)" in html or f"— (n = {few[0]['n_items']} < 3)" in html
    assert "rest on fewer than 3 items" in html and "[nan, nan]" not in html


def test_clear_errors(maj, tmp_path):
    kw = dict(sites=SITES, features=[FEATURE], out=tmp_path / "o")
    with pytest.raises(InputError, match="not found"):
        attribute_run(tmp_path / "missing", **kw)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no config.json"):
        attribute_run(tmp_path / "empty", **kw)
    other = tmp_path / "assoc"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"vocab_size": 10, "n_steps": 3}))
    with pytest.raises(CompatibilityError, match="next-token-prediction"):
        attribute_run(other, **kw)
    lang = tmp_path / "lang"
    lang.mkdir()
    (lang / "config.json").write_text(json.dumps(NTPConfig(task="language", corpus="x.npy").to_dict()))
    with pytest.raises(ConfigError, match="language"):
        attribute_run(lang, **kw)
    dropped = tmp_path / "dropout"
    shutil.copytree(maj, dropped)
    raw = json.loads((dropped / "config.json").read_text())
    (dropped / "config.json").write_text(json.dumps({**raw, "model": {**raw.get("model", {}), "dropout": 0.1}}))
    with pytest.raises(ConfigError, match="dropout"):
        attribute_run(dropped, **kw)
    unfinished = tmp_path / "unfinished"
    shutil.copytree(maj, unfinished)
    (unfinished / "model.safetensors").unlink()
    with pytest.raises(InputError, match="unfinished"):
        attribute_run(unfinished, **kw)
    nock = tmp_path / "nock"
    shutil.copytree(maj, nock)
    shutil.rmtree(nock / "checkpoints")
    with pytest.raises(InputError, match="checkpoints"):
        attribute_run(nock, **kw)
    with pytest.raises(ConfigError, match="unknown feature"):
        attribute_run(maj, sites=SITES, features=["is_majority_<7>"], out=tmp_path / "o")
    with pytest.raises(InputError, match="no probe"):
        attribute_run(maj, sites=[(1, 0)], features=[FEATURE], out=tmp_path / "o")
    with pytest.raises(ConfigError, match="segment"):
        attribute_run(maj, segment=(3, 9), **kw)
    with pytest.raises(ConfigError, match="optimizer"):
        attribute_run(maj, optimizer="rmsprop", **kw)
    with pytest.raises(ConfigError, match="outside the segment"):
        attribute_run(maj, segment=(0, 2), steps=[3], optimizer="sgd", **kw)


def test_random_direction_null_is_attributed_beside_the_probe(maj, tmp_path):
    """Random directions of the probe's norm: their influences equal lr·⟨G_c, ∇R_u⟩ (SGD, no ½) by brute
    force, and adding them leaves the real probe's rows unchanged."""
    from originlens.attribution.run import RunReplay

    cfg = json.loads((maj / "config.json").read_text())
    plain = attribute_run(
        maj, sites=SITES, features=[FEATURE], segment=(0, 2), out=tmp_path / "p", optimizer="sgd"
    ).table
    null = attribute_run(
        maj, sites=SITES, features=[FEATURE], segment=(0, 2), out=tmp_path / "n", optimizer="sgd", random_directions=2
    ).table
    names = {r["feature"] for r in null.to_pylist()}
    assert names == {FEATURE, f"{FEATURE}~random0", f"{FEATURE}~random1"}
    key = ("step", "site_layer", "site_position", "type", "component")
    real = {tuple(r[k] for k in key): r["influence"] for r in null.to_pylist() if r["feature"] == FEATURE}
    alone = {tuple(r[k] for k in key): r["influence"] for r in plain.to_pylist()}
    assert set(real) == set(alone)
    # the same values; more probes in one batched product change only the summation order (float64 run,
    # reductions over the batch and d_model, relative to the largest value)
    scale = max(abs(v) for v in alone.values() if v is not None)
    tol = reduction_rtol("float64", 8 * 8) * scale
    assert all((real[k] is None) == (alone[k] is None) for k in alone)
    assert all(abs(real[k] - alone[k]) <= tol for k in alone if alone[k] is not None)
    probes, feature_of, base_of = RunReplay(maj).make_probes(SITES, [FEATURE], random_directions=2)
    by = {p.name: p for p in probes}
    final = GPT.load(maj / "model.safetensors")
    for k, i in SITES:
        w = by[f"L{k}.P{i}.{FEATURE}"].direction
        u = by[f"L{k}.P{i}.{FEATURE}~random1"].direction
        assert math.isclose(float(u.norm()), float(w.norm()), rel_tol=1e-12) and abs(float(u @ w)) < 0.9 * float(w @ w)
        assert base_of[f"L{k}.P{i}.{FEATURE}~random1"] == FEATURE
        for s in (1, 2):
            model = params_at(maj, s - 1)
            x = majority_batch(cfg["seed"], s - 1, cfg["batch_size"])
            G = brute_components(model, x, k, i)
            gR = grad_R(model, final, x, k, i, u)
            for c in ("direct", "precached", "shared"):
                (row,) = rows_of(
                    null, step=s, site_layer=k, site_position=i, type=None, component=c, feature=f"{FEATURE}~random1"
                )
                assert close(row["influence"], 2.0 * cfg["lr"] * dot(G[c], gR), scale=1e-6), (s, k, i, c)
    with pytest.raises(ConfigError, match="random_directions"):
        attribute_run(maj, sites=SITES, features=[FEATURE], out=tmp_path / "bad", random_directions=-1)
    with pytest.raises(CompatibilityError, match="random_directions"):
        attribute_run(maj, sites=SITES, features=[FEATURE], segment=(2, 4), out=tmp_path / "n", optimizer="sgd")


def test_a_learning_rate_cool_down_is_trained_and_replayed_exactly(tmp_path, monkeypatch):
    """lr_decay = [1, 4] changes the steps the trainer takes (updates 1–2 at the full rate, equal to the
    constant run; update 3 at 2/3 of it),
    and the replay takes the same steps: every checkpoint verified bit-exactly and the Adam components
    still sum to the real update; a replay that ignored the schedule would fail its checkpoint check."""
    decay = _train(tmp_path / "decay", lr=0.01, lr_decay=[1, 4])
    const = _train(tmp_path / "const", lr=0.01)

    def weights(run, step):
        arrays, _ = load_tensors(run / "checkpoints" / f"step-{step:06d}.safetensors")
        return {k: v for k, v in arrays.items() if k.startswith("model.")}

    a2, b2 = weights(decay, 2), weights(const, 2)
    assert a2 and all(np.array_equal(a2[k], b2[k]) for k in a2)
    a3, b3 = weights(decay, 3), weights(const, 3)
    assert any(not np.array_equal(a3[k], b3[k]) for k in a3)
    res = attribute_run(decay, sites=SITES, features=[FEATURE], segment=(0, 4), out=tmp_path / "a")
    c = res.info["checks"]
    assert c["checkpoints_verified"] == [1, 2, 3, 4] and c["adam_sum_max_rel_err"] < 1e-12
    monkeypatch.setattr(NTPConfig, "lr_at", lambda self, s: float(self.lr))
    with pytest.raises(NumericalError, match="checkpoint step 3"):
        attribute_run(decay, sites=SITES, features=[FEATURE], segment=(0, 4), out=tmp_path / "b", optimizer="sgd")


def test_replay_refuses_othello_games_other_than_those_trained_on(oth, tmp_path):
    # the fixture draws 12 of its 30 games: they are regenerated in memory and checked against their hash
    import shutil

    run = tmp_path / "run"
    shutil.copytree(oth, run)
    env = json.loads((run / "environment.json").read_text())
    assert env["data_hashes"]["othello_pool_drawn_updates"] == "2" and not (run / "data" / "othello-pool.npy").exists()
    env["data_hashes"]["othello_pool_drawn_sha256"] = "0" * 64
    (run / "environment.json").write_text(json.dumps(env))
    with pytest.raises(CompatibilityError, match="regenerated .* differ from those it was trained on"):
        attribute_run(run, sites=[(1, 8)], features=["c3"], out=tmp_path / "a")
