"""Tests for originlens.attribution: stop-gradient, exact pathway decomposition, step attribution, influence.

References written here in float64 on a tiny pre-LN GPT (2 layers, d = 8, 2 heads, T = 6, B = 3):
per-position losses are recomputed with ``F.cross_entropy``, adjoints with ``autograd.grad`` on the
residuals, Adam moments with an explicit loop, ∇R with an explicit backward of the mismatch.  The
decomposition's fast path is checked against ``method="brute"`` (the stop-gradient definition of arXiv 2603.14087 Prop. 3.1; docs/concepts.md).
"""

from __future__ import annotations

import copy

import pytest
import torch

from originlens.attribution import (
    COMPONENTS,
    AdamAttributor,
    Probe,
    decompose,
    influences,
    pathway_adjoints,
    reference_projections,
    sgd_steps,
    site_jvp,
    stop_gradient,
    stop_gradient_hooks,
)
from originlens.errors import ConfigError, NumericalError
from originlens.models import GPT, GPTConfig

V, T, B, L = 7, 6, 3, 2
REGIMES = {
    "standard": dict(),
    "myopic": dict(regime="myopic"),
    "untied": dict(regime="untied", untie_at=[3]),
    "untied-everything": dict(regime="untied", untie_at=[2], untie_scope="everything"),
    "myopic+untied": dict(regime="myopic+untied", untie_at=[3]),
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny float64 models: one thread is ~100× faster than two contended ones on a shared CPU."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def make(seed: int = 0, **kw) -> GPT:
    base = dict(vocab_size=V, seq_len=T, n_layer=L, d_model=8, n_head=2, dtype="float64")
    base.update(kw)
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**base))
    with torch.no_grad():  # move away from the symmetric init so that every pathway is non-trivial
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def toks(seed: int = 1, b: int = B) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (b, T), generator=g)


def flat(d: dict) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in d.values()])


def position_ce(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """ℓ_{b,t} (B, T−1), the unweighted next-token cross-entropy, written out here."""
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    return -logp.gather(-1, tokens[:, 1:, None])[..., 0]


def grad_L(model: GPT, tokens: torch.Tensor, weights: torch.Tensor | None = None) -> dict:
    model.zero_grad(set_to_none=True)
    ce = position_ce(model(tokens), tokens)
    w = torch.full_like(ce, 1.0 / ce.numel()) if weights is None else weights
    (ce * w).sum().backward()
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return out


# ----------------------------------------------------------------------------------------------------
# stop-gradient


@pytest.mark.parametrize("regime", ["standard", "myopic"])
def test_stop_gradient_keeps_values_and_blocks_gradient(regime):
    model, x = make(**REGIMES[regime]), toks()
    plain = model(x)
    for k in range(L + 1):
        for i in range(T):
            captured = {}

            def capture(h, site, k=k):
                captured["h"] = h  # r^k before the rewrite (our hook runs last)

            with stop_gradient(model, layer=k, position=i):
                logits = model(x, hooks={f"resid.{k}": capture})
            assert torch.equal(logits, plain)
            lam = (position_ce(logits, x) / (B * (T - 1))).sum(0)
            eye = torch.eye(T - 1, dtype=lam.dtype)  # one cotangent per loss position t
            (g,) = torch.autograd.grad(lam, captured["h"], grad_outputs=eye, is_grads_batched=True)
            assert torch.count_nonzero(g[:, :, i]) == 0, (k, i)
    # without sg the same capture sees a gradient at (k, i) = (1, 2) from λ_2
    captured = {}
    logits = model(x, hooks={"resid.1": lambda h, s: captured.update(h=h)})
    (g,) = torch.autograd.grad(position_ce(logits, x)[:, 2].sum(), captured["h"])
    assert g[:, 2].abs().max() > 0


def test_stop_gradient_list_form_context_exit_and_loss():
    model, x = make(), toks()
    g_ref = grad_L(model, x)
    with stop_gradient(model, [(0, 1), (2, 3)]):
        loss = model.loss(x)  # model.loss goes through the same forward
    assert torch.equal(loss, model.loss(x))
    g_sg = dict(zip(dict(model.named_parameters()), torch.autograd.grad(loss, list(model.parameters()))))
    assert not torch.allclose(flat(g_sg), flat(g_ref))
    # after the context, gradients are ordinary again
    assert torch.allclose(flat(grad_L(model, x)), flat(g_ref), rtol=0, atol=0)
    # the one-call hook form gives the same blocked gradient
    loss2 = model.loss(x, hooks=stop_gradient_hooks(model, [(0, 1), (2, 3)]))
    g2 = torch.autograd.grad(loss2, list(model.parameters()))
    assert torch.equal(torch.cat([t.reshape(-1) for t in g2]), flat(g_sg))


def test_stop_gradient_hook_shifts_absolute_positions():
    """With a KV cache / chunked forward the tensor covers positions a..b−1: mask i − a, skip outside."""
    from originlens.models.gpt import ResidSite

    hook = stop_gradient_hooks(make(), [(1, 4), (1, 1)])["resid.1"]
    h = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    out = hook(h, ResidSite("resid.1", 1, slice(3, 6)))  # covers positions 3, 4, 5
    assert torch.equal(out, h)
    (g,) = torch.autograd.grad(out.sum(), h)
    assert torch.equal(g[:, 1], torch.zeros_like(g[:, 1])) and torch.equal(g[:, [0, 2]], torch.ones_like(g[:, [0, 2]]))
    assert hook(h, ResidSite("resid.1", 1, slice(5, 8))) is None  # neither 1 nor 4 in this chunk


def test_stop_gradient_rejects_bad_sites():
    model = make()
    with pytest.raises(ConfigError), stop_gradient(model, layer=L + 1, position=0):
        pass
    with pytest.raises(ConfigError), stop_gradient(model):
        pass
    with pytest.raises(ConfigError):
        decompose(model, toks(), [(0, T)])


# ----------------------------------------------------------------------------------------------------
# adjoints


@pytest.mark.parametrize("regime", ["standard", "untied"])
def test_adjoints_match_definitions(regime):
    model, x = make(**REGIMES[regime]), toks()
    adj = pathway_adjoints(model, x)
    logits, res = model(x, return_residuals=True)
    ce = position_ce(logits, x)
    a_ref = torch.autograd.grad(ce.sum() / (B * (T - 1)), res, retain_graph=True)
    for k in range(L + 1):
        torch.testing.assert_close(adj.full[k], a_ref[k], rtol=1e-12, atol=1e-15)
        for i in range(T - 1):
            # d^k_i = (1/(T−1)) ∂ mean_b ℓ_{b,i} / ∂r^k_i  (standard graph)
            (g,) = torch.autograd.grad(ce[:, i].mean() / (T - 1), res[k], retain_graph=True)
            torch.testing.assert_close(adj.direct[k][:, i], g[:, i], rtol=1e-12, atol=1e-16)
        assert torch.count_nonzero(adj.full[k][:, T - 1]) == 0
        assert torch.count_nonzero(adj.direct[k][:, T - 1]) == 0
        assert torch.count_nonzero(adj.precached[k][:, T - 2]) == 0  # p^k_{T−2} = 0
    assert torch.count_nonzero(adj.precached[L]) == 0  # p^L = 0
    assert adj.precached[0].abs().max() > 0  # but pre-caching exists


# ----------------------------------------------------------------------------------------------------
# decomposition: fast == brute


def rel(x: torch.Tensor, y: torch.Tensor, scale: float) -> float:
    """‖x − y‖ / ‖y‖, with ‖y‖ floored at 1e-9·‖∇L‖ for components that vanish identically."""
    return float((x - y).norm() / max(float(y.norm()), 1e-9 * scale))


def _custom_weights() -> torch.Tensor:
    mask = torch.ones(B, T - 1, dtype=torch.float64)
    mask[0, 3:] = 0.0
    mask[2, 1] = 0.0
    return mask / mask.sum()


@pytest.mark.parametrize("case", list(REGIMES) + ["standard-weights", "standard-untied-head"])
def test_fast_equals_brute_all_sites(case):
    kw = dict(REGIMES.get(case, {}))
    weights = _custom_weights() if case == "standard-weights" else None
    if case == "standard-untied-head":
        kw.update(tie_embeddings=False)
    model, x = make(seed=3, **kw), toks(seed=4)
    fast = decompose(model, x, "all", weights=weights, chunk_size=5)
    brute = decompose(model, x, "all", weights=weights, method="brute")
    g = flat(grad_L(model, x, weights))
    scale = float(g.norm())
    assert set(fast) == {(k, i) for k in range(L + 1) for i in range(T)}
    worst = 0.0
    for site in fast:
        f, b = fast[site], brute[site]
        torch.testing.assert_close(flat(f.full), g, rtol=1e-12, atol=1e-15)
        for c in COMPONENTS:
            worst = max(worst, rel(flat(getattr(f, c)), flat(getattr(b, c)), scale))
        # components sum to ∇L (the brute-force sum is a real check of Prop. 3.1)
        assert rel(sum(flat(v) for v in b.components().values()), g, scale) < 1e-12
        assert rel(sum(flat(v) for v in f.components().values()), g, scale) < 1e-13
    assert worst <= 1e-10, worst
    # every pathway is non-trivial somewhere (the comparison is not between zeros)
    assert max(float(flat(fast[s].precached).norm()) for s in fast) > 1e-3 * scale or "myopic" in case
    assert max(float(flat(fast[s].direct).norm()) for s in fast) > 1e-3 * scale


@pytest.mark.parametrize("method", ["fast", "autograd"])
def test_subset_of_sites_equals_all(method):
    """Other sites and another batching of the sources change only the rounding (the key-bias gradient,
    exactly 0 by softmax shift invariance, is pure rounding noise: absolute tolerance)."""
    model, x = make(), toks()
    every = decompose(model, x, "all", method=method)
    some = decompose(model, x, [(2, 1), (0, 4), (1, 0)], chunk_size=1, method=method)
    scale = float(flat(every[(0, 0)].full).norm())
    for s, pg in some.items():
        for c in COMPONENTS:
            torch.testing.assert_close(flat(getattr(pg, c)), flat(getattr(every[s], c)), rtol=1e-13, atol=1e-15 * scale)


@pytest.mark.parametrize("regime", ["standard", "untied"])
def test_causal_prefix_vjps_equal_full_graph_vjps(regime):
    model, x = make(**REGIMES[regime]), toks()
    a = decompose(model, x, "all", causal_prefix=True)
    b = decompose(model, x, "all", causal_prefix=False, chunk_size=7)
    scale = float(flat(a[(0, 0)].full).norm())
    for s in a:
        for c in COMPONENTS:
            assert rel(flat(getattr(a[s], c)), flat(getattr(b[s], c)), scale) < 1e-12


def test_sdpa_training_graph_agrees_to_rounding():
    model, x = make(), toks()  # attn_impl "sdpa" by default
    eager = decompose(model, x, "all")
    sdpa = decompose(model, x, "all", attn_impl=None)
    scale = float(flat(eager[(0, 0)].full).norm())
    for s in eager:
        for c in COMPONENTS:
            assert float((flat(getattr(sdpa[s], c)) - flat(getattr(eager[s], c))).norm()) < 1e-13 * scale


@pytest.mark.parametrize("regime", ["myopic", "myopic+untied"])
def test_myopic_training_has_no_precaching(regime):
    model, x = make(**REGIMES[regime]), toks()
    fast = decompose(model, x, "all")
    brute = decompose(model, x, "all", method="brute")
    scale = float(flat(fast[(0, 0)].full).norm())
    for s in fast:
        assert torch.count_nonzero(flat(fast[s].precached)) == 0
        assert float(flat(brute[s].precached).norm()) <= 1e-12 * scale
    # the same weights trained in the standard regime do pre-cache
    std = decompose(model, x, "all", myopic=False)
    assert max(float(flat(std[s].precached).norm()) for s in std) > 1e-3 * scale


@pytest.mark.parametrize("method", ["fast", "brute"])
def test_structural_zeros(method):
    model, x = make(seed=5), toks(seed=6)
    dec = decompose(model, x, "all", method=method)
    g = flat(dec[(0, 0)].full)
    tol = 0.0 if method == "fast" else 1e-13 * float(g.norm())
    for i in range(T):
        assert float(flat(dec[(L, i)].precached).abs().max()) <= tol  # G_pre(L, i) = 0
    for k in range(L + 1):
        assert float(flat(dec[(k, T - 2)].precached).abs().max()) <= tol  # G_pre(k, T−2) = 0
        last = dec[(k, T - 1)]  # i = T−1
        assert float(flat(last.direct).abs().max()) <= tol
        assert float(flat(last.precached).abs().max()) <= tol
        assert float((flat(last.shared) - g).abs().max()) <= tol


@pytest.mark.parametrize("case", ["tied", "untied-head", "untied-everything"])
def test_direct_at_embedding_is_supported_on_position_rows(case):
    kw = {"tied": {}, "untied-head": dict(tie_embeddings=False), "untied-everything": REGIMES["untied-everything"]}[
        case
    ]
    model, x = make(seed=7, **kw), toks(seed=8)
    fast = decompose(model, x, [(0, i) for i in range(T)])
    brute = decompose(model, x, [(0, i) for i in range(T)], method="brute")
    scale = float(flat(fast[(0, 0)].full).norm())
    ranges = model.config.ranges()
    for i in range(T):
        e = next(r for r, (a, b) in enumerate(ranges) if a <= i < b) if model._outer_per_range else 0
        support = {}
        for n, p in model.named_parameters():
            m = torch.zeros_like(p, dtype=torch.bool)
            if n == f"embed.{e}.wte.weight":
                m[x[:, i].unique()] = True  # rows of the tokens at position i
            elif n == f"embed.{e}.wpe.weight":
                m[i] = True  # position-embedding row i
            support[n] = m
        for n, m in support.items():
            assert torch.count_nonzero(fast[(0, i)].direct[n][~m]) == 0, (i, n)
            assert float(brute[(0, i)].direct[n][~m].abs().sum()) <= 1e-15 * scale, (i, n)
        if i < T - 1:
            assert fast[(0, i)].direct[f"embed.{e}.wpe.weight"][i].abs().max() > 0
            wte = fast[(0, i)].direct[f"embed.{e}.wte.weight"]
            assert all(wte[t].abs().max() > 0 for t in x[:, i].unique())
    if case == "tied":
        # the tied head does touch every token-embedding row, through the shared pathway
        off = torch.ones(V, dtype=torch.bool)
        off[x[:, 0].unique()] = False
        assert fast[(0, 0)].shared["embed.0.wte.weight"][off].abs().max() > 0


def test_dropout_is_refused():
    model = make(dropout=0.1)
    model.train()
    with pytest.raises(ConfigError):
        decompose(model, toks())
    model.eval()
    decompose(model, toks(), [(1, 1)])


# ----------------------------------------------------------------------------------------------------
# step attribution


def test_sgd_components_sum_to_real_step():
    model, x = make(), toks()
    dec = decompose(model, x, [(1, 2), (0, 5)])
    steps = sgd_steps(dec, lr=0.05)
    before = flat(dict(model.named_parameters())).detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    opt.zero_grad()
    model.loss(x).backward()
    opt.step()
    real = before - flat(dict(model.named_parameters())).detach()
    for s, st in steps.items():
        total = sum(flat(st[c]) for c in COMPONENTS)
        assert rel(total, real, 1.0) < 1e-13
        for c in COMPONENTS:
            torch.testing.assert_close(flat(st[c]), 0.05 * flat(getattr(dec[s], c)), rtol=1e-15, atol=0)


@pytest.mark.parametrize("method", ["fast", "autograd"])
@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_adam_attribution_sums_to_real_update(kind, method):
    lr, (b1, b2), eps, wd = 1e-2, (0.9, 0.999), 1e-8, 0.1
    model = make(seed=11)
    shadow = copy.deepcopy(model)  # trained by a plain torch optimizer
    shadow.attn_impl = "eager"  # the decomposition's kernel (SDPA: rounding differs)
    opt_cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
    extra = {} if kind == "adam" else {"weight_decay": wd}
    opt = opt_cls(model.parameters(), lr=lr, betas=(b1, b2), eps=eps, **extra)
    opt_shadow = opt_cls(shadow.parameters(), lr=lr, betas=(b1, b2), eps=eps, **extra)
    att = AdamAttributor(opt, model)
    sites = [(0, 1), (1, 3), (2, 2), (1, 5)]
    names = [n for n, _ in model.named_parameters()]
    m_ref = {s: {c: {n: 0.0 for n in names} for c in COMPONENTS} for s in sites}
    v_ref = {n: 0.0 for n in names}
    for step in range(1, 5):
        x = toks(seed=100 + step)
        dec = decompose(model, x, sites, method=method)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        steps = att.step(dec)
        real = {n: before[n] - p.detach() for n, p in model.named_parameters()}
        # the plain optimizer on the same batch follows the same trajectory.  The structured path's ∇L
        # differs from autograd's by rounding; Adam divides by sqrt(v) + eps, so on entries whose gradient
        # is exactly 0 in exact arithmetic (key biases) a 1e-17 rounding difference moves θ by lr·1e-17/eps.
        opt_shadow.zero_grad()
        shadow.loss(x).backward()
        opt_shadow.step()
        atol = 1e-15 if method == "autograd" else lr * 1e-16 / eps * 10
        torch.testing.assert_close(
            flat(dict(shadow.named_parameters())), flat(dict(model.named_parameters())), rtol=1e-13, atol=atol
        )
        # explicit per-component Adam (the optimiser-aware attribution of docs/concepts.md), written out here
        g = dec[sites[0]].full
        for n in names:
            v_ref[n] = b2 * v_ref[n] + (1 - b2) * g[n] ** 2
        for s in sites:
            assert set(steps[s]) == set(COMPONENTS) | ({"decay"} if kind == "adamw" else set())
            total = {n: sum(steps[s][c][n] for c in steps[s]) for n in names}
            assert rel(flat(total), flat(real), 1.0) <= 1e-12  # Σ_c Δ_c = real update
            for c in COMPONENTS:
                for n in names:
                    m_ref[s][c][n] = b1 * m_ref[s][c][n] + (1 - b1) * getattr(dec[s], c)[n]
                want = {
                    n: lr * (m_ref[s][c][n] / (1 - b1**step)) / (torch.sqrt(v_ref[n] / (1 - b2**step)) + eps)
                    for n in names
                }
                assert rel(flat(steps[s][c]), flat(want), float(flat(real).norm())) < 1e-10
            if kind == "adamw":
                torch.testing.assert_close(flat(steps[s]["decay"]), lr * wd * flat(before), rtol=1e-15, atol=0)
        assert att.last_check < 1e-12
    assert att.num_steps == 4
    # moments survive a state_dict round trip
    fresh = make()
    att2 = AdamAttributor(opt_cls(fresh.parameters(), lr=lr), fresh)
    att2.load_state_dict(att.state_dict())
    assert att2.num_steps == 4 and set(att2.moments) == set(sites)


def test_adam_attribution_started_mid_training_carries_the_first_moment():
    """An attributor started after τ₀ optimizer steps (carry=True) carries m(τ₀) as its own decaying
    component: direct + pre-cached + shared + carried = the real update at every later step; the carried
    step equals lr·β1ⁿ m(τ₀)/(1 − β1^τ)/(√v̂ + ε) written out; and the attributor that saw every step
    from the first one has, summed over its components, exactly the same update, its excess over the late
    one's components being the carried part."""
    lr, (b1, b2), eps = 1e-2, (0.9, 0.999), 1e-8
    sites = [(1, 3), (2, 2)]
    model = make(seed=21)
    names = [n for n, _ in model.named_parameters()]
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(b1, b2), eps=eps)
    early = AdamAttributor(opt, model)
    late = None
    tau0 = 3
    m0 = None
    for step in range(1, tau0 + 6):
        dec = decompose(model, toks(seed=300 + step), sites)
        if step == tau0 + 1:  # the optimizer has taken τ₀ steps the late attributor never saw
            with pytest.raises(ConfigError, match="carry=True"):
                AdamAttributor(opt, model)
            late = AdamAttributor(opt, model, carry=True)
            assert late.num_steps == late.first_step == tau0
            m0 = {n: opt.state[p]["exp_avg"].double().clone() for n, p in zip(names, model.parameters())}
        steps_early = early.step(dec)
        if late is None:
            continue
        steps_late = late.attribute(dec)
        n = step - tau0
        st = opt.state
        for s in sites:
            assert set(steps_late[s]) == set(COMPONENTS) | {"carried"}
            total_late = {k: sum(steps_late[s][c][k] for c in steps_late[s]) for k in names}
            total_early = {k: sum(steps_early[s][c][k] for c in COMPONENTS) for k in names}
            assert rel(flat(total_late), flat(total_early), 1.0) < 1e-12
            want = {
                k: lr
                * (b1**n * m0[k] / (1 - b1**step))
                / (torch.sqrt(st[p]["exp_avg_sq"].double() / (1 - b2**step)) + eps)
                for k, p in zip(names, model.parameters())
            }
            assert rel(flat(steps_late[s]["carried"]), flat(want), float(flat(total_early).norm())) < 1e-12
            excess = {k: total_early[k] - sum(steps_late[s][c][k] for c in COMPONENTS) for k in names}
            assert rel(flat(excess), flat(steps_late[s]["carried"]), float(flat(total_early).norm())) < 1e-10
        assert late.last_check < 1e-12
        assert late.carried_share is not None and late.carried_share > 0
    shares = []  # the carried moment decays like β1ⁿ; its share of the update with it
    for step in range(tau0 + 6, tau0 + 30):
        late.step(decompose(model, toks(seed=300 + step), sites))
        shares.append(late.carried_share)
        assert torch.allclose(flat(late.carried), b1 ** (step - tau0) * flat(m0), rtol=1e-13, atol=0)
    assert shares[-1] < shares[0] < 1
    # the carried moment survives a state_dict round trip
    fresh = make()
    other = AdamAttributor(torch.optim.Adam(fresh.parameters(), lr=lr), fresh)
    other.load_state_dict(late.state_dict())
    assert other.first_step == tau0 and other.num_steps == late.num_steps
    assert all(torch.equal(other.carried[k], late.carried[k]) for k in names)


def test_adam_attribution_float32_within_default_tolerance():
    model = make(seed=12, dtype="float32")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    att = AdamAttributor(opt, model)  # default tol 1e-6, float64 moments
    for step in range(3):
        att.step(decompose(model, toks(seed=200 + step), "all"))
        assert att.last_check < 1e-6


def test_adam_attributor_refuses_and_detects():
    model = make()
    with pytest.raises(ConfigError):
        AdamAttributor(torch.optim.Adam(model.parameters(), weight_decay=0.01), model)
    with pytest.raises(ConfigError):
        AdamAttributor(torch.optim.SGD(model.parameters(), lr=0.1), model)
    params = list(model.parameters())
    with pytest.raises(ConfigError):
        AdamAttributor(torch.optim.Adam([{"params": params[:2]}, {"params": params[2:]}]), model)
    x = toks()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    att = AdamAttributor(opt, model)
    att.step(decompose(model, x, [(1, 1)]))
    with pytest.raises(ConfigError):  # sites must stay the same
        att.step(decompose(model, x, [(1, 2)]))
    # stepping on a different gradient than the decomposition's ∇L is caught by the assertion
    model2 = make()
    opt2 = torch.optim.Adam(model2.parameters(), lr=1e-2)
    att2 = AdamAttributor(opt2, model2)
    dec = decompose(model2, x, [(1, 1)])
    opt2.zero_grad()
    model2.loss(toks(seed=99)).backward()
    opt2.step()
    with pytest.raises(NumericalError):
        att2.attribute(dec)


# ----------------------------------------------------------------------------------------------------
# influence


def explicit_influence(model, x, probe, ref, step_c, half, rows=None):
    """⟨Δ_c, ∇R⟩ with ∇R from an explicit backward of R (non-myopic graph)."""
    _, res = model(x, return_residuals=True, myopic=False)
    diff = res[probe.layer][:, probe.position] @ probe.direction - ref
    if rows is not None:
        diff = diff[rows]
    R = (0.5 if half else 1.0) * (diff**2).mean()
    names = [n for n, _ in model.named_parameters()]
    g = torch.autograd.grad(R, list(model.parameters()), allow_unused=True)
    return float(R.detach()), sum(float((step_c[n] * gi).sum()) for n, gi in zip(names, g) if gi is not None)


def _probe_setup(regime="standard"):
    model, final = make(seed=21, **REGIMES[regime]), make(seed=22, **REGIMES[regime])
    x = toks(seed=23, b=6)
    gen = torch.Generator().manual_seed(5)
    probes = [
        Probe("f0", 1, 2, torch.randn(8, generator=gen, dtype=torch.float64)),
        Probe("f1", 1, 2, torch.randn(8, generator=gen, dtype=torch.float64)),
        Probe("f2", 2, 4, torch.randn(8, generator=gen, dtype=torch.float64)),
    ]
    refs = reference_projections(final, x, probes)
    return model, x, probes, refs


@pytest.mark.parametrize("regime", ["standard", "myopic"])
@pytest.mark.parametrize("half", [True, False])
def test_jvp_influence_equals_explicit_gradient(regime, half):
    model, x, probes, refs = _probe_setup(regime)
    dec = decompose(model, x, [p.site for p in probes])
    steps = sgd_steps(dec, lr=0.1)
    types = {"f0": torch.tensor([0, 1, 1, 2, 0, 1]), "f2": torch.tensor([2, 2, 2, 2, 2, 2])}
    out = influences(model, x, steps, probes, refs, types=types, type_values=[0, 1, 2], half=half)
    by_key = {(r.probe, r.feature_type, r.component): r for r in out}
    checked = 0
    for p in probes:
        tys = [None] + ([0, 1, 2] if p.name in types else [])
        for tau in tys:
            rows = None if tau is None else types[p.name] == tau
            if rows is not None and not rows.any():
                for c in COMPONENTS + ("full",):  # empty subset: reported missing, not NaN
                    rec = by_key[(p.name, tau, c)]
                    assert rec.value is None and rec.risk is None and rec.n_rows == 0
                continue
            total = 0.0
            for c in COMPONENTS:
                R, want = explicit_influence(model, x, p, refs[p.name], steps[p.site][c], half, rows)
                rec = by_key[(p.name, tau, c)]
                assert rec.value == pytest.approx(want, rel=1e-10, abs=1e-14 * abs(R) + 1e-300)
                assert rec.risk == pytest.approx(R, rel=1e-13)
                assert rec.factor == (0.5 if half else 1.0)
                total += want
                checked += 1
            assert by_key[(p.name, tau, "full")].value == pytest.approx(total, rel=1e-10, abs=1e-16)
    assert checked >= 3 * 7
    assert by_key[("f2", 0, "direct")].value is None  # type 0 never occurs for f2


def test_double_backward_jvp_equals_forward_mode():
    model, x, probes, _ = _probe_setup()
    dec = decompose(model, x, [(1, 2)])
    tangents = list(sgd_steps(dec, 1.0)[(1, 2)].values())
    fwd = site_jvp(model, x, (1, 2), tangents, jvp="forward")
    rev = site_jvp(model, x, (1, 2), tangents, jvp="double_backward")
    torch.testing.assert_close(fwd, rev, rtol=1e-12, atol=1e-16)
    # and both are the directional derivative of r^1_2 (central finite difference)
    h = 1e-6
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n, p in params.items():
            p.add_(h * tangents[0][n])
        up = model(x, return_residuals=True)[1][1][:, 2]
        for n, p in params.items():
            p.sub_(2 * h * tangents[0][n])
        down = model(x, return_residuals=True)[1][1][:, 2]
        for n, p in params.items():
            p.add_(h * tangents[0][n])
    torch.testing.assert_close(fwd[0], (up - down) / (2 * h), rtol=1e-6, atol=1e-9)


def test_influence_is_first_order_change_of_mismatch():
    model, x, probes, refs = _probe_setup()
    p = probes[0]
    errors = []
    for lr in (1e-2, 1e-3):
        dec = decompose(model, x, [p.site])
        steps = sgd_steps(dec, lr=lr)[p.site]
        rec = [
            r
            for r in influences(model, x, {p.site: steps}, [p], refs, half=True)
            if r.feature_type is None and r.component == "full"
        ][0]
        stepped = copy.deepcopy(model)
        with torch.no_grad():
            for n, q in stepped.named_parameters():
                q.sub_(sum(steps[c][n] for c in COMPONENTS))
        with torch.no_grad():
            R0 = float(
                0.5
                * (
                    (model(x, return_residuals=True)[1][p.layer][:, p.position] @ p.direction - refs[p.name]) ** 2
                ).mean()
            )
            R1 = float(
                0.5
                * (
                    (stepped(x, return_residuals=True)[1][p.layer][:, p.position] @ p.direction - refs[p.name]) ** 2
                ).mean()
            )
        assert rec.risk == pytest.approx(R0, rel=1e-13)
        errors.append(abs(rec.value - (R0 - R1)))
        assert abs(rec.value - (R0 - R1)) < 0.05 * abs(rec.value)
    assert errors[1] < errors[0] / 30  # O(‖Δ‖²): a 10× smaller step, ~100× smaller error


# ----------------------------------------------------------------------------------------------------
# structured fast path (attribution/structured.py) vs generic autograd and the model itself


def test_structured_forward_matches_model():
    from originlens.attribution import structured

    model, x = make(seed=31), toks(seed=32)
    assert structured.supported(model)
    fw = structured.Forward(model, x)
    model.attn_impl = "eager"
    _, res = model(x, return_residuals=True)
    for a, b in zip(fw.residuals, res):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_structured_not_used_where_unsupported():
    from originlens.attribution import structured

    assert not structured.supported(make(**REGIMES["untied"]))
    model = make()
    with stop_gradient(model, layer=1, position=2):
        assert not structured.supported(model)  # a forward pre-hook is active
    assert structured.supported(model)


@pytest.mark.parametrize("case", ["heads1-mlp2", "vocab40", "frozen", "3layers", "myopic-3layers"])
def test_structured_equals_autograd(case, monkeypatch):
    """The structured path against generic autograd VJPs (exact to round-off), on configurations the
    brute-force tests do not cover: one head and MLP ratio 2, a vocabulary above the GEMM threshold of
    the embedding reduction, a frozen parameter, three layers; small groups force several passes."""
    from originlens.attribution import structured

    kw = {
        "heads1-mlp2": dict(n_head=1, mlp_ratio=2),
        "vocab40": dict(vocab_size=40),
        "frozen": {},
        "3layers": dict(n_layer=3, d_model=12, n_head=3),
        "myopic-3layers": dict(n_layer=3, regime="myopic"),
    }[case]
    model = make(seed=41, **kw)
    if case == "frozen":
        model.blocks[0].copies[0].mlp_in.weight.requires_grad_(False)
    g = torch.Generator().manual_seed(42)
    x = torch.randint(0, model.config.vocab_size, (4, T), generator=g)
    monkeypatch.setattr(structured, "GROUP_FLOATS", 1)  # one position per group
    fast = decompose(model, x, "all", chunk_size=3)
    ref = decompose(model, x, "all", method="autograd")
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert list(fast[(0, 0)].full) == names
    scale = float(flat(ref[(0, 0)].full).norm())
    for s in ref:
        for c in COMPONENTS + ("full",):
            got, want = flat(getattr(fast[s], c)), flat(getattr(ref[s], c))
            assert float((got - want).norm()) <= 1e-12 * scale, (s, c)


def test_structured_large_vocabulary_equals_brute():
    """Both embedding reductions of the first block (GEMM with an indicator for small vocabularies,
    index_add above the threshold) against the stop-gradient definition, float64."""
    for vocab in (V, 40):
        model = make(seed=43, vocab_size=vocab)
        g = torch.Generator().manual_seed(44)
        x = torch.randint(0, vocab, (3, T), generator=g)
        fast = decompose(model, x, "all", chunk_size=4)
        brute = decompose(model, x, "all", method="brute")
        scale = float(flat(brute[(0, 0)].full).norm())
        for s in brute:
            for c in COMPONENTS:
                assert rel(flat(getattr(fast[s], c)), flat(getattr(brute[s], c)), scale) <= 1e-10, (vocab, s, c)


def test_structured_cut_identity_and_subsets_give_the_same_gradient():
    """With every loss position of layer L requested, ∇L is summed from the sites (cut identity);
    otherwise it comes from the adjoint recursion: both equal autograd's ∇L."""
    model, x = make(seed=51), toks(seed=52)
    g = flat(grad_L(model, x))
    with_cut = decompose(model, x, [(L, i) for i in range(T - 1)] + [(1, 2)])
    without = decompose(model, x, [(L, i) for i in range(T - 2)] + [(1, 2)])
    for dec in (with_cut, without):
        torch.testing.assert_close(flat(dec[(1, 2)].full), g, rtol=1e-12, atol=1e-15)
    for c in COMPONENTS:
        torch.testing.assert_close(
            flat(getattr(with_cut[(1, 2)], c)), flat(getattr(without[(1, 2)], c)), rtol=1e-12, atol=1e-15
        )


@pytest.mark.parametrize("regime", ["standard", "myopic"])
def test_structured_adjoints_equal_autograd_adjoints(regime):
    model, x = make(seed=61, **REGIMES[regime]), toks(seed=62)
    fast = pathway_adjoints(model, x)
    ref = pathway_adjoints(model, x, method="autograd")
    for k in range(L + 1):
        for a, b in (
            (fast.full[k], ref.full[k]),
            (fast.direct[k], ref.direct[k]),
            (fast.precached[k], ref.precached[k]),
        ):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-16)
    torch.testing.assert_close(flat(fast.grad), flat(ref.grad), rtol=1e-12, atol=1e-16)
    assert fast.loss == pytest.approx(ref.loss, rel=1e-14)


def test_zero_entries_are_shared_and_shared_component_reuses_full():
    """Exact zeros (parameters a site cannot reach) are one tensor per parameter, and a shared
    component with nothing to subtract is ∇L's own tensor (documented: do not modify in place)."""
    model, x = make(), toks()
    dec = decompose(model, x, [(0, 1), (0, 2), (1, 1)])
    n = "blocks.1.copies.0.mlp_in.weight"  # block 2: unreachable from layers 0, 1
    assert dec[(0, 1)].direct[n] is dec[(0, 2)].direct[n] is dec[(1, 1)].precached[n]
    assert torch.count_nonzero(dec[(0, 1)].direct[n]) == 0
    assert dec[(0, 1)].shared[n] is dec[(0, 1)].full[n]
