"""Residual-stream access to a Hugging Face model through the generic backend (nnsight) vs the hand-written
adapter, and optionally the TransformerLens 4 bridge, CPU.

Model: a random ``LlamaForCausalLM`` (``--d`` wide, ``--layers`` blocks, ``--vocab`` tokens, eager
attention, float32), one deep copy per backend (same weights; nnsight instruments the modules it wraps).
Batch: ``--batch`` random windows of ``--window`` tokens.  Three calls, each timed per backend:

* ``clean``     — logits only;
* ``residuals`` — logits and the L+1 residual streams (``return_residuals=True``);
* ``hook``      — logits with a hook adding a vector at ``resid.2`` (what Q(w) and steering do).

Backends: ``hf`` — :class:`originlens.lm.hf.HFAdapter` (torch forward pre-hooks); ``generic`` —
:class:`originlens.lm.generic.GenericHFAdapter` (an nnsight trace per call); ``tl4`` — TransformerLens'
``TransformerBridge`` (``run_with_cache`` / ``run_with_hooks`` on ``blocks.{k}.hook_resid_pre``) when
``transformer_lens.model_bridge`` imports (4.x; the 3.x releases that sae-lens pins ship an earlier version
of it; the version is printed).

Prints medians over ``--repeat`` interleaved repetitions of process CPU and wall time, the cost ratio of
each backend to ``hf`` (> 1: slower) and the largest absolute difference of its logits and residuals to
``hf``'s.  Usage: ``.venv/bin/python benchmarks/generic_backend.py [--d 128] [--layers 4] [--window 64]
[--batch 16] [--repeat 7] [--threads 1]``.  Caveat: shared CPU; the medians of interleaved runs are
steadier than single runs, but ratios near 1 are within noise.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import transformers
from _emit import emit  # benchmarks/_emit.py (the script's own folder is on sys.path)

from originlens.lm.generic import GenericHFAdapter
from originlens.lm.hf import HFAdapter

SITE = 2


def build(d: int, layers: int, vocab: int, window: int) -> Any:
    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=4 * d,
        num_hidden_layers=layers,
        num_attention_heads=max(1, d // 32),
        num_key_value_heads=max(1, d // 64),
        max_position_embeddings=window,
        bos_token_id=1,
        eos_token_id=2,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def tl4_bridge(model: Any, vocab: int) -> Any | None:
    """A TransformerLens 4 bridge around ``model`` (a word-level tokenizer written next to it), or None."""
    try:
        from tokenizers import Tokenizer, models
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:
        return None
    words = {f"t{i}": i for i in range(vocab)}
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(words, unk_token="t0")),
        unk_token="t0",
        bos_token="t1",
        eos_token="t2",
        pad_token="t0",
    )
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        return TransformerBridge.boot_transformers(tmp, hf_model=model, device="cpu", dtype=torch.float32)


def calls(backend: str, obj: Any, toks: torch.Tensor, v: torch.Tensor, L: int) -> dict[str, Callable[[], Any]]:
    """The three timed calls of one backend; ``residuals`` returns ``(logits, [L+1 streams])``."""
    if backend != "tl4":
        return {
            "clean": lambda: obj.run(toks),
            "residuals": lambda: obj.run(toks, return_residuals=True),
            "hook": lambda: obj.run(toks, hooks={SITE: lambda x, k: x + v}),
        }
    names = [f"blocks.{k}.hook_resid_pre" for k in range(L)] + [f"blocks.{L - 1}.hook_resid_post"]

    def residuals() -> tuple[torch.Tensor, list[torch.Tensor]]:
        logits, cache = obj.run_with_cache(toks, names_filter=lambda n: n in names)
        return logits, [cache[n] for n in names]

    return {
        "clean": lambda: obj(toks),
        "residuals": residuals,
        "hook": lambda: obj.run_with_hooks(toks, fwd_hooks=[(f"blocks.{SITE}.hook_resid_pre", lambda x, hook: x + v)]),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=7, help="timed repetitions (median reported)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = build(a.d, a.layers, a.vocab, a.window)
    backends: dict[str, Any] = {
        "hf": HFAdapter(copy.deepcopy(model)),
        "generic": GenericHFAdapter(copy.deepcopy(model)),
    }
    bridge = tl4_bridge(copy.deepcopy(model), a.vocab)
    if bridge is not None:
        backends["tl4"] = bridge
    toks = torch.randint(0, a.vocab, (a.batch, a.window), generator=torch.Generator().manual_seed(1))
    v = torch.randn(a.d, generator=torch.Generator().manual_seed(2))
    table = {b: calls(b, obj, toks, v, a.layers) for b, obj in backends.items()}
    wall: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    out: dict[tuple[str, str], Any] = {}
    with torch.no_grad():
        for b in table:  # warm-up
            for fn in table[b].values():
                fn()
        for _ in range(a.repeat):
            for task in ("clean", "residuals", "hook"):
                for b in table:
                    w0, c0 = time.perf_counter(), time.process_time()
                    out[b, task] = table[b][task]()
                    wall.setdefault((b, task), []).append(time.perf_counter() - w0)
                    cpu.setdefault((b, task), []).append(time.process_time() - c0)
    print(
        f"Llama d={a.d}, {a.layers} layers, V={a.vocab}, batch {a.batch} x {a.window} tokens, float32, eager "
        f"attention, {a.threads} thread(s), median of {a.repeat}"
    )
    if bridge is None:
        print("  (TransformerLens' bridge not importable here: tl4 skipped)")
    else:
        from importlib.metadata import version

        print(f"  tl4 = TransformerBridge of transformer-lens {version('transformer-lens')}")
    for task in ("clean", "residuals", "hook"):
        for b in table:
            c, w = statistics.median(cpu[b, task]), statistics.median(wall[b, task])
            c0, w0 = statistics.median(cpu["hf", task]), statistics.median(wall["hf", task])
            ref, got = out["hf", task], out[b, task]
            if task == "residuals":
                err = max(float((x - y).abs().max()) for x, y in zip([ref[0], *ref[1]], [got[0], *got[1]], strict=True))
            else:
                err = float((ref - got).abs().max())
            print(
                f"  {task:9s} {b:8s} {1e3 * c:8.1f} ms CPU {1e3 * w:8.1f} ms wall   "
                f"x{c / c0:5.2f} CPU x{w / w0:5.2f} wall vs hf   max |diff| {err:.1e}"
            )
    ratio = statistics.median(cpu["hf", "residuals"]) / statistics.median(cpu["generic", "residuals"])
    emit("generic_backend.hf_over_generic_residuals", ratio, cpu=True)


if __name__ == "__main__":
    main()
