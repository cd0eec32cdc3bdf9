"""Hand-written forward-mode JVPs (jvp.grouped_jvps) against torch.func's, in float64."""

from __future__ import annotations

import pytest
import torch

from originlens.attribution import Probe, influences, reference_projections, site_jvp
from originlens.attribution.jvp import grouped_jvps, manual_supported
from originlens.errors import ConfigError
from originlens.models import GPT, GPTConfig

V, T, L, B = 7, 9, 3, 5


def make(seed: int = 0, **kw) -> GPT:
    base = dict(vocab_size=V, seq_len=T, n_layer=L, d_model=8, n_head=2, dtype="float64")
    base.update(kw)
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**base))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def tangents(model: GPT, n: int, seed: int, skip: str | None = None) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        {k: torch.randn(p.shape, generator=g, dtype=p.dtype) for k, p in model.named_parameters() if k != skip}
        for _ in range(n)
    ]


def test_grouped_jvps_match_torch_func():
    model = make()
    x = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))
    sites = [(0, 3), (1, 3), (3, 3), (2, 5), (1, 8), (3, 8), (2, 0)]
    tans = {s: tangents(model, 1 + j % 3, seed=10 + j) for j, s in enumerate(sites)}
    got = grouped_jvps(model, x, tans)
    for s in sites:
        want = site_jvp(model, x, s, tans[s], jvp="forward")
        torch.testing.assert_close(got[s], want, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(site_jvp(model, x, s, tans[s], jvp="manual"), want, rtol=1e-12, atol=1e-13)


def test_grouped_jvps_frozen_parameters():
    """Frozen parameters carry no tangent (zero)."""
    x = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))
    for skip in ("embed.0.wpe.weight", "blocks.0.copies.0.attn_qkv.weight", "blocks.1.copies.0.ln_2.bias"):
        model = make(seed=2)
        dict(model.named_parameters())[skip].requires_grad_(False)
        tans = tangents(model, 2, seed=4, skip=skip)
        got = grouped_jvps(model, x, {(2, 6): tans})[(2, 6)]
        torch.testing.assert_close(got, site_jvp(model, x, (2, 6), tans, jvp="forward"), rtol=1e-12, atol=1e-13)


def test_influences_manual_equal_forward():
    model = make(seed=5)
    x = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(6))
    g = torch.Generator().manual_seed(7)
    probes = [
        Probe(f"p{j}", k, i, torch.randn(8, generator=g, dtype=torch.float64))
        for j, (k, i) in enumerate([(1, 4), (1, 4), (3, 4), (2, 7)])
    ]
    refs = reference_projections(make(seed=8), x, probes)
    steps = {p.site: dict(zip(("direct", "precached", "shared"), tangents(model, 3, seed=9))) for p in probes}
    types = {p.name: torch.randint(0, 3, (B,), generator=g) for p in probes}
    a = influences(model, x, steps, probes, refs, types=types, type_values=[0, 1, 2, 3])
    b = influences(model, x, steps, probes, refs, types=types, type_values=[0, 1, 2, 3], jvp="forward")
    assert [(r.probe, r.feature_type, r.component, r.n_rows) for r in a] == [
        (r.probe, r.feature_type, r.component, r.n_rows) for r in b
    ]
    for ra, rb in zip(a, b):
        if rb.value is None:
            assert ra.value is None and ra.risk is None
            continue
        assert ra.value == pytest.approx(rb.value, rel=1e-11, abs=1e-14)
        assert ra.risk == pytest.approx(rb.risk, rel=1e-13)


def test_manual_not_for_untied_or_dropout():
    assert manual_supported(make())
    untied = make(regime="untied", untie_at=[4])
    assert not manual_supported(untied)
    with pytest.raises(ConfigError):
        site_jvp(untied, torch.zeros(1, T, dtype=torch.long), (1, 2), tangents(untied, 1, 0), jvp="manual")
    assert manual_supported(make(regime="myopic"))  # influences always use the non-myopic graph
    dropped = make(dropout=0.1).train()
    assert not manual_supported(dropped)
    assert manual_supported(dropped.eval())
