"""Tests for originlens.models.gpt: every regime against a brute-force float64 reference written here.

The reference (`ref_forward`) loops over positions and queries and applies the regime definitions of docs/concepts.md (arXiv 2603.14087's interventions)
literally: per-position choice of the range copy (untied), and for myopic attention the keys and values
of positions j ≠ t detached for query t.  The untied path is also held bit-identical (training included)
to its earlier split-and-concatenate form, kept here as `previous_forward`.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

from originlens.errors import CompatibilityError, ConfigError, InputError
from originlens.models import GPT, GPTConfig
from originlens.models.gpt import REGIMES, causal_self_attention, position_losses, reference_weights

V, T, B = 7, 6, 3


def make(seed: int = 0, **kw) -> GPT:
    base = dict(vocab_size=V, seq_len=T, n_layer=2, d_model=8, n_head=2, dtype="float64")
    base.update(kw)
    torch.manual_seed(seed)
    return GPT(GPTConfig(**base))


def tokens(seed: int = 1, b: int = B, t: int = T) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (b, t), generator=g)


# ---------------------------------------------------------------------------------------------------
# brute-force reference


def _ln(x, mod):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-5) * mod.weight + mod.bias


def _lin(x, mod):
    y = x @ mod.weight.T
    return y if mod.bias is None else y + mod.bias


def _gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def ref_forward(model: GPT, toks: torch.Tensor, myopic: bool):
    """Literal definition: position loop, per-position copy, sg on other positions' K/V if myopic."""
    cfg = model.config
    b, t_len = toks.shape
    d, H = cfg.d_model, cfg.n_head
    hd = d // H
    ranges = cfg.ranges()
    copy_of = [next(r for r, (a, e) in enumerate(ranges) if a <= t < e) for t in range(t_len)]
    outer = [copy_of[t] if len(model.embed) > 1 else 0 for t in range(t_len)]
    xs = [model.embed[outer[t]].wte.weight[toks[:, t]] + model.embed[outer[t]].wpe.weight[t] for t in range(t_len)]
    res = [torch.stack(xs, 1)]
    for block in model.blocks:
        cs = [block.copies[copy_of[t]] for t in range(t_len)]
        qkv = [_lin(_ln(xs[t], cs[t].ln_1), cs[t].attn_qkv) for t in range(t_len)]
        q = [z[:, :d].reshape(b, H, hd) for z in qkv]
        k = [z[:, d : 2 * d].reshape(b, H, hd) for z in qkv]
        v = [z[:, 2 * d :].reshape(b, H, hd) for z in qkv]
        new = []
        for t in range(t_len):
            live = lambda j, z: z if (j == t or not myopic) else z.detach()
            s = torch.stack([(q[t] * live(j, k[j])).sum(-1) / math.sqrt(hd) for j in range(t + 1)], -1)
            a = torch.softmax(s, -1)  # (B, H, t+1)
            o = sum(a[..., j : j + 1] * live(j, v[j]) for j in range(t + 1))  # (B, H, hd)
            h = xs[t] + _lin(o.reshape(b, d), cs[t].attn_out)
            h = h + _lin(_gelu_tanh(_lin(_ln(h, cs[t].ln_2), cs[t].mlp_in)), cs[t].mlp_out)
            new.append(h)
        xs = new
        res.append(torch.stack(xs, 1))
    logits = []
    for t in range(t_len):
        hc = model.head[outer[t]]
        w = model.embed[outer[t]].wte.weight if hc.lm_head is None else hc.lm_head.weight
        logits.append(_ln(xs[t], hc.ln_f) @ w.T)
    return torch.stack(logits, 1), res


def ref_loss(logits, toks):
    lp = torch.log_softmax(logits, -1)
    t_len = toks.shape[1]
    ell = torch.stack([-lp[:, t].gather(1, toks[:, t + 1 : t + 2])[:, 0] for t in range(t_len - 1)], 1)
    return ell.mean()


def grads(model: GPT, loss: torch.Tensor, retain: bool = True) -> dict[str, torch.Tensor]:
    names, params = zip(*model.named_parameters())
    gs = torch.autograd.grad(loss, params, retain_graph=retain, allow_unused=True)
    return {n: (torch.zeros_like(p) if g is None else g) for n, p, g in zip(names, params, gs)}


# ---------------------------------------------------------------------------------------------------
# configuration


@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(regime="shortsighted"), "standard, myopic, untied, myopic+untied"),
        (dict(regime="untied"), "needs untie_at"),
        (dict(untie_at=[3]), "regime is 'standard'"),
        (dict(regime="untied", untie_at=[0]), "outside"),
        (dict(regime="untied", untie_at=[T]), "outside"),
        (dict(regime="untied", untie_at=[4, 2]), "increasing"),
        (dict(regime="untied", untie_at=[2, 2]), "increasing"),
        (dict(regime="untied", untie_at=[]), "non-empty"),
        (dict(regime="untied", untie_at="some"), "not understood"),
        (dict(regime="untied", untie_at=[2], untie_scope="heads"), "untie_scope"),
        (dict(regime="untied", untie_at=[2], untie_init="copy"), "untie_init"),
        (dict(n_head=3), "divisible"),
        (dict(attn_impl="flash"), "attn_impl"),
        (dict(dtype="int8"), "dtype"),
        (dict(n_positions=T - 1), "n_positions"),
        (dict(n_layer=0), "n_layer"),
        (dict(dropout=1.0), "dropout"),
    ],
)
def test_config_validation(kw, needle):
    base = dict(vocab_size=V, seq_len=T, n_layer=2, d_model=8, n_head=2)
    base.update(kw)
    with pytest.raises(ConfigError) as e:
        GPTConfig(**base)
    assert needle in str(e.value)


def test_config_roundtrip_and_ranges():
    cfg = GPTConfig(
        vocab_size=V,
        seq_len=T,
        n_layer=1,
        d_model=8,
        n_head=2,
        regime="untied",
        untie_at=[2, 4],
        dtype=torch.float64,
        n_positions=T + 1,
    )
    assert cfg.dtype == "float64" and cfg.untied and not cfg.myopic
    assert set(REGIMES) == {"standard", "myopic", "untied", "myopic+untied"}
    assert cfg.ranges() == [(0, 2), (2, 4), (4, T + 1)]
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg
    all_cfg = GPTConfig(vocab_size=V, seq_len=T, n_layer=1, d_model=8, n_head=2, regime="untied", untie_at="all")
    assert all_cfg.ranges() == [(t, t + 1) for t in range(T)]
    with pytest.raises(ConfigError):
        GPTConfig.from_dict({**cfg.to_dict(), "bogus": 1})


# ---------------------------------------------------------------------------------------------------
# sites, shapes, init, tying


def test_residual_sites_and_final_ln():
    m = make()
    x = tokens()
    logits, res = m(x, return_residuals=True)
    assert logits.shape == (B, T, V)
    assert len(res) == m.config.n_layer + 1 and all(r.shape == (B, T, 8) for r in res)
    assert torch.allclose(res[0], m.embed[0].wte.weight[x] + m.embed[0].wpe.weight[:T], rtol=0, atol=1e-15)
    # resid.L is taken before the final LayerNorm
    manual = _ln(res[-1], m.head[0].ln_f) @ m.embed[0].wte.weight.T
    assert torch.allclose(logits, manual, rtol=0, atol=1e-12)
    assert m.hook_names == ["resid.0", "resid.1", "resid.2"]


def test_gpt2_init_statistics():
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=50, seq_len=16, n_layer=3, d_model=64, n_head=4))
    c = m.blocks[1].copies[0]
    assert abs(c.attn_qkv.weight.std().item() / 0.02 - 1) < 0.05
    assert abs(c.mlp_out.weight.std().item() / (0.02 / math.sqrt(6)) - 1) < 0.05
    assert abs(c.attn_out.weight.std().item() / (0.02 / math.sqrt(6)) - 1) < 0.1
    assert abs(m.embed[0].wpe.weight.std().item() / 0.02 - 1) < 0.1
    assert torch.all(c.attn_qkv.bias == 0) and torch.all(c.ln_1.weight == 1) and torch.all(c.ln_2.bias == 0)
    assert m.embed[0].wte.weight.dtype == torch.float32


def test_weight_tying():
    tied, untied = make(), make(tie_embeddings=False)
    assert tied.head[0].lm_head is None and untied.head[0].lm_head is not None
    assert untied.num_params() - tied.num_params() == V * 8
    brute = sum(p.numel() for p in {id(p): p for p in tied.parameters()}.values())
    assert tied.num_params() == brute
    # the head really uses the embedding: perturbing wte changes logits of positions with other tokens
    x = torch.zeros(1, T, dtype=torch.long)
    before = tied(x)
    with torch.no_grad():
        tied.embed[0].wte.weight[3] += torch.linspace(-1, 1, 8, dtype=torch.float64)
    after = tied(x)
    assert not torch.allclose(before[..., 3], after[..., 3]) and torch.equal(before[..., 2], after[..., 2])


# ---------------------------------------------------------------------------------------------------
# brute-force agreement for every regime


CASES = {
    "standard-sdpa": dict(),
    "standard-eager": dict(attn_impl="eager"),
    "standard-untied-head": dict(tie_embeddings=False),
    "myopic": dict(regime="myopic"),
    "untied-blocks": dict(regime="untied", untie_at=[2]),
    "untied-everything": dict(regime="untied", untie_at=[2, 4], untie_scope="everything"),
    "untied-all": dict(regime="untied", untie_at="all"),
    "myopic+untied-everything": dict(
        regime="myopic+untied", untie_at=[3], untie_scope="everything", tie_embeddings=False
    ),
    "myopic+untied-all": dict(regime="myopic+untied", untie_at="all", untie_scope="everything"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_bruteforce_reference(case):
    m = make(**CASES[case])
    x = tokens()
    logits = m(x)
    ref_logits, _ = ref_forward(m, x, myopic=m.is_myopic)
    assert torch.allclose(logits, ref_logits, rtol=0, atol=1e-12)
    g = grads(m, m.loss(x))
    g_ref = grads(m, ref_loss(ref_logits, x))
    for n in g:
        assert torch.allclose(g[n], g_ref[n], rtol=1e-9, atol=1e-13), n


def test_short_inputs_on_untied_model():
    m = make(regime="untied", untie_at=[4], untie_scope="everything")
    x = tokens(t=3)  # shorter than the first range: only copy 0 is used
    logits = m(x)
    assert torch.allclose(logits, ref_forward(m, x, myopic=False)[0], rtol=0, atol=1e-12)
    g = grads(m, m.loss(x))
    assert all(torch.count_nonzero(g[n]) == 0 for n in m.param_groups_by_range()[1])


def test_gradcheck_standard():
    m = make(n_layer=1, d_model=4, n_head=2, attn_impl="eager")
    x = tokens(b=2, t=4)
    names = ["embed.0.wpe.weight", "blocks.0.copies.0.attn_qkv.bias", "blocks.0.copies.0.ln_2.weight"]
    params = dict(m.named_parameters())

    def f(*ts):
        out = torch.func.functional_call(m, {**params, **dict(zip(names, ts))}, (x,))
        return position_losses(out, x).sum()

    inputs = tuple(params[n].detach().clone().requires_grad_(True) for n in names)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, fast_mode=True)
    m.attn_impl = "sdpa"
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, fast_mode=True)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_forward_mode_jvp_matches_vjp(impl):
    """⟨u, J Δ⟩ = ⟨Jᵀ u, Δ⟩ for θ ↦ r^1 (influences are computed with JVPs)."""
    m = make(attn_impl=impl)
    x = tokens()
    params = {n: p.detach() for n, p in m.named_parameters()}
    g = torch.Generator().manual_seed(7)
    delta = {n: torch.randn(p.shape, generator=g, dtype=p.dtype) for n, p in params.items()}

    def site(p):
        return torch.func.functional_call(m, p, (x,), {"return_residuals": True})[1][1]

    _, jv = torch.func.jvp(site, (params,), (delta,))
    u = torch.randn(jv.shape, generator=g, dtype=jv.dtype)
    _, res = m(x, return_residuals=True)
    names, ps = zip(*m.named_parameters())
    vjp = torch.autograd.grad(res[1], ps, u, allow_unused=True)
    rhs = sum((gv * delta[n]).sum() for n, gv in zip(names, vjp) if gv is not None)
    assert torch.isclose((u * jv).sum(), rhs, rtol=1e-11)


# ---------------------------------------------------------------------------------------------------
# myopic


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 1e-6)])
def test_myopic_logits_bit_identical(dtype, tol):
    m = make(dtype=dtype, d_model=16, n_head=4, n_layer=3)
    x = tokens(b=4)
    sdpa = m(x)
    m.attn_impl = "eager"
    eager = m(x)
    with m.myopic():
        assert m.regime == "myopic"
        my = m(x)
    assert torch.equal(my, eager)  # bit-identical to the eager standard path
    assert torch.allclose(sdpa, eager, rtol=0, atol=tol)  # SDPA differs by rounding only
    # the same state dict in a model built as myopic
    m2 = GPT.from_state_dict(m.state_dict(), GPTConfig(**{**m.config.to_dict(), "regime": "myopic"}))
    assert m2.is_myopic and torch.equal(m2(x), eager)


def test_myopic_attention_primitive_matches_where_formula():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = causal_self_attention(q, k, v, myopic=True)
    eye = torch.eye(5, dtype=torch.bool)
    s = torch.where(eye, q @ k.transpose(-2, -1), q @ k.detach().transpose(-2, -1)) / 2.0
    a = torch.softmax(s.masked_fill(torch.ones(5, 5).triu(1).bool(), float("-inf")), -1)
    ref = a @ v.detach() + torch.diagonal(a, dim1=-2, dim2=-1)[..., None] * (v - v.detach())
    cot = torch.randn(out.shape, generator=g, dtype=torch.float64)
    g1 = torch.autograd.grad(out, (q, k, v), cot)
    g2 = torch.autograd.grad(ref, (q, k, v), cot)
    assert torch.allclose(out, ref, rtol=0, atol=1e-14)
    for a1, a2 in zip(g1, g2):
        assert torch.allclose(a1, a2, rtol=1e-12, atol=1e-14)


def _adjoints(m: GPT, x: torch.Tensor, myopic: bool) -> list[list[torch.Tensor]]:
    """out[t][k] = ∂λ_t/∂r^k (B, T, d) for t = 0..T−2."""
    logits, res = m(x, return_residuals=True, myopic=myopic)
    lam = position_losses(logits, x).sum(0)
    return [list(torch.autograd.grad(lam[t], res, retain_graph=True)) for t in range(x.shape[1] - 1)]


def test_myopic_residual_adjoints():
    m = make(attn_impl="eager")
    x = tokens()
    my, std = _adjoints(m, x, True), _adjoints(m, x, False)
    some_cross = False
    for t in range(T - 1):
        for k in range(m.config.n_layer + 1):
            others = [j for j in range(T) if j != t]
            assert torch.count_nonzero(my[t][k][:, others]) == 0, (t, k)
            assert torch.allclose(my[t][k][:, t], std[t][k][:, t], rtol=1e-10, atol=1e-15), (t, k)
            assert torch.count_nonzero(std[t][k][:, t + 1 :]) == 0  # causality
            if k < m.config.n_layer and t > 0:
                some_cross |= bool(std[t][k][:, :t].abs().max() > 1e-8)
    assert some_cross


def test_myopic_context_manager_is_per_instance():
    a, b = make(seed=0, attn_impl="eager"), make(seed=1, attn_impl="eager")
    built_myopic = make(seed=2, regime="myopic")
    x = tokens()

    def cross(model):  # size of ∂λ_{T−2}/∂r^0_j, j < T−2
        return _adjoints_last(model, x)

    assert cross(a) > 0 and cross(b) > 0 and cross(built_myopic) == 0
    with a.myopic():
        assert a.is_myopic and not b.is_myopic
        assert cross(a) == 0 and cross(b) > 0
        with a.myopic(False):
            assert cross(a) > 0
        assert cross(a) == 0
    assert not a.is_myopic and cross(a) > 0
    with pytest.raises(RuntimeError), a.myopic():
        raise RuntimeError("boom")
    assert not a.is_myopic and built_myopic.is_myopic


def _adjoints_last(model, x):
    logits, res = model(x, return_residuals=True)
    lam = position_losses(logits, x).sum(0)
    g = torch.autograd.grad(lam[-1], res[0])[0]
    return g[:, :-2].abs().max().item()


# ---------------------------------------------------------------------------------------------------
# hooks


def test_stop_gradient_hook_and_hook_api():
    m = make()
    x = tokens()
    k, i = 1, 2
    seen, captured = [], {}

    def sg_at_i(h, site):
        seen.append(site)
        captured["pre"] = h
        mask = torch.zeros(1, h.shape[1], 1, dtype=h.dtype)
        mask[0, i] = 1
        return h + mask * (h.detach() - h)

    plain = m(x)
    logits, res = m.run_with_hooks(x, {f"resid.{k}": sg_at_i}, return_residuals=True)
    assert torch.equal(plain, logits)  # value-preserving
    assert seen[0].name == "resid.1" and seen[0].layer == 1 and seen[0].positions == slice(0, T)
    assert res[k] is not captured["pre"]  # residuals hold the consumed tensor
    total = position_losses(logits, x).sum()
    g_pre, g_post = torch.autograd.grad(total, (captured["pre"], res[k]))
    assert torch.count_nonzero(g_pre[:, i]) == 0  # blocked at (k, i) for every λ_t
    assert torch.count_nonzero(g_post[:, i]) > 0
    others = [j for j in range(T) if j != i]
    assert torch.equal(g_pre[:, others], g_post[:, others])
    # replacing values is an intervention; None keeps the tensor; lists run in order
    zeroed = m(x, hooks={"resid.0": [lambda h, s: None, lambda h, s: torch.zeros_like(h)]})
    assert not torch.allclose(zeroed, plain)
    with pytest.raises(ConfigError, match="resid.0, resid.1, resid.2"):
        m(x, hooks={"resid.9": lambda h, s: None})
    with pytest.raises(InputError):
        m(x, hooks={"resid.0": lambda h, s: h[:, :2]})


# ---------------------------------------------------------------------------------------------------
# untied


def _split_losses(m, x, mvalue):
    lam = position_losses(m(x), x).sum(0)
    return lam[:mvalue].sum(), lam[mvalue:].sum()


@pytest.mark.parametrize("scope", ["everything", "blocks"])
def test_untied_gradient_routing(scope):
    mv = 3
    m = make(regime="untied", untie_at=[mv], untie_scope=scope)
    groups = m.param_groups_by_range()
    assert set(groups) == {0, 1, "shared"}
    assert (len(groups["shared"]) == 0) == (scope == "everything")
    x = tokens()
    early, late = _split_losses(m, x, mv)
    g_early, g_late = grads(m, early), grads(m, late)
    # range 1 parameters get nothing from losses at t < m
    assert all(torch.count_nonzero(g_early[n]) == 0 for n in groups[1])
    assert any(torch.count_nonzero(g_early[n]) > 0 for n in groups[0])
    # losses at t >= m reach range 0 only through keys/values
    d, last = 8, m.config.n_layer - 1
    pre = f"blocks.{last}.copies.0."
    for n in ("attn_out.weight", "ln_2.weight", "mlp_in.weight", "mlp_out.bias"):
        assert torch.count_nonzero(g_late[pre + n]) == 0, n
    qkv = g_late[pre + "attn_qkv.weight"]
    assert torch.count_nonzero(qkv[:d]) == 0  # queries of range 0: unused
    assert torch.count_nonzero(qkv[d : 2 * d]) > 0 and torch.count_nonzero(qkv[2 * d :]) > 0  # K, V: read
    assert torch.count_nonzero(g_late[pre + "ln_1.weight"]) > 0
    if scope == "everything":
        assert torch.count_nonzero(g_late["head.0.ln_f.weight"]) == 0
        assert torch.count_nonzero(g_late["head.0.ln_f.bias"]) == 0
        assert torch.count_nonzero(g_late["embed.0.wte.weight"]) > 0  # through K/V of earlier blocks
        assert torch.count_nonzero(g_early["embed.1.wpe.weight"]) == 0


@pytest.mark.parametrize("scope", ["everything", "blocks"])
def test_myopic_untied_cuts_everything_across_the_boundary(scope):
    mv = 3
    m = make(regime="myopic+untied", untie_at=[mv], untie_scope=scope)
    groups = m.param_groups_by_range()
    early, late = _split_losses(m, tokens(), mv)
    g_late, g_early = grads(m, late), grads(m, early)
    assert all(torch.count_nonzero(g_late[n]) == 0 for n in groups[0])
    assert all(torch.count_nonzero(g_early[n]) == 0 for n in groups[1])
    assert all(torch.count_nonzero(g_late[n]) > 0 for n in groups[1] if not n.endswith("wpe.weight"))
    if scope == "blocks":
        assert torch.count_nonzero(g_late["embed.0.wte.weight"]) > 0


def test_untie_all_one_copy_per_position():
    m = make(regime="myopic+untied", untie_at="all", untie_scope="everything")
    groups = m.param_groups_by_range()
    assert len(m.ranges) == T and len(groups) == T + 1
    x = tokens()
    lam = position_losses(m(x), x).sum(0)
    for t in (0, 2, T - 2):
        g = grads(m, lam[t])
        for r in range(T):
            nz = sum(int(torch.count_nonzero(g[n])) for n in groups[r])
            assert (nz > 0) == (r == t), (t, r)


@pytest.mark.parametrize(
    "kw",
    [
        dict(untie_at=[2]),
        dict(untie_at=[2, 5], untie_scope="everything"),
        dict(untie_at="all", untie_scope="everything"),
    ],
)
def test_untied_replicated_equals_standard(kw):
    std = make(attn_impl="eager")
    cfg = GPTConfig(**{**std.config.to_dict(), "regime": "untied", **kw})
    unt = GPT.from_state_dict(std.state_dict(), cfg, replicate=True)
    x = tokens()
    assert torch.allclose(unt(x), std(x), rtol=0, atol=1e-13)
    # gradients summed over the copies equal the standard gradient (sharing = sum over ranges)
    g_std, g_unt = grads(std, std.loss(x)), grads(unt, unt.loss(x))
    summed = {n: torch.zeros_like(g) for n, g in g_std.items()}
    for n, g in g_unt.items():
        summed[_copy0(n)] += g
    for n in g_std:
        assert torch.allclose(summed[n], g_std[n], rtol=1e-9, atol=1e-14), n


def _copy0(name: str) -> str:
    return re.sub(r"^(embed|head)\.\d+\.", r"\1.0.", re.sub(r"\.copies\.\d+\.", ".copies.0.", name))


def test_untie_init_shared_vs_independent():
    shared = make(regime="untied", untie_at=[3], untie_scope="everything", untie_init="shared")
    indep = make(regime="untied", untie_at=[3], untie_scope="everything")
    for n, p in shared.named_parameters():
        assert torch.equal(p, dict(shared.named_parameters())[_copy0(n)])
    w0 = indep.blocks[0].copies[0].attn_qkv.weight
    w1 = indep.blocks[0].copies[1].attn_qkv.weight
    assert not torch.equal(w0, w1)


# ---------------------------------------------------------------------------------------------------
# losses, I/O, inputs


def test_position_losses_against_definition():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float64)
    x = tokens()
    out = position_losses(logits, x)
    assert out.shape == (B, T - 1)
    for b in range(B):
        for t in range(T - 1):
            ell = -(logits[b, t, x[b, t + 1]] - torch.logsumexp(logits[b, t], 0))
            assert torch.isclose(out[b, t], ell / (B * (T - 1)), rtol=1e-13)
    assert torch.isclose(out.sum(), F.cross_entropy(logits[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1)))
    w = torch.rand(B, T - 1, generator=g, dtype=torch.float64)
    assert torch.allclose(position_losses(logits, x, w), out * w * B * (T - 1))
    assert torch.isclose(reference_weights(B, T, dtype=torch.float64).sum(), torch.ones((), dtype=torch.float64))
    tg = torch.zeros(B, T - 1, dtype=torch.long)
    assert torch.allclose(
        position_losses(logits, x, targets=tg)[:, 0] * B * (T - 1), -torch.log_softmax(logits[:, 0], -1)[:, 0]
    )
    with pytest.raises(InputError):
        position_losses(logits, x, torch.ones(B, T))
    with pytest.raises(InputError):
        position_losses(logits[:, :1], x[:, :1])
    m = make()
    assert torch.allclose(m.loss(x), F.cross_entropy(m(x)[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1)))


def test_save_load_roundtrip(tmp_path):
    m = make(attn_impl="eager", tie_embeddings=False)
    x = tokens()
    path = tmp_path / "gpt.safetensors"
    m.save(path)
    assert torch.equal(GPT.load(path)(x), m(x))
    my = GPT.load(path, regime="myopic")
    assert my.is_myopic and torch.equal(my(x), m(x))
    with pytest.raises(CompatibilityError):
        GPT.from_state_dict(m.state_dict(), make(n_layer=3).config)
    with pytest.raises(CompatibilityError):
        GPT.from_state_dict({}, make(regime="untied", untie_at=[2]).config, replicate=True)


def test_input_validation():
    m = make()
    with pytest.raises(InputError, match="vocabulary"):
        m(torch.full((1, T), V))
    with pytest.raises(InputError, match="n_positions"):
        m(torch.zeros(1, T + 1, dtype=torch.long))
    with pytest.raises(InputError):
        m(torch.zeros(T, dtype=torch.long))
    with pytest.raises(InputError):
        m(torch.zeros(1, T))


def test_dropout_only_in_training():
    m = make(dropout=0.5, attn_impl="eager")
    ref = make(attn_impl="eager")
    x = tokens()
    m.eval()
    assert torch.equal(m(x), ref(x))
    m.train()
    assert not torch.allclose(m(x), ref(x))


# ---------------------------------------------------------------------------------------------------
# untied path: bit-identical to the previous implementation


def previous_forward(model: GPT, toks: torch.Tensor) -> torch.Tensor:
    """The earlier untied forward pass, kept verbatim as a reference: the residual stream is one
    (B, T, d) tensor, each block splits it per range and concatenates the range outputs again."""
    cfg = model.config
    t_len = toks.shape[1]
    spans = [(r, a, min(b, t_len)) for r, (a, b) in enumerate(model.ranges) if a < t_len]
    outer = spans if len(model.embed) > 1 else [(0, 0, t_len)]

    def cat(parts):
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def split(x, sp):
        return [x] if len(sp) == 1 else list(x.split([b - a for _, a, b in sp], dim=1))

    def attention(q, k, v):
        fut = model._future[:t_len, :t_len]
        return causal_self_attention(q, k, v, myopic=model.is_myopic, impl=model.attn_impl, future=fut)

    x = cat([model.embed[e](toks[:, a:b], a) for e, a, b in outer])
    for block in model.blocks:
        b_, t_, d = x.shape
        xs = split(x, spans)
        qkv = cat([block.copies[r].attn_qkv(block.copies[r].ln_1(xr)) for (r, _, _), xr in zip(spans, xs)])
        q, k, v = (z.view(b_, t_, cfg.n_head, d // cfg.n_head).transpose(1, 2) for z in qkv.split(d, dim=2))
        y = attention(q, k, v).transpose(1, 2).reshape(b_, t_, d)
        out = []
        for (r, _, _), xr, yr in zip(spans, xs, split(y, spans)):
            c = block.copies[r]
            h = xr + c.attn_out(yr)
            out.append(h + c.mlp_out(F.gelu(c.mlp_in(c.ln_2(h)), approximate="tanh")))
        x = cat(out)
    return cat([model._logits(e, xe) for (e, _, _), xe in zip(outer, split(x, outer))])


UNTIED_CASES = {
    "untied": dict(regime="untied", untie_at=[5]),
    "myopic+untied": dict(regime="myopic+untied", untie_at=[5]),
    "untied-3-ranges-everything": dict(regime="untied", untie_at=[3, 8], untie_scope="everything"),
    "untied-eager": dict(regime="untied", untie_at=[5], attn_impl="eager"),
    "myopic+untied-everything-own-head": dict(
        regime="myopic+untied", untie_at=[4], untie_scope="everything", tie_embeddings=False
    ),
    "untied-all": dict(regime="untied", untie_at="all"),
    "standard": dict(),
}


@pytest.mark.parametrize(
    "case, size",
    [(c, "small") for c in UNTIED_CASES] + [("untied", "benchmark"), ("myopic+untied", "benchmark")],
)
def test_training_bit_identical_to_previous_untied_path(case, size):
    """A few Adam steps (float32) give bit-identical logits, gradients and parameters with the model's
    forward and with `previous_forward`; "benchmark" is about the size of benchmarks/gpt_step.py."""
    n_pos, d, batch = (12, 32, 48) if size == "small" else (21, 128, 128)
    extra = dict(UNTIED_CASES[case])
    if size == "benchmark":
        extra["untie_at"] = [10]
    kw = dict(vocab_size=11, seq_len=n_pos, n_layer=2, d_model=d, n_head=4, dtype="float32", **extra)
    torch.manual_seed(3)
    fast = GPT(GPTConfig(**kw))
    ref = GPT.from_state_dict(fast.state_dict(), fast.config)
    g = torch.Generator().manual_seed(4)
    opts = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (fast, ref)]
    for step in range(4):
        x = torch.randint(0, 11, (batch, n_pos), generator=g)
        logits = [fast(x), previous_forward(ref, x)]
        assert torch.equal(logits[0], logits[1]), step
        for opt, lg in zip(opts, logits):
            opt.zero_grad(set_to_none=True)
            position_losses(lg, x).sum().backward()
        for (n, p), q in zip(fast.named_parameters(), ref.parameters()):
            assert torch.equal(p.grad, q.grad), (step, n)
        for opt in opts:
            opt.step()
    for (n, p), q in zip(fast.named_parameters(), ref.parameters()):
        assert torch.equal(p, q), n
    # the other entry points take the same path: loss, residual sites, forward_from
    x = torch.randint(0, 11, (8, n_pos), generator=g)
    logits, res = fast(x, return_residuals=True)
    assert torch.equal(logits, previous_forward(ref, x))
    assert torch.equal(fast.loss(x), position_losses(previous_forward(ref, x), x).sum())
    for k in range(fast.config.n_layer + 1):
        assert torch.equal(fast.forward_from(k, res[k]), logits), k
        assert torch.equal(fast(x, hooks={f"resid.{k}": lambda h, site: None}), logits), k
    short = x[:, :4]  # shorter than the first range (one span) for most cases
    assert torch.equal(fast(short), previous_forward(ref, short))


def test_the_untied_regime_defaults_to_the_papers_complete_second_model():
    cfg = GPTConfig(vocab_size=11, seq_len=8, n_layer=1, d_model=8, n_head=2, regime="untied", untie_at=[4])
    assert cfg.untie_scope == "everything"
    gpt = GPT(cfg)
    assert len(gpt.embed) == len(gpt.head) == len(gpt.blocks[0].copies) == 2
    blocks_only = GPT(GPTConfig(**{**cfg.to_dict(), "untie_scope": "blocks"}))
    assert len(blocks_only.embed) == len(blocks_only.head) == 1
