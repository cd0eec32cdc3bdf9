"""The batched paths against their straightforward definitions, and what they ask of the machine.

``influence_table`` (all probes of a site in one product, one transfer per call) against the influence
written out probe by probe and subset by subset; the flat ``AdamAttributor`` against Adam written out per
parameter tensor; the host reads and operator counts of both (``originlens.counting``)."""

from __future__ import annotations

import math

import pytest
import torch

from originlens.attribution import (
    COMPONENTS,
    AdamAttributor,
    Probe,
    decompose,
    influence_table,
    influences,
    reference_projections,
)
from originlens.attribution.jvp import site_jvp
from originlens.counting import count_dispatch
from originlens.errors import ConfigError, InputError, NumericalError
from originlens.models import GPT, GPTConfig

from tolerances import reduction_rtol

V, T, L, B, D = 7, 9, 3, 6, 8


def make(seed: int = 0, dtype: str = "float64") -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=V, seq_len=T, n_layer=L, d_model=D, n_head=2, dtype=dtype))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def toks(seed: int) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def setting(n_probes_per_site: int = 3, seed: int = 1):
    model = make(seed=seed)
    x = toks(seed + 1)
    g = torch.Generator().manual_seed(seed + 2)
    sites = [(1, 4), (3, 4), (2, 7)]
    probes = [
        Probe(f"s{k}.{i}.p{j}", k, i, torch.randn(D, generator=g, dtype=torch.float64))
        for (k, i) in sites
        for j in range(n_probes_per_site)
    ]
    refs = reference_projections(make(seed=seed + 3), x, probes)
    names = [n for n, _ in model.named_parameters()]
    steps = {
        s: {
            c: {n: torch.randn(p.shape, generator=g, dtype=p.dtype) for n, p in model.named_parameters()}
            for c in COMPONENTS
        }
        for s in sites
    }
    assert names
    return model, x, probes, refs, steps


def written_out(model, x, steps, probes, refs, types, type_values):
    """I_c = f·(2/n) Σ_rows (⟨w, r_b⟩ − ⟨w, r*_b⟩)·⟨w, (J Δ_c)_b⟩, probe by probe, subset by subset."""
    with torch.no_grad():
        _, res = model(x, return_residuals=True, myopic=False)
    out = {}
    for p in probes:
        jv = site_jvp(model, x, p.site, [steps[p.site][c] for c in COMPONENTS], jvp="forward")  # (C, B, d)
        diff = res[p.layer][:, p.position] @ p.direction - refs[p.name]
        subsets = [(None, torch.ones(B, dtype=torch.bool))]
        if p.name in types:
            vals = sorted(set(types[p.name].tolist())) if type_values is None else type_values
            subsets += [(tau, types[p.name] == tau) for tau in vals]
        for tau, rows in subsets:
            n = int(rows.sum())
            for j, c in enumerate(COMPONENTS):
                v = None if n == 0 else 2.0 / n * float((diff[rows] * (jv[j][rows] @ p.direction)).sum().detach())
                out[(p.name, tau, c)] = (v, None if n == 0 else float(diff[rows].pow(2).mean()), n)
    return out


@pytest.mark.parametrize("explicit", [False, True])
def test_the_table_equals_the_influence_written_out(explicit):
    model, x, probes, refs, steps = setting()
    g = torch.Generator().manual_seed(5)
    # types for all probes but the last (it gets the all-rows subset only); type 3 is absent everywhere
    types = {p.name: torch.randint(0, 3, (B,), generator=g) for p in probes[:-1]}
    type_values = [0, 1, 2, 3] if explicit else None
    table = influence_table(model, x, steps, probes, refs, types=types, type_values=type_values)
    want = written_out(model, x, steps, probes, refs, types, type_values)
    got = {(r.probe, r.feature_type, r.component): r for r in table.influences()}
    assert set(got) == set(want) | {(p, t, "full") for (p, t, _) in want}
    tol = reduction_rtol("float64", B * D)
    for key, (v, risk, n) in want.items():
        r = got[key]
        assert r.n_rows == n
        if v is None:
            assert r.value is None and r.risk is None
            continue
        scale = max(abs(w) for (w, _, _) in want.values() if w is not None)
        assert abs(r.value - v) <= tol * scale
        assert r.risk == pytest.approx(risk, rel=tol)
    for (p, t, c), r in got.items():  # full = Σ_c I_c
        if c == "full" and r.value is not None:
            assert r.value == pytest.approx(sum(got[(p, t, k)].value for k in COMPONENTS), rel=1e-12, abs=1e-15)
    # influences() gives the same rows as objects
    assert influences(model, x, steps, probes, refs, types=types, type_values=type_values) == table.influences()


def test_the_table_reads_the_host_once_per_call_and_its_operators_do_not_grow_with_the_probes():
    model, x, probes, refs, steps = setting(n_probes_per_site=4)
    g = torch.Generator().manual_seed(6)
    types = {p.name: torch.randint(0, 3, (B,), generator=g) for p in probes}
    _, _, more, more_refs, _ = setting(n_probes_per_site=8)
    more_types = {p.name: torch.randint(0, 3, (B,), generator=g) for p in more}
    with model.trusted_tokens():  # the model's own token-range check is a host read of its own
        with count_dispatch() as explicit:
            influence_table(model, x, steps, probes, refs, types=types, type_values=[0, 1, 2])
        with count_dispatch() as found:
            influence_table(model, x, steps, probes, refs, types=types)
        with count_dispatch() as doubled:
            influence_table(model, x, steps, more, more_refs, types=more_types, type_values=[0, 1, 2])
    assert explicit.n_host_reads == 1  # the results, all sites at once
    assert found.n_host_reads == 2  # + the types present
    # doubling the probes per site adds only the stacking of their directions, references and types
    assert doubled.n_ops < 1.15 * explicit.n_ops, (doubled.n_ops, explicit.n_ops)


def test_table_refusals():
    model, x, probes, refs, steps = setting()
    with pytest.raises(InputError, match="types"):
        influence_table(model, x, steps, probes, refs, types={probes[0].name: torch.zeros(B + 1, dtype=torch.long)})
    with pytest.raises(ConfigError, match="no component steps"):
        influence_table(model, x, {}, probes, refs)
    with pytest.raises(InputError, match="reference"):
        influence_table(model, x, steps, probes, {})


# ----------------------------------------------------------------------------------------------------
# the flat Adam attributor


def adam_written_out(model, opt_kw, batches, sites):
    """Per-component Adam per parameter tensor: m_c ← β1 m_c + (1 − β1) G_c, Δ_c = lr m̂_c / (√v̂ + ε)."""
    lr, (b1, b2), eps = opt_kw["lr"], opt_kw["betas"], opt_kw["eps"]
    opt = torch.optim.Adam(model.parameters(), **opt_kw)
    names = [n for n, _ in model.named_parameters()]
    m = {s: {c: {n: 0.0 for n in names} for c in COMPONENTS} for s in sites}
    v = {n: 0.0 for n in names}
    out = []
    for tau, x in enumerate(batches, start=1):
        dec = decompose(model, x, sites)
        g = dec[sites[0]].full
        for n, p in model.named_parameters():
            p.grad = g[n].clone()
            v[n] = b2 * v[n] + (1 - b2) * g[n].double() ** 2
        opt.step()
        steps = {}
        for s in sites:
            steps[s] = {}
            for c in COMPONENTS:
                for n in names:
                    m[s][c][n] = b1 * m[s][c][n] + (1 - b1) * getattr(dec[s], c)[n].double()
                steps[s][c] = {
                    n: lr * (m[s][c][n] / (1 - b1**tau)) / (torch.sqrt(v[n] / (1 - b2**tau)) + eps) for n in names
                }
        out.append(steps)
    return out


def test_the_flat_attributor_equals_adam_written_out_per_tensor_and_reads_the_host_once():
    opt_kw = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8)
    sites = [(1, 2), (2, 5), (3, 8)]
    batches = [toks(40 + j) for j in range(4)]
    want = adam_written_out(make(seed=3), opt_kw, batches, sites)
    model = make(seed=3)
    opt = torch.optim.Adam(model.parameters(), **opt_kw)
    att = AdamAttributor(opt, model)
    n_tensors = len(list(model.parameters()))
    for tau, x in enumerate(batches):
        dec = decompose(model, x, sites)
        for n, p in model.named_parameters():
            p.grad = dec[sites[0]].full[n].clone()
        opt.step()  # torch's own Adam (per tensor, one step-count read each), outside the count
        with count_dispatch() as counts:
            got = att.attribute(dec)
        # the step count (a CPU scalar, not a device read, unless Adam is capturable or fused) and the Σ_c
        # check of every site, read once
        assert counts.host_reads == {"int": n_tensors, "tolist": 1}
        # a handful of operators per site and component, not per parameter tensor: flattening the
        # components (one view per tensor) is the only part that grows with the number of tensors
        assert counts.n_ops - counts.ops["view"] - counts.ops["detach"] < 4 * n_tensors + 40 * len(sites)
        for s in sites:
            for c in COMPONENTS:
                for n, t in got[s][c].items():
                    torch.testing.assert_close(t, want[tau][s][c][n], rtol=1e-12, atol=1e-18)
        assert att.last_check < 1e-12


def test_check_every_k_reads_the_host_at_every_kth_update_and_still_catches_a_wrong_gradient():
    opt_kw = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8)
    sites = [(1, 2), (2, 5)]
    model = make(seed=4)
    opt = torch.optim.Adam(model.parameters(), **opt_kw)
    att = AdamAttributor(opt, model, check_every=3)
    reads = []
    for j in range(6):
        dec = decompose(model, toks(60 + j), sites)
        with count_dispatch() as counts:
            att.step(dec)
        reads.append(counts.host_reads["tolist"])  # (the rest: step counts of torch's Adam and ours)
    assert reads == [0, 0, 1, 0, 0, 1]
    # a gradient that is not the decomposition's ∇L breaks Σ_c Δ_c = real update: updates 7 and 8 are not
    # checked, update 9 is
    dec = decompose(model, toks(70), sites)
    for tau in (7, 8, 9):
        opt.zero_grad()
        model.loss(toks(71)).backward()
        opt.step()
        if tau < 9:
            att.attribute(dec)
    with pytest.raises(NumericalError, match="differs from the real Adam update"):
        att.attribute(dec)
    with pytest.raises(ConfigError, match="check_every"):
        AdamAttributor(torch.optim.Adam(model.parameters()), model, check_every=-1, carry=True)


def test_carried_share_is_read_only_when_asked():
    opt_kw = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8)
    sites = [(2, 5)]
    model = make(seed=5)
    opt = torch.optim.Adam(model.parameters(), **opt_kw)
    for j in range(3):
        opt.zero_grad()
        model.loss(toks(80 + j)).backward()
        opt.step()
    att = AdamAttributor(opt, model, carry=True, check=False)
    dec = decompose(model, toks(90), sites)
    with count_dispatch() as counts:
        att.step(dec)
    assert counts.host_reads["tolist"] == counts.host_reads["float"] == 0  # only step counts are read
    share = att.carried_share
    assert share is not None and 0 < share < 1 and math.isfinite(share)


def test_blocks_change_nothing_but_the_cache_traffic():
    """The per-site update in blocks of 7 elements gives bit-identical Δ_c and moments (element-wise
    passes), and the same check to round-off; a block that is not a positive integer is refused."""
    opt_kw = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8)
    sites = [(1, 2), (3, 8)]
    a_model, b_model = make(seed=6), make(seed=6)
    a = AdamAttributor(torch.optim.Adam(a_model.parameters(), **opt_kw), a_model, block=7)
    b = AdamAttributor(torch.optim.Adam(b_model.parameters(), **opt_kw), b_model, block=10**9)
    for j in range(3):
        x = toks(100 + j)
        sa, sb = a.step(decompose(a_model, x, sites)), b.step(decompose(b_model, x, sites))
        for s in sites:
            for c in COMPONENTS:
                assert all(torch.equal(sa[s][c][n], sb[s][c][n]) for n in sa[s][c])
        assert a.last_check == pytest.approx(b.last_check, rel=1e-6, abs=1e-15)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ConfigError, match="block"):
            AdamAttributor(torch.optim.Adam(a_model.parameters()), a_model, block=bad, carry=True)
