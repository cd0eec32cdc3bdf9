"""llama2.c checkpoints (Llama-2 architecture) as a readable PyTorch model, its tokenizer, and sampling.

* :func:`load_llama2c` reads the llama2.c "version 0" binary (header of 7 little-endian int32
  ``dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq_len``, then float32 arrays;
  a negative ``vocab_size`` means an unshared classifier stored at the end) with numpy only (no pickle),
  checking the file size against the header before building a :class:`Llama2cModel`.
* :class:`Llama2cModel`: pre-norm transformer with RMSNorm (eps 1e-5), rotary position embeddings
  (theta 10000) rotating adjacent pairs (0,1), (2,3), ... of each head, grouped-query attention
  (query head h reads key/value head ``h // (n_heads // n_kv_heads)``), SwiGLU MLP
  ``w2(silu(w1 x) * w3 x)``, and (usually) the token embedding reused as classifier.
* :class:`Llama2cTokenizer` (:mod:`.llama2c_tokenizer`, re-exported here): the llama2.c ``tokenizer.bin`` format and llama2.c's encoder (dummy space
  prefix, per-character lookup with UTF-8 byte fallback ``<0xNN>``, greedy highest-score pair merges).
* :func:`generate`: greedy or temperature sampling from BOS with a key/value cache, stopping when BOS
  is produced again (how llama2.c ends a story).

Caveats: only format version 0 (the legacy export used by the ``karpathy/tinyllamas`` files) is read;
the two RoPE tables stored in the file are skipped and recomputed.  No top-p sampling.  Everything runs
in float32 on the CPU unless the caller moves the model.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import CompatibilityError, ConfigError, InputError
from .llama2c_tokenizer import BOS_ID, Llama2cTokenizer

HEADER_INTS = 7
_LLAMA2C_V1_MAGIC = 0x616B3432  # "ak42": later llama2.c export versions start with this magic


# --------------------------------------------------------------------------------------------------
# Configuration and model
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Llama2cConfig:
    """Hyper-parameters of a llama2.c model (the checkpoint header plus the fixed constants)."""

    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    max_seq_len: int
    shared_classifier: bool = True
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_group(self) -> int:
        """Number of query heads sharing one key/value head."""
        return self.n_heads // self.n_kv_heads

    def validate(self) -> None:
        """Raise :class:`InputError` when the numbers cannot describe a llama2.c model."""
        names = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "max_seq_len")
        bad = [n for n in names if getattr(self, n) <= 0]
        problems = [f"non-positive {', '.join(bad)}"] if bad else []
        if not bad:
            if self.dim % self.n_heads:
                problems.append(f"dim {self.dim} not divisible by n_heads {self.n_heads}")
            elif self.head_dim % 2:
                problems.append(f"odd head_dim {self.head_dim} (rotary embeddings need pairs)")
            if self.n_heads % self.n_kv_heads:
                problems.append(f"n_heads {self.n_heads} not divisible by n_kv_heads {self.n_kv_heads}")
        if problems:
            raise InputError(
                f"invalid llama2.c header ({'; '.join(problems)})",
                "pass a llama2.c version-0 checkpoint (.bin written by export.py --version 0)",
            )


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_angles(positions: Tensor, head_dim: int, theta: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles, each ``(T, head_dim // 2)``.

    Pair j (components 2j, 2j+1 of a head) at position p is rotated by ``p * theta^(-2j / head_dim)``.
    """
    freqs = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions.to(torch.float64)[:, None] * freqs[None, :]
    return angles.cos().float(), angles.sin().float()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate adjacent pairs of ``x`` ``(B, H, T, head_dim)`` by the angles ``(T, head_dim // 2)``."""
    even, odd = x[..., 0::2], x[..., 1::2]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2)


class Attention(nn.Module):
    """Causal grouped-query self-attention with rotary embeddings on queries and keys."""

    def __init__(self, cfg: Llama2cConfig) -> None:
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, cache: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """``x`` ``(B, T, dim)`` at positions ``P..P+T-1`` where P is the cached length.

        Returns the output ``(B, T, dim)`` and the keys/values of positions ``0..P+T-1``, each
        ``(B, n_kv_heads, P+T, head_dim)``, for the next call.
        """
        cfg = self.cfg
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, cfg.n_heads, cfg.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:
            k = torch.cat((cache[0], k), dim=2)
            v = torch.cat((cache[1], v), dim=2)
        past = k.shape[2] - T
        # query head h reads key/value head h // kv_group
        k_rep = k.repeat_interleave(cfg.kv_group, dim=1)
        v_rep = v.repeat_interleave(cfg.kv_group, dim=1)
        scores = q @ k_rep.transpose(-1, -2) / math.sqrt(cfg.head_dim)  # (B, H, T, P+T)
        q_pos = torch.arange(past, past + T, device=x.device)[:, None]
        k_pos = torch.arange(past + T, device=x.device)[None, :]
        scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v_rep  # (B, H, T, head_dim)
        out = out.transpose(1, 2).reshape(B, T, cfg.n_heads * cfg.head_dim)
        return self.wo(out), (k, v)


class FeedForward(nn.Module):
    """SwiGLU MLP ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, cfg: Llama2cConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.w2 = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm block: ``h = x + attn(norm(x)); out = h + mlp(norm(h))``."""

    def __init__(self, cfg: Llama2cConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, cache: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        a, new_cache = self.attention(self.attention_norm(x), cos, sin, cache)
        h = x + a
        return h + self.feed_forward(self.ffn_norm(h)), new_cache


class KVCache:
    """Keys and values of the positions seen so far, one ``(k, v)`` pair per layer."""

    def __init__(self, n_layers: int) -> None:
        self.layers: list[tuple[Tensor, Tensor] | None] = [None] * n_layers

    def __len__(self) -> int:
        first = self.layers[0]
        return 0 if first is None else first[0].shape[2]


class Llama2cModel(nn.Module):
    """A llama2.c (Llama-2 architecture) language model.

    ``model(tokens)`` with ``tokens`` ``(B, T)`` int64 returns logits ``(B, T, V)``; with
    ``return_residuals=True`` it returns ``(logits, residuals)`` where ``residuals[k]`` ``(B, T, dim)``
    is the residual stream after k blocks: k = 0 is the token embedding, k = n_layers is the last
    block's output before the final norm.  These are the very tensors the next block consumes (not
    copies), so gradient hooks on them act on the model.
    """

    def __init__(self, cfg: Llama2cConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = None if cfg.shared_classifier else nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    @property
    def classifier_weight(self) -> Tensor:
        """Unembedding ``(V, dim)`` (the token embedding when shared)."""
        return self.tok_embeddings.weight if self.output is None else self.output.weight

    def forward(
        self, tokens: Tensor, *, return_residuals: bool = False, cache: KVCache | None = None
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Logits ``(B, T, V)`` for ``tokens`` ``(B, T)``.

        With ``cache``, the tokens are taken to follow the ``len(cache)`` cached positions and the
        cache is extended in place (incremental decoding).
        """
        B, T = tokens.shape
        start = len(cache) if cache is not None else 0
        if start + T > self.cfg.max_seq_len:
            raise ConfigError(
                f"sequence of {start + T} tokens exceeds max_seq_len {self.cfg.max_seq_len}",
                f"use at most {self.cfg.max_seq_len} tokens per sequence",
            )
        positions = torch.arange(start, start + T, device=tokens.device)
        cos, sin = rotary_angles(positions, self.cfg.head_dim, self.cfg.rope_theta)
        cos, sin = cos.to(tokens.device), sin.to(tokens.device)
        h = self.tok_embeddings(tokens)
        residuals = [h]
        for i, layer in enumerate(self.layers):
            h, layer_cache = layer(h, cos, sin, None if cache is None else cache.layers[i])
            if cache is not None:
                cache.layers[i] = layer_cache
            residuals.append(h)
        logits = self.norm(h) @ self.classifier_weight.T
        return (logits, residuals) if return_residuals else logits

    def attention_weights(self, layer: int) -> tuple[Tensor, Tensor]:
        """Query and key weights of ``layer``, split per head (views of the parameters, not copies).

        Returns ``W_q`` ``(n_heads, head_dim, dim)`` and ``W_k`` ``(n_kv_heads, head_dim, dim)``;
        row pairs (0,1), (2,3), ... of each head are the rotary pairs, and query head h uses key
        head ``h // (n_heads // n_kv_heads)``.
        """
        if not 0 <= layer < self.cfg.n_layers:
            raise ConfigError(f"layer {layer} out of range", f"use 0..{self.cfg.n_layers - 1}")
        att = cast(Block, self.layers[layer]).attention
        cfg = self.cfg
        return (
            att.wq.weight.view(cfg.n_heads, cfg.head_dim, cfg.dim),
            att.wk.weight.view(cfg.n_kv_heads, cfg.head_dim, cfg.dim),
        )


# --------------------------------------------------------------------------------------------------
# Checkpoint reader
# --------------------------------------------------------------------------------------------------


def _weight_shapes(cfg: Llama2cConfig) -> list[tuple[str, tuple[int, ...]]]:
    """The float32 arrays of a version-0 file, in file order (the two RoPE tables included)."""
    L, d, hd = cfg.n_layers, cfg.dim, cfg.head_dim
    kv = cfg.n_kv_heads * hd
    shapes = [
        ("tok_embeddings", (cfg.vocab_size, d)),
        ("attention_norm", (L, d)),
        ("wq", (L, cfg.n_heads * hd, d)),
        ("wk", (L, kv, d)),
        ("wv", (L, kv, d)),
        ("wo", (L, d, cfg.n_heads * hd)),
        ("ffn_norm", (L, d)),
        ("w1", (L, cfg.hidden_dim, d)),
        ("w2", (L, d, cfg.hidden_dim)),
        ("w3", (L, cfg.hidden_dim, d)),
        ("norm", (d,)),
        ("rope_cos_unused", (cfg.max_seq_len, hd // 2)),
        ("rope_sin_unused", (cfg.max_seq_len, hd // 2)),
    ]
    if not cfg.shared_classifier:
        shapes.append(("output", (cfg.vocab_size, d)))
    return shapes


def expected_llama2c_bytes(cfg: Llama2cConfig) -> int:
    """Size in bytes of a version-0 file for ``cfg``."""
    return 4 * HEADER_INTS + 4 * sum(int(np.prod(s)) for _, s in _weight_shapes(cfg))


def read_llama2c_header(path: str | os.PathLike) -> Llama2cConfig:
    """The configuration stored in the header of a version-0 file (validated)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(4 * HEADER_INTS)
    except OSError as exc:
        raise InputError(
            f"cannot read llama2.c checkpoint {path}: {exc.strerror or exc}", "check the --model path"
        ) from None
    if len(raw) < 4 * HEADER_INTS:
        raise InputError(
            f"llama2.c checkpoint {path} is truncated: expected at least "
            f"{4 * HEADER_INTS} header bytes, found {len(raw)}",
            "pass a complete llama2.c .bin file",
        )
    head = np.frombuffer(raw, dtype="<i4")
    if int(head[0]) == _LLAMA2C_V1_MAGIC:
        raise InputError(
            f"{path} is a llama2.c checkpoint of export version {int(head[1])}; only version 0 is supported",
            "re-export it with `python export.py --version 0` from llama2.c",
        )
    dim, hidden, layers, heads, kv_heads, vocab, seq = (int(v) for v in head)
    cfg = Llama2cConfig(dim, hidden, layers, heads, kv_heads, abs(vocab), seq, shared_classifier=vocab > 0)
    cfg.validate()
    return cfg


def load_llama2c(path: str | os.PathLike) -> Llama2cModel:
    """Read a llama2.c version-0 ``.bin`` checkpoint into a :class:`Llama2cModel` (eval mode, float32).

    Raises :class:`InputError` when the file is unreadable, has a bad header, or its size differs from
    what the header implies (truncated or foreign file).
    """
    path = Path(path)
    cfg = read_llama2c_header(path)
    expected = expected_llama2c_bytes(cfg)
    actual = path.stat().st_size
    if actual != expected:
        raise InputError(
            f"llama2.c checkpoint {path} has {actual} bytes but its header "
            f"(dim={cfg.dim}, n_layers={cfg.n_layers}, vocab_size={cfg.vocab_size}, ...) "
            f"implies {expected} bytes ({'truncated' if actual < expected else 'extra data'})",
            "re-download or re-export the checkpoint (llama2.c export version 0)",
        )
    data = np.memmap(path, dtype="<f4", mode="r", offset=4 * HEADER_INTS)
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for name, shape in _weight_shapes(cfg):
        n = int(np.prod(shape))
        arrays[name] = np.array(data[offset : offset + n], dtype=np.float32).reshape(shape)
        offset += n
    del data
    if not all(np.isfinite(a).all() for a in arrays.values()):
        raise InputError(
            f"llama2.c checkpoint {path} contains NaN or Inf weights", "re-download or re-export the checkpoint"
        )

    model = Llama2cModel(cfg)
    t = {k: torch.from_numpy(v) for k, v in arrays.items()}
    with torch.no_grad():
        model.tok_embeddings.weight.copy_(t["tok_embeddings"])
        for i, layer in enumerate(cast("Iterable[Block]", model.layers)):
            layer.attention_norm.weight.copy_(t["attention_norm"][i])
            layer.attention.wq.weight.copy_(t["wq"][i])
            layer.attention.wk.weight.copy_(t["wk"][i])
            layer.attention.wv.weight.copy_(t["wv"][i])
            layer.attention.wo.weight.copy_(t["wo"][i])
            layer.ffn_norm.weight.copy_(t["ffn_norm"][i])
            layer.feed_forward.w1.weight.copy_(t["w1"][i])
            layer.feed_forward.w2.weight.copy_(t["w2"][i])
            layer.feed_forward.w3.weight.copy_(t["w3"][i])
        model.norm.weight.copy_(t["norm"])
        if model.output is not None:
            model.output.weight.copy_(t["output"])
    return model.eval()


# --------------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def generate_tokens(
    model: Llama2cModel,
    prompt_ids: list[int],
    max_new_tokens: int = 256,
    *,
    greedy: bool = True,
    temperature: float = 1.0,
    seed: int = 0,
) -> list[int]:
    """Continue ``prompt_ids`` (which should start with BOS) by up to ``max_new_tokens`` tokens.

    Stops early when BOS is produced (not included in the result) or the context ``max_seq_len`` is
    full.  Greedy takes the first argmax; otherwise samples from ``softmax(logits / temperature)`` with
    a generator seeded by ``seed``.  Returns prompt plus generated ids.
    """
    if max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens={max_new_tokens} is negative", "use a value >= 0")
    if not greedy and not temperature > 0:
        raise ConfigError(f"temperature={temperature} must be > 0 for sampling", "use --greedy or T > 0")
    if not prompt_ids:
        raise ConfigError("empty prompt ids", "start the prompt with BOS (id 1)")
    if len(prompt_ids) > model.cfg.max_seq_len:
        raise ConfigError(
            f"prompt of {len(prompt_ids)} tokens exceeds max_seq_len {model.cfg.max_seq_len}", "shorten the prompt"
        )
    device = model.tok_embeddings.weight.device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    cache = KVCache(model.cfg.n_layers)
    ids = list(prompt_ids)
    step_input = torch.tensor([ids], dtype=torch.long, device=device)
    for _ in range(max_new_tokens):
        logits = model(step_input, cache=cache)[0, -1].float().cpu()
        if greedy:
            nxt = int(torch.argmax(logits))
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = int(torch.multinomial(probs, 1, generator=gen))
        if nxt == BOS_ID:
            break
        ids.append(nxt)
        if len(ids) >= model.cfg.max_seq_len:
            break
        step_input = torch.tensor([[nxt]], dtype=torch.long, device=device)
    return ids


def generate(
    model: Llama2cModel,
    tokenizer: Llama2cTokenizer,
    prompt: str = "",
    max_new_tokens: int = 256,
    greedy: bool = True,
    temperature: float = 1.0,
    seed: int = 0,
) -> str:
    """Text of the prompt and its continuation, starting from BOS (see :func:`generate_tokens`).

    With an empty prompt and ``max_new_tokens=256`` this matches llama2.c's ``run`` with 256 steps.
    """
    if tokenizer.vocab_size != model.cfg.vocab_size:
        raise CompatibilityError(
            f"tokenizer has {tokenizer.vocab_size} tokens, model {model.cfg.vocab_size}",
            "use the tokenizer that belongs to the model",
        )
    ids = generate_tokens(
        model, tokenizer.encode(prompt, bos=True), max_new_tokens, greedy=greedy, temperature=temperature, seed=seed
    )
    return tokenizer.decode(ids)
