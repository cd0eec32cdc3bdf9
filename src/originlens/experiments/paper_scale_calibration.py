"""The calibration of a budgeted paper-scale run (:mod:`originlens.experiments.paper_scale`): measured
throughput of its units on the device — one paper-config Conditioned Majority model, the paper's OthelloGPT
step (with its FLOP count and, on CUDA, the bf16-autocast step for the achieved-FLOP/s figure), and the
Adam-variant replay of a short throw-away Othello run per update, decomposed only and with influences.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .paper_scale_config import PaperScaleConfig

# published dense peaks (FLOP/s) of the accelerators this is meant for, by the name torch reports
PEAKS = {"H200": {"tf32": 494.7e12, "bf16": 989.5e12}, "H100": {"tf32": 494.7e12, "bf16": 989.5e12}}
# the smoke run's sizes (a CPU check in seconds, not a result)
SMOKE_TOY: dict[str, Any] = dict(steps=40, eval_size=256, train_size=2048, batch_size=32, d_model=16, n_head=2)
SMOKE_OTHELLO: dict[str, Any] = dict(
    steps=20, eval_size=128, othello_pool=600, batch_size=8, checkpoint_every=2, check_updates=12
)


# ------------------------------------------------------------------------------------------ calibration
def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_training(
    cfg: Any, run_dir: Path, first: int, deadline: float | None = None
) -> tuple[float, Any, float, float]:
    """Train ``cfg`` in ``run_dir`` (``deadline``: a ``time.time()`` after which it stops with
    :class:`~originlens.errors.BudgetExceeded`); seconds per update over updates first+1..steps (device
    synchronised at both ends), the trainer, the run's seconds besides its updates and its construction
    (the first updates, evaluation, probes, files), and the construction's seconds (data, model; the first
    in a process also pays imports)."""
    from ..train.ntp import Trainer

    t_build = time.perf_counter()
    tr = Trainer(cfg, run_dir, overwrite=True)
    tr.deadline = deadline
    marks: dict[int, float] = {}

    def mark(t: Any) -> None:
        if t.step in (first, cfg.steps):
            _sync(t.device)
            marks[t.step] = time.perf_counter()

    tr.add_callback("on_step_end", mark)
    t0 = time.perf_counter()
    tr.run()
    wall = time.perf_counter() - t0
    per_step = (marks[cfg.steps] - marks[first]) / (cfg.steps - first)
    return per_step, tr, max(0.0, wall - cfg.steps * per_step), t0 - t_build


def gpt_step_flops(n_layer: int, d_model: int, vocab: int, batch: int, seq: int, mlp_ratio: int = 4) -> float:
    """FLOPs of one training update of the GPT (forward + backward ≈ 3 × forward): 2 per multiply-add in
    the projections (4d² + 2·ratio·d² per token per layer), the attention scores and mixing (2·T·d per
    token per layer, causal: half of the full T × T) and the unembedding (d·|V| per token)."""
    per_token = n_layer * (2 * (4 + 2 * mlp_ratio) * d_model**2 + 2 * seq * d_model) + 2 * d_model * vocab
    return 3.0 * per_token * batch * seq


def calibrate(config: PaperScaleConfig, device: Any, work: Path, *, deadline: float | None = None) -> dict[str, Any]:
    """Measured throughput of the toy model (see the module docstring; Othello: :func:`calibrate_othello`);
    :class:`~originlens.errors.BudgetExceeded` if its training passes ``deadline`` (``time.time()``)."""
    from ..train.ntp import NTPConfig

    cal: dict[str, Any] = {"device": device.type}
    toy_over: dict[str, Any] = dict(SMOKE_TOY) if config.smoke else {}
    toy_steps = 30 if config.smoke else 300
    toy = NTPConfig(
        task="cond-majority",
        **{**toy_over, "steps": toy_steps},
        log_every=toy_steps,
        eval_every=0,
        probe_every=0,
        checkpoint_every=0,
        device=str(device),
        matmul_precision=config.matmul_precision,
    )
    s, _, other, setup = _timed_training(toy, work / "toy", toy_steps // 3, deadline)
    cal["toy_step_seconds"] = s
    cal["toy_other_seconds"] = other
    cal["toy_setup_seconds"] = setup
    cal["toy_steps_per_second"] = 1.0 / s
    return cal


def calibrate_othello(
    config: PaperScaleConfig, device: Any, work: Path, cal: dict[str, Any], *, attribution: bool = True
) -> None:
    """The Othello part of :func:`calibrate` (added to ``cal``): training steps, then (``attribution``) the
    replay of a short throw-away run with and without influences recorded."""
    import torch

    from .othello_config import OthelloConfig

    oth = OthelloConfig(
        scale="ci" if config.smoke else "paper",
        seeds=[0],
        device=str(device),
        matmul_precision=config.matmul_precision,
        overrides=dict(SMOKE_OTHELLO) if config.smoke else {},
    )
    ov = oth.ntp_config(0, initial=False)
    n = 6
    ocfg = ov.replace(
        steps=n,
        eval_size=256,
        probe_size=256,
        othello_pool=4096,
        eval_every=0,
        checkpoint_every=n // 2,
        log_every=1,
    )
    s, tr, other, setup = _timed_training(ocfg, work / "othello", 2)
    cal["othello_other_seconds"] = other
    cal["othello_setup_seconds"] = setup
    cal["othello_step_seconds"] = s
    cal["othello_steps_per_second"] = 1.0 / s
    gc = tr.gpt_config
    flops = gpt_step_flops(gc.n_layer, gc.d_model, gc.vocab_size, ocfg.batch_size, gc.seq_len - 1)
    cal["othello_step_flops"] = flops
    cal["othello_flops_per_second"] = flops / s
    # the step alone: ≥ 20 updates, nothing else in the window, fp32/tf32 and bf16 (and compiled on CUDA)
    alone = step_alone(tr, ocfg, compile_too=device.type == "cuda")
    cal["othello_step_alone"] = alone
    for rec in alone.values():
        if "seconds" in rec:
            rec["flops_per_second"] = flops / rec["seconds"]
    if not attribution:
        return
    _calibrate_replay(oth, config, device, work, cal, n)
    if device.type == "cuda":
        cal["othello_bf16_step_seconds"] = _bf16_step_seconds(tr, ocfg)
        cal["othello_bf16_flops_per_second"] = flops / cal["othello_bf16_step_seconds"]
        name = torch.cuda.get_device_name(device)
        peak = next((v for k, v in PEAKS.items() if k in name), None)
        if peak:
            cal["peak_flops"] = peak
            cal["othello_fraction_of_peak"] = {
                "tf32" if config.matmul_precision == "tf32" else "fp32_vs_tf32_peak": cal["othello_flops_per_second"]
                / peak["tf32"],
                "bf16_autocast": cal["othello_bf16_flops_per_second"] / peak["bf16"],
            }


def _calibrate_replay(oth: Any, config: PaperScaleConfig, device: Any, work: Path, cal: dict[str, Any], n: int) -> None:
    """The Adam-variant replay of the throw-away run's updates 1..n/2 (one recorded, the others decomposed
    only) at the paper's sites: seconds per decomposed and per recorded update, added to ``cal``."""
    from ..attribution.replay import attribute_run

    sites = [(k, i) for k in oth.attr_layers for i in oth.settings["positions"]]
    t0 = time.perf_counter()
    res = attribute_run(
        work / "othello",
        sites=sites,
        features="tracked",
        optimizer="adam",
        segment=(0, n // 2),  # updates 1..3: one recorded, two decomposed only
        types=True,
        out=work / "othello" / "attribution",
        random_directions=2,
        overwrite=True,
        steps=[2],
        replay_rtol=config.replay_rtol if device.type == "cuda" else 0.0,
    )
    total = time.perf_counter() - t0
    br = res.info.get("seconds_breakdown", {})
    n_rec, n_warm = 1, n // 2 - 1
    cal["attribution_seconds"] = total
    cal["calibration_sites"] = len(sites)
    cal["decomposed_update_seconds"] = br.get("warm_steps", 0.0) / max(1, n_warm)
    cal["recorded_update_seconds"] = br.get("recorded_steps", 0.0) / n_rec
    cal["attribution_fixed_seconds"] = max(0.0, total - br.get("warm_steps", 0.0) - br.get("recorded_steps", 0.0))
    cal["attribution_overhead_per_tracked_step"] = cal["recorded_update_seconds"] / cal["othello_step_seconds"]


STEP_WINDOW = 20  # updates timed by step_seconds (after its warm-up)


def step_seconds(
    model: Any,
    batches: list[Any],
    *,
    lr: float = 1e-3,
    precision: str = "fp32",
    compile: bool = False,
    warmup: int = 3,
) -> dict[str, Any]:
    """Seconds per training update of a copy of ``model`` — forward, backward, ``torch.optim.Adam`` —
    and nothing else: over the updates after ``warmup``, one per batch of ``batches`` (already on the
    device), with no checkpoint, log, loss read or token check inside the window (the device is
    synchronised at its two ends only).  ``precision``: ``"fp32"``, ``"tf32"`` (CUDA products in TF32) or
    ``"bf16"`` (autocast); ``compile``: the step's forward and backward through ``torch.compile`` (a
    ``{"error": ...}`` record where it does not compile).  Returns ``{"seconds", "updates", "precision",
    "compiled"}``."""
    import copy

    import torch

    if precision not in ("fp32", "tf32", "bf16"):
        raise ValueError(f"unknown precision {precision!r}")
    if len(batches) <= warmup:
        raise ValueError(f"{len(batches)} batches leave no update to time after a warm-up of {warmup}")
    m = copy.deepcopy(model).train()
    opt = torch.optim.Adam(m.parameters(), lr=lr)
    device = next(m.parameters()).device
    loss_of = m.loss
    if compile:
        try:
            loss_of = torch.compile(m.loss)
        except Exception as e:  # reported, not raised: compile is optional
            return {"error": f"{type(e).__name__}: {e}"[:300], "precision": precision, "compiled": True}
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    t0 = 0.0
    try:
        with m.trusted_tokens():
            for j, x in enumerate(batches):
                if j == warmup:
                    _sync(device)
                    t0 = time.perf_counter()
                with autocast:
                    loss = loss_of(x)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            _sync(device)
    except Exception as e:  # a compiled step that fails at its first call
        if not compile:
            raise
        return {"error": f"{type(e).__name__}: {e}"[:300], "precision": precision, "compiled": True}
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    n = len(batches) - warmup
    return {"seconds": (time.perf_counter() - t0) / n, "updates": n, "precision": precision, "compiled": compile}


def step_alone(tr: Any, cfg: Any, *, compile_too: bool) -> dict[str, Any]:
    """:func:`step_seconds` of the trainer's model on its own first batches, in fp32 (tf32 on CUDA) and
    bf16 in the same harness, and compiled where asked: ``{"<precision>[+compile]": record}``."""
    n = STEP_WINDOW + 3
    # the run's own batches (a partial Othello pool holds those rows only), cycled: a timing, not training
    own = [tr.data.device_batch(b, tr.device, tr.gpt_config.vocab_size) for b in range(min(n, int(cfg.steps)))]
    batches = [own[j % len(own)] for j in range(n)]
    base = "tf32" if tr.device.type == "cuda" and cfg.matmul_precision == "tf32" else "fp32"
    out = {}
    for precision in (base, "bf16"):
        out[precision] = step_seconds(tr.model, batches, lr=cfg.lr, precision=precision)
        if compile_too:
            out[f"{precision}+compile"] = step_seconds(tr.model, batches, lr=cfg.lr, precision=precision, compile=True)
    return out


def _bf16_step_seconds(tr: Any, cfg: Any, steps: int = 8) -> float:
    """Seconds per update of a copy of the trained Othello model under bf16 autocast (timing only)."""
    import copy

    import torch

    model = copy.deepcopy(tr.model).train()
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    x = tr.data.device_batch(0, tr.device, tr.gpt_config.vocab_size)
    t0 = 0.0
    for j in range(steps + 2):
        if j == 2:
            _sync(tr.device)
            t0 = time.perf_counter()
        with torch.autocast(tr.device.type, dtype=torch.bfloat16), model.trusted_tokens():
            loss = model.loss(x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    _sync(tr.device)
    return (time.perf_counter() - t0) / steps
