"""Combining the Othello experiment's unit records (stage 4 of :mod:`.othello`): per seed the stratified
integral and the learning curve, over seeds the intervals, the seven tests of the paper's pattern, the
positive control, the gates, the report and the results file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..progress import log
from ..runs import to_jsonable
from ..storage import atomic_write_json
from . import gates, inference
from .othello_analysis import across_seeds, learned_gate, learning_curve, seed_estimate
from .othello_report import write_report
from .othello_seeds import EXPERIMENT, train_key, train_record_path
from .othello_strata import check_key, check_record_path, mismatch_record_path, stratum_key, stratum_record_path
from .records import commits_of, read_unit_record
from .results import write_results

if TYPE_CHECKING:
    from .othello_config import OthelloConfig

MIN_SEEDS = 3  # a combined results file at the default path needs at least this many seeds


def _read_units(config: OthelloConfig, res_path: Path) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """Every seed's training and stratum records (checked against ``config``), and the commits behind
    them (refused when the units of one kind were made by different commits)."""
    per_seed: dict[int, dict[str, Any]] = {}
    commits: dict[str, set[str]] = {"train": set(), "stratum": set(), "mismatch": set()}
    units: dict[str, Any] = {}
    for seed in config.seeds:
        tr = read_unit_record(
            train_record_path(res_path, seed), experiment=EXPERIMENT, unit=f"train-{seed}", config_key=train_key(config)
        )
        commits["train"].add(str(tr.get("git_commit")))
        strata = {}
        for h in range(int(config.settings["strata"])):
            rec = read_unit_record(
                stratum_record_path(res_path, seed, h),
                experiment=EXPERIMENT,
                unit=f"stratum-{seed}-{h}",
                config_key=stratum_key(config),
            )
            commits["stratum"].add(str(rec.get("git_commit")))
            strata[h] = rec["values"]
        mismatch = None
        mpath = mismatch_record_path(res_path, seed)
        if mpath.is_file():  # optional: the positive control on the scale of each direction's mismatch
            mrec = read_unit_record(
                mpath, experiment=EXPERIMENT, unit=f"mismatch-{seed}", config_key=stratum_key(config)
            )
            commits["mismatch"].add(str(mrec.get("git_commit")))
            mismatch = mrec["values"]
        per_seed[seed] = {"train": tr["values"], "strata": strata, "mismatch": mismatch}
        units[f"seed-{seed}"] = {"train": commits_of(tr)}
    for kind, found in commits.items():
        if len(found) > 1:
            raise InputError(
                f"the {kind} records of {res_path.stem} were made by different commits ({', '.join(sorted(found))})",
                f"rerun the {kind} units at one commit (from one worktree), or combine only the units of one commit",
            )
    return per_seed, {**{k: sorted(v) for k, v in commits.items()}, "units": units}


def _curve_points(config: OthelloConfig, seed_values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every learning-curve point of one seed: the training's evaluations (no probes), the strata's grid
    and segment points (with probes), the final model (the training record's probes)."""
    pts: dict[int, dict[str, Any]] = {}
    for e in seed_values["train"]["curve_eval"]:
        pts[int(e["step"])] = {"step": int(e["step"]), "eval_loss": e["eval_loss"], "legal_acc": e["legal_acc"]}
    for v in seed_values["strata"].values():
        for p in (v["curve"]["grid"], v["curve"]["start"]):
            pts[int(p["step"])] = {**pts.get(int(p["step"]), {}), **p}
    S = int(config.settings["steps"])
    final = seed_values["train"]["train"]["trained"]["final_eval"]
    pts[S] = {
        "step": S,
        "eval_loss": final.get("eval_loss"),
        "legal_acc": final.get("legal_acc"),
        "probes": seed_values["train"]["probes"],
    }
    init = seed_values["train"]["initial_eval"]
    pts.setdefault(0, {"step": 0, "eval_loss": init.get("eval_loss"), "legal_acc": init.get("legal_acc")})
    pts[0]["probes"] = seed_values["train"]["initial_probes"]
    return [pts[s] for s in sorted(pts)]


def combine(
    config: OthelloConfig, out: Path, res_path: Path, command: str, *, results_given: bool = False
) -> dict[str, Any]:
    """The analysis over seeds from the unit records (module docstring, stage 4)."""
    from .othello_check import check_summary

    per_seed, commits = _read_units(config, res_path)
    L = int(config.settings["n_layer"])
    for v in per_seed.values():
        v["estimate"] = seed_estimate(v["strata"], L, v["mismatch"])
        v["curve"] = _curve_points(config, v)
    stats = across_seeds(per_seed, config.confidence)
    curve = learning_curve(per_seed, config.confidence, L)
    last = max(int(h) for h in range(int(config.settings["strata"])))
    learned, learned_info = learned_gate(per_seed, L, last)
    ctl, ctn = stats["control"], stats["control_normalised"]
    normalised_reading = (
        "; as fractions of each direction's own initial mismatch (reported, not the gate's reading): real "
        f"{_fmt(ctn['real']['mean'])} vs random {_fmt(ctn['random']['mean'])} (p {_fmt(ctn.get('p_t'))})"
        if ctn
        else ""
    )
    control = gates.control(
        bool(ctl["holds"]),
        f"real probes {_fmt(ctl.get('mean_diff'))} more combined influence than random directions "
        f"(paired over seeds, p {_fmt(ctl.get('p_t'))}){normalised_reading}",
    )
    held = sum(1 for t in stats["tests"].values() if t["holds"])
    detect = gates.detectable(len(config.seeds), negative=held < len(stats["tests"]))
    check = None
    for seed in config.seeds:
        path = check_record_path(res_path, seed)
        if path.is_file():
            rec = read_unit_record(path, experiment=EXPERIMENT, unit=f"check-{seed}", config_key=check_key(config))
            check = {"seed": seed, "commit": rec.get("git_commit"), **check_summary(rec["values"])}
            break
    quality = {
        "legal_acc": inference.mean_ci(
            [v["train"]["train"]["trained"]["final_eval"].get("legal_acc") for v in per_seed.values()],
            config.confidence,
            bounds=(0, 1),
        ),
        "eval_loss": inference.mean_ci(
            [v["train"]["train"]["trained"]["final_eval"].get("eval_loss") for v in per_seed.values()],
            config.confidence,
        ),
        "initial_legal_acc": curve["null"]["legal_acc"],
        "train_seconds": inference.mean_ci(
            [v["train"]["train"]["trained"]["seconds"] for v in per_seed.values()], config.confidence
        ),
    }
    attributed = sorted(
        [[v["strata"][h]["recorded"][0], v["strata"][h]["recorded"][1]] for v in per_seed.values() for h in v["strata"]]
    )
    carried = [
        v["strata"][h]["checks"]["carried_share"]["first_recorded"]
        for v in per_seed.values()
        for h in v["strata"]
        if (v["strata"][h]["checks"].get("carried_share") or {}).get("first_recorded") is not None
    ]
    s = config.settings
    scale = {
        "name": config.scale,
        "summary": {
            "paper": "the paper's configuration",
            "cpu": "a CPU-sized OthelloGPT",
            "ci": "a plumbing check, not a result",
        }[config.scale],
        "model": f"{L} layers, d = {s['d_model']}, {s['n_head']} heads",
        "training": f"Adam lr {config.lr}, batch {s['batch_size']}, {s['steps']} steps, a pool of "
        f"{s['othello_pool']} synthetic games",
        "eval": f"{s['eval_size']} held-out synthetic games",
        "attribution": f"Adam variant over all of training: {s['strata']} strata × ({s['burn_in']} burn-in + "
        f"{s['stratum_updates']} recorded updates), layers {config.attr_layers} × positions {sorted(s['positions'])}, "
        f"16 central cells, {config.random_directions} random directions per probe",
        "deviations": config.deviations(),
    }
    summary: dict[str, Any] = {
        "scale": scale,
        "quality": quality,
        "stats": stats,
        "curve": curve,
        "gates": [g.to_dict() for g in (learned, control, detect)],
        "learned": learned_info,
        "check": check,
        "attributed_updates": attributed,
        "sampled_fraction": config.sampled_fraction(),
        "carried_share_first_recorded": inference.mean_ci(carried, config.confidence) if carried else None,
        "per_seed": {str(k): {"estimate": v["estimate"], "curve": v["curve"]} for k, v in per_seed.items()},
        "seeds": config.seeds,
    }
    atomic_write_json(out / "experiment.json", to_jsonable(summary))
    write_report(summary, out)
    if not results_given and len(config.seeds) < MIN_SEEDS:
        log(f"[othello] {len(config.seeds)} seed(s) < {MIN_SEEDS}: no combined results file at the default path")
        return {"results_file": None, "summary": summary}
    write_results(
        res_path,
        experiment=EXPERIMENT,
        name=config.name,
        command=command,
        config={"experiment": to_jsonable(config), "ntp": config.ntp_config(config.seeds[0], initial=False).to_dict()},
        seeds=config.seeds,
        scale=scale,
        quality=quality,
        numbers={
            "influence": stats["influence"],
            "normalised": stats["normalised"],
            "normalised_random": stats["normalised_random"],
            "strata": stats["strata"],
            "curve": curve,
            "attributed_updates": attributed,
            "sampled_fraction": config.sampled_fraction(),
            "carried_share_first_recorded": summary["carried_share_first_recorded"],
            "check": check,
        },
        tests={
            "hypotheses": stats["tests"],
            "control": stats["control"],
            "control_per_type": stats["control_per_type"],
            "control_normalised": stats["control_normalised"],
            "learned": learned_info["test"],
            "gates": summary["gates"],
            "alpha": gates.ALPHA,
            "detectable_dz": gates.detectable_dz(len(config.seeds)),
        },
        data_hashes={f"seed-{k}": v["train"]["data_hashes"] for k, v in per_seed.items()},
        runs=[
            {
                "seed": k,
                "commits": commits["units"][f"seed-{k}"],
                "final_eval": v["train"]["train"]["trained"]["final_eval"],
                "train_seconds": v["train"]["train"]["trained"]["seconds"],
                "estimate": v["estimate"],
            }
            for k, v in per_seed.items()
        ],
        extra={
            "commits": {k: commits[k] for k in ("train", "stratum", "mismatch")},
            "sign": "positive influence moves the feature toward its final value; mismatch without a ½ (the paper's convention)",
            "pooling": "per seed: the stratified integral of every item (layer k < L, position, cell), averaged over "
            "items; k = L apart; CIs and tests over seeds",
        },
    )
    return {"results_file": str(res_path), "summary": summary}


def _fmt(x: Any) -> str:
    from .formatting import sig

    return sig(x, 2)
