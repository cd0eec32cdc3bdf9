"""Continuations of held-out stories by the trained models of the TinyStories experiment (:mod:`.language`):
:func:`generate` (greedy or sampled, no key/value cache) and :func:`continuations` (the first
``config.prompts`` held-out stories, the model of the first seed of every regime).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .language_runs import run_dirs

if TYPE_CHECKING:
    from .language_config import LanguageExperimentConfig


def generate(
    model: Any, prompt_ids: Sequence[int], max_new_tokens: int, *, temperature: float = 0.0, generator: Any = None
) -> list[int]:
    """Continue ``prompt_ids`` with a :class:`~originlens.models.GPT`: greedy (``temperature=0``, first
    argmax) or sampled from ``softmax(logits / temperature)`` (float64) with the torch ``generator``.
    The context is cropped to the model's last ``seq_len`` tokens; no key/value cache."""
    import torch

    if not prompt_ids:
        raise ConfigError("an empty prompt: nothing to condition on", "pass at least one prompt token")
    if temperature < 0:
        raise ConfigError(f"temperature={temperature} must be ≥ 0", "use 0 (greedy) or 1")
    dev = next(model.parameters()).device
    ctx = int(model.config.seq_len)
    toks = list(int(t) for t in prompt_ids)
    model.eval()
    with torch.no_grad():
        for _ in range(int(max_new_tokens)):
            x = torch.tensor([toks[-ctx:]], dtype=torch.long, device=dev)
            logits = model(x)[0, -1].double().cpu()
            if temperature == 0:
                nxt = int(logits.argmax())
            else:
                nxt = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)[0])
            toks.append(nxt)
    return toks[len(prompt_ids) :]


def continuations(config: LanguageExperimentConfig, out: Path) -> list[dict[str, Any]]:
    """Greedy and sampled continuations of the first ``config.prompts`` held-out stories by the model of
    the first seed of every regime (see the module docstring)."""
    import torch

    from ..models import GPT

    if not config.prompts:
        return []
    task = config.make_task()
    T = int(task.seq_len)
    n_prompt, n_new = T // 2, T - T // 2
    held = task.split[1][: config.prompts]
    tok = task.tokenizer
    models = {
        r: GPT.load(run_dirs(out, r, config.seeds[0])[0] / "model.safetensors").to("cpu").eval() for r in config.regimes
    }
    items = []
    for j, s in enumerate(held):
        ids = [int(t) for t in task.data.story(int(s))[:n_prompt]]
        item = {
            "heldout_index": j,
            "prompt": tok.decode(ids),
            "prompt_tokens": len(ids),
            "new_tokens": n_new,
            "seed": config.seeds[0],
            "continuations": {},
        }
        for regime, model in models.items():
            gen = torch.Generator(device="cpu").manual_seed(int(config.sample_seed) + j)
            item["continuations"][regime] = {
                "greedy": tok.decode(generate(model, ids, n_new, temperature=0.0)),
                "sampled": tok.decode(generate(model, ids, n_new, temperature=1.0, generator=gen)),
            }
        items.append(item)
    return items
