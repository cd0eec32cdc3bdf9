"""Config parsing under hostile input: ``originlens.config.from_mapping`` and every
configuration dataclass built from a mapping.

Properties: an arbitrary JSON-like mapping gives a configuration or a ConfigError (never another
exception); unknown keys are named with a ``difflib`` suggestion; wrong types name the key, the expected
and the received type; out-of-range values are refused by the dataclass's own validation; a written
configuration reads back equal (config.json round trip).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from originlens.config import from_mapping, load_config
from originlens.demo import DemoConfig
from originlens.errors import ConfigError, InputError, OriginlensError
from originlens.experiments.leading_analysis import AnalysisConfig
from originlens.lm.llama2c import Llama2cConfig
from originlens.models.assoc import AssocConfig
from originlens.models.gpt import REGIMES, GPTConfig
from originlens.runs import to_jsonable
from originlens.sae.train import SAETrainConfig
from originlens.train.assoc import AssocTrainConfig
from originlens.train.grid import GridConfig
from originlens.train.ntp import NTPConfig


def _validated(cls, validate: bool = False):
    def build(d):
        obj = from_mapping(cls, d, where="config.json")
        if validate:
            obj.validate()
        return obj

    return build


# every configuration dataclass of the package and how it is built from a mapping
BUILDERS = {
    "NTPConfig": (NTPConfig, lambda d: NTPConfig.from_dict(d, where="config.json")),
    "GPTConfig": (GPTConfig, lambda d: GPTConfig.from_dict(d, where="config.json")),
    "AssocTrainConfig": (AssocTrainConfig, _validated(AssocTrainConfig, validate=True)),
    "AssocConfig": (AssocConfig, _validated(AssocConfig, validate=True)),
    "Llama2cConfig": (Llama2cConfig, _validated(Llama2cConfig, validate=True)),
    "GridConfig": (GridConfig, _validated(GridConfig)),
    "DemoConfig": (DemoConfig, _validated(DemoConfig)),
    "AnalysisConfig": (AnalysisConfig, _validated(AnalysisConfig)),
    "SAETrainConfig": (SAETrainConfig, _validated(SAETrainConfig, validate=True)),
}

PLAUSIBLE_STRINGS = [
    "standard",
    "myopic",
    "untied",
    "myopic+untied",
    "majority",
    "cond-majority",
    "othello",
    "language",
    "all",
    "tracked",
    "float32",
    "float64",
    "bfloat16",
    "cpu",
    "cuda",
    "sdpa",
    "eager",
    "zero",
    "gaussian",
    "auto",
    "paths",
    "first_batch",
    "full",
    "none",
    "blocks",
    "everything",
    "",
    "x",
]
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 70),
    st.integers(),
    st.floats(),
    st.sampled_from(PLAUSIBLE_STRINGS),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6,
)


def field_names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init]


@st.composite
def mappings(draw, cls):
    names = field_names(cls)
    keys = draw(
        st.lists(
            st.one_of(st.sampled_from(names), st.sampled_from(names), st.text(max_size=10)), max_size=8, unique=True
        )
    )
    return {k: draw(json_values) for k in keys}


def _run(builder, d):
    try:
        builder(d)
    except OriginlensError:
        pass


@pytest.mark.parametrize("name", sorted(BUILDERS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_arbitrary_mapping_gives_config_or_config_error(name, data):
    cls, builder = BUILDERS[name]
    d = data.draw(mappings(cls))
    _run(builder, d)  # anything but an OriginlensError fails the test


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_sae_cfg_json_gives_config_or_clear_error(data):
    """SAELens cfg.json has its own reader (unknown keys are kept in ``extra`` by design, for round trips)."""
    from originlens.sae.format import config_from_dict
    from originlens.sae.model import SAEConfig

    d = data.draw(st.one_of(mappings(SAEConfig), json_values))
    try:
        config_from_dict(d)
    except OriginlensError:
        pass


@pytest.mark.parametrize("name", sorted(BUILDERS))
@given(d=st.one_of(json_scalars, st.lists(json_scalars, max_size=3)))
@settings(max_examples=15, deadline=None)
def test_non_mapping_is_config_error(name, d):
    cls, builder = BUILDERS[name]
    with pytest.raises(ConfigError, match="must be a mapping"):
        builder(d)


@st.composite
def typos(draw, cls):
    """(original field, one-edit typo that is not a field)."""
    names = [n for n in field_names(cls) if len(n) >= 4]
    orig = draw(st.sampled_from(names))
    i = draw(st.integers(0, len(orig) - 1))
    c = draw(st.sampled_from("abcdefghijklmnopqrstuvwxyz_"))
    kind = draw(st.sampled_from(["delete", "replace", "insert", "swap"]))
    if kind == "delete":
        typo = orig[:i] + orig[i + 1 :]
    elif kind == "replace":
        typo = orig[:i] + c + orig[i + 1 :]
    elif kind == "insert":
        typo = orig[:i] + c + orig[i:]
    else:
        j = min(i + 1, len(orig) - 1)
        typo = orig[:i] + orig[j] + orig[i] + orig[j + 1 :] if j > i else orig[:i] + c
    assume(typo not in field_names(cls) and typo)
    return orig, typo


@pytest.mark.parametrize("name", sorted(BUILDERS))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_unknown_key_is_named_with_a_suggestion(name, data):
    cls, builder = BUILDERS[name]
    orig, typo = data.draw(typos(cls))
    with pytest.raises(ConfigError) as ei:
        builder({typo: 1})
    msg = str(ei.value)
    assert f"unknown key {typo!r} in config.json" in msg
    m = [f for f in field_names(cls) if f"did you mean {f!r}?" in msg]
    assert len(m) == 1, msg  # one suggestion, a real field ...
    ratio = difflib.SequenceMatcher(None, typo, m[0]).ratio()
    assert ratio >= difflib.SequenceMatcher(None, typo, orig).ratio() - 1e-12, (typo, orig, m[0])  # ... the closest
    assert "valid keys" in msg


def test_message_of_the_issue():
    @dataclasses.dataclass
    class Train:
        learning_rate: float = 1e-3
        steps: int = 10

    with pytest.raises(ConfigError) as ei:
        from_mapping(Train, {"lerning_rate": 0.1}, where="config.json")
    assert str(ei.value).startswith("unknown key 'lerning_rate' in config.json; did you mean 'learning_rate'?")
    with pytest.raises(
        ConfigError,
        match=r"unknown key 'zzz' in config.json — fix: valid keys of Train: "
        r"learning_rate, steps",
    ):
        from_mapping(Train, {"zzz": 1}, where="config.json")


SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean"}
WRONG = {
    int: [1.5, "3", True, None, [1], {"a": 1}],
    float: ["0.1", True, None, [0.1]],
    str: [1, 2.5, True, None, ["a"], {"a": "b"}],
    bool: [1, 0, "true", None, 1.0],
}
GOT = {
    float: "number",
    str: "string",
    bool: "boolean",
    type(None): "null",
    list: "list",
    dict: "mapping",
    int: "integer",
}


REQUIRED = {
    "GPTConfig": dict(vocab_size=5, seq_len=4, n_layer=1, d_model=8, n_head=2),
    "AssocConfig": dict(vocab_size=5, seq_len=4),
    "Llama2cConfig": dict(dim=8, hidden_dim=16, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=5, max_seq_len=4),
}


def scalar_fields(cls) -> list[tuple[str, type, bool]]:
    """(field, scalar type, optional) for fields typed T or T | None with T in int/float/str/bool."""
    out = []
    for f, h in typing.get_type_hints(cls).items():
        if typing.get_origin(h) in (typing.Union, types.UnionType):
            args = set(typing.get_args(h))
        elif typing.get_origin(h) is None:
            args = {h}
        else:
            continue
        optional = type(None) in args
        rest = args - {type(None)}
        if len(rest) == 1 and next(iter(rest)) in SCALARS and f in field_names(cls):
            out.append((f, next(iter(rest)), optional))
    return out


@pytest.mark.parametrize("name", sorted(BUILDERS))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_wrong_type_names_key_expected_and_received(name, data):
    cls, builder = BUILDERS[name]
    fields = scalar_fields(cls)
    assume(fields)
    f, typ, optional = data.draw(st.sampled_from(fields))
    value = data.draw(st.sampled_from([v for v in WRONG[typ] if not (optional and v is None)]))
    with pytest.raises(ConfigError) as ei:
        builder({**REQUIRED.get(name, {}), f: value})
    msg = str(ei.value)
    assert f"key {f!r}" in msg and SCALARS[typ] in msg and GOT[type(value)] in msg, msg


def test_nested_element_types_are_checked():
    with pytest.raises(ConfigError, match=r"key 'untie_at\[1\]' expects integer, got string 'a'"):
        NTPConfig.from_dict({"task": "majority", "regime": "untied", "untie_at": [3, "a"]})
    with pytest.raises(ConfigError, match=r"key 'betas' expects list of 2 \(number, number\), got list"):
        NTPConfig.from_dict({"betas": [0.9]})
    with pytest.raises(ConfigError, match=r"key 'seeds\[0\]' expects integer"):
        from_mapping(GridConfig, {"seeds": ["0"]})
    assert NTPConfig.from_dict({"betas": [0.8, 0.9]}).betas == (0.8, 0.9)  # JSON list → tuple


@pytest.mark.parametrize(
    "d, key",
    [
        ({"lr": 0}, "lr"),
        ({"lr": -1e-3}, "lr"),
        ({"lr": math.nan}, "lr"),
        ({"lr": math.inf}, "lr"),
        ({"steps": -1}, "steps"),
        ({"batch_size": 0}, "batch_size"),
        ({"betas": [0.9, 1.0]}, "betas"),
        ({"d_model": 30, "n_head": 4}, "divisible"),
        ({"eval_size": 10, "probe_size": 20}, "probe_size"),
        ({"dtype": "float16"}, "float16"),
        ({"task": "parity"}, "parity"),
        ({"probe_positions": [0]}, "probe_positions"),
    ],
)
def test_out_of_range_values_are_refused_by_the_dataclass(d, key):
    with pytest.raises(ConfigError, match=key):
        NTPConfig.from_dict(d)


@pytest.mark.parametrize(
    "cls, d, key",
    [
        (GPTConfig, dict(vocab_size=0, seq_len=4, n_layer=1, d_model=8, n_head=2), "vocab_size"),
        (GPTConfig, dict(vocab_size=5, seq_len=4, n_layer=1, d_model=8, n_head=2, dropout=1.5), "dropout"),
        (
            GPTConfig,
            dict(vocab_size=5, seq_len=4, n_layer=1, d_model=8, n_head=2, regime="untied", untie_at=[9]),
            "untie_at",
        ),
        (AssocTrainConfig, dict(steps=0), "steps"),
        (AssocTrainConfig, dict(steps=3, lr=-1), "learning rate"),
        (AssocTrainConfig, dict(steps=3, epochs=2), "exactly one"),
        (GridConfig, dict(confidence=1.5), "confidence"),
        (GridConfig, dict(overrides={"lerning": 1}), "lerning"),
    ],
)
def test_out_of_range_values_other_configs(cls, d, key):
    with pytest.raises(ConfigError, match=key):
        obj = from_mapping(cls, d)
        if hasattr(obj, "validate"):
            obj.validate()


def test_missing_required_keys_are_named():
    with pytest.raises(ConfigError, match="lacks required key\\(s\\) 'vocab_size', 'seq_len'"):
        GPTConfig.from_dict({"n_layer": 1, "d_model": 8, "n_head": 2})


@st.composite
def ntp_configs(draw):
    task = draw(st.sampled_from(["majority", "cond-majority", "othello"]))
    regime = draw(st.sampled_from(REGIMES))
    heads = draw(st.integers(1, 4))
    kw = dict(
        task=task,
        regime=regime,
        seed=draw(st.integers(0, 2**31)),
        n_head=heads,
        d_model=heads * draw(st.integers(1, 8)),
        n_layer=draw(st.integers(1, 3)),
        lr=draw(st.floats(1e-6, 1.0)),
        betas=(draw(st.floats(0, 0.99)), draw(st.floats(0, 0.999))),
        steps=draw(st.integers(0, 10**6)),
        eval_seed=draw(st.none() | st.integers(0, 5)),
        probe_positions=draw(st.sampled_from(["all", "tracked", [1, 2]])),
    )
    if "untied" in regime and task == "othello":
        kw["untie_at"] = draw(st.sampled_from([[5], [3, 20], "all"]))
    return NTPConfig(**kw)


@settings(max_examples=40, deadline=None)
@given(cfg=ntp_configs())
def test_ntp_config_json_round_trip(cfg):
    back = NTPConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back.to_dict() == cfg.to_dict() and back.identity() == cfg.identity()
    g = cfg.gpt_config(7, 21) if cfg.task != "othello" else cfg.gpt_config(61, 61)
    assert GPTConfig.from_dict(json.loads(json.dumps(g.to_dict()))) == g


@settings(max_examples=30, deadline=None)
@given(
    steps=st.integers(1, 10**6),
    bs=st.none() | st.integers(1, 4096),
    at=st.lists(st.integers(1, 99), max_size=3),
    lr=st.floats(1e-6, 10),
)
def test_assoc_train_config_json_round_trip(steps, bs, at, lr):
    cfg = AssocTrainConfig(steps=steps, batch_size=bs, checkpoint_at=tuple(at), lr=lr)
    back = from_mapping(AssocTrainConfig, json.loads(json.dumps(to_jsonable(cfg))))
    assert back == cfg and isinstance(back.checkpoint_at, tuple)


def test_load_config_file_errors(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_config(NTPConfig, p)
    p.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(NTPConfig, p)
    p.write_text(json.dumps({"task": "majority", "stpes": 5}))
    with pytest.raises(ConfigError, match=r"unknown key 'stpes' in .*config.json; did you mean 'steps'\?"):
        load_config(NTPConfig, p)
    p.write_text(json.dumps({"task": "majority", "steps": 5}))
    assert load_config(NTPConfig, p).steps == 5
