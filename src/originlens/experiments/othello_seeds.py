"""One seed's training unit of the Othello experiment (:mod:`.othello`): the trained run and its
untrained-model null, and the values of its training record (:func:`train_unit`): held-out evaluation,
the learning curve's evaluations, the probes of the final and of the untrained model.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..runs import to_jsonable
from ..storage import read_json
from .records import record_path

if TYPE_CHECKING:
    from .othello_config import OthelloConfig


EXPERIMENT = "othello"  # the results directory and the experiment name of the unit records


def _train(cfg: OthelloConfig, seed: int, out: Path) -> dict[str, Any]:
    from ..train.ntp import Trainer

    res = {}
    for initial, d in ((False, out / "run"), (True, out / "initial")):
        t = time.time()
        r = Trainer(cfg.ntp_config(seed, initial=initial), d, resume=True).run()
        res["initial" if initial else "trained"] = {
            "final_eval": r.final_eval,
            "seconds": r.seconds,
            "wall_this_call": time.time() - t,
        }
    return res


def _probe_quality(run: Path, positions: list[int]) -> dict[str, Any]:
    from ..tasks.othello import CENTRAL_CELLS
    from ..train.ntp import load_probe_metrics, tracked_quality

    pm = load_probe_metrics(run / "probe_metrics.npz")
    return {str(k): tracked_quality(pm, [k], positions, CENTRAL_CELLS) for k in pm.layers if k > 0}


# ----------------------------------------------------------------------------------------------------
# the training unit: one seed's run, its untrained-model null and its learning curve


def train_record_path(results_path: str | Path, seed: int) -> Path:
    """Where the training record of ``seed`` lives: ``results/othello/othello-cpu/train-<seed>.json``."""
    return record_path(results_path, f"train-{int(seed)}")


def train_key(config: OthelloConfig) -> dict[str, Any]:
    """What must agree between training records: the trainer's configuration without the seed and the
    device, and the probed positions (the attribution's settings are not part of a training unit)."""
    ntp = {
        k: v
        for k, v in config.ntp_config(config.seeds[0], initial=False).to_dict().items()
        if k not in ("seed", "device")
    }
    return {"ntp": to_jsonable(ntp), "positions": sorted(config.settings["positions"])}


def eval_curve(run: Path) -> list[dict[str, Any]]:
    """Every held-out evaluation of a run (step, loss, legal-move accuracy), in step order."""
    import json

    path = run / "metrics.jsonl"
    out: dict[int, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("event") == "eval":
                out[int(rec["step"])] = {
                    "step": int(rec["step"]),
                    "eval_loss": rec.get("eval_loss"),
                    "legal_acc": rec.get("legal_acc"),
                }
    return [out[s] for s in sorted(out)]


def train_unit(config: OthelloConfig, seed: int, out: Path) -> dict[str, Any]:
    """Train one seed and its untrained-model null (resuming what exists) and return the training
    record's values: held-out eval of both, every evaluation of the run (the learning curve's legal-move
    accuracy), the probes of the final and the untrained model, the data hashes and the thread count
    (the attribution replays bit-exactly only with the training's)."""
    import torch

    d = Path(out)
    trained = _train(config, seed, d)
    positions = sorted(config.settings["positions"])
    return {
        "train": trained,
        "probes": _probe_quality(d / "run", positions),
        "initial_probes": _probe_quality(d / "initial", positions),
        "curve_eval": eval_curve(d / "run"),
        "initial_eval": trained["initial"]["final_eval"],
        "data_hashes": read_json(d / "run" / "environment.json").get("data_hashes", {}),
        "torch_threads": torch.get_num_threads(),
    }
