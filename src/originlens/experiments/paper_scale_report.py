"""What a budgeted paper-scale run (:mod:`originlens.experiments.paper_scale`) reports: the printed summary
table, its section of ``docs/results.md``, the per-experiment lines of its record and the archive of its
run directories.
"""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path
from typing import Any


def toy_line(summary: dict[str, Any]) -> dict[str, Any]:
    per = summary["per_regime"]
    return {
        "useless_r": {r: per[r]["useless_r"]["mean"] for r in per},
        "eval_loss": {r: per[r]["eval_loss"]["mean"] for r in per},
        "orderings_holding": [k for k, v in summary["orderings"].items() if v["holds"]],
        "orderings_failing": [k for k, v in summary["orderings"].items() if not v["holds"]],
    }


def othello_line(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: summary[k] for k in ("verdict",) if k in summary} | {
        "legal_acc": summary.get("quality", {}).get("legal_acc", {}).get("mean"),
        "eval_loss": summary.get("quality", {}).get("eval_loss", {}).get("mean"),
    }


ARCHIVE_SKIP = (".safetensors", ".npy", ".lock")
ARCHIVE_MAX_FILE = 4 << 20


def archive_runs(out: Path) -> Path:
    """``OUT/paper-scale-runs.tar.gz``: every file under the run directories except checkpoints, models,
    pools and files over 4 MiB (configs, metrics, environments, reports, attribution tables stay)."""
    path = out / "paper-scale-runs.tar.gz"
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for p in sorted(out.rglob("*")):
            if (
                p.is_file()
                and not p.is_symlink()
                and p.suffix not in ARCHIVE_SKIP
                and p != tmp
                and p != path
                and p.stat().st_size <= ARCHIVE_MAX_FILE
            ):
                tar.add(p, arcname=str(p.relative_to(out)))
    shutil.move(tmp, path)
    return path


def summary_table(record: dict[str, Any]) -> str:
    """The printed summary: calibration, what ran, each claim's verdict with the paper's number beside ours."""
    cal = record.get("calibration", {})
    lines = [
        f"paper-scale run on {record['device_name']} ({record['wall_seconds']:.0f} s of "
        f"{record['budget_seconds']:.0f} s)",
        f"  one Conditioned Majority model: {cal.get('toy_steps_per_second', float('nan')):.0f} steps/s; "
        f"Othello paper config: {cal.get('othello_steps_per_second', float('nan')):.2f} steps/s, "
        f"{cal.get('othello_flops_per_second', float('nan')) / 1e12:.1f} TFLOP/s; attributed update "
        f"{cal.get('attribution_overhead_per_tracked_step', float('nan')):.1f}× a training step",
    ]
    if "toy_throughput" in record:
        tt = record["toy_throughput"]
        lines.append(
            f"  toy grids: {tt['seconds_per_run']:.1f} s per run, {tt['models_steps_per_second']:.0f} model-steps/s "
            f"with {tt['jobs']} processes sharing the device"
        )
    lines.append(f"  {'claim':<20} {'verdict':<15} {'paper':<40} ours")
    for key, v in record.get("verdicts", {}).items():
        lines.append(f"  {key:<20} {v['verdict']:<15} {v['paper'][:40]:<40} {v['ours']}")
    for s in record.get("skipped", []):
        lines.append(f"  skipped: {s}")
    for e in record.get("errors", []):
        lines.append(f"  ERROR: {e}")
    return "\n".join(lines)


def render_section(key: str, rec: dict[str, Any]) -> list[str]:
    """The ``docs/results.md`` section of a paper-scale record: what ran, the measured throughput, the
    plan and what was skipped, the verdicts it reached."""
    cal = rec["numbers"].get("calibration", {})

    def f(v: Any, fmt: str) -> str:
        return "—" if v is None else format(v, fmt)

    def tera(v: Any) -> float | None:
        return None if v is None else v / 1e12

    out = [
        f"### {rec['name']} (`results/{key}.json`)",
        "",
        f"- command: `{rec['command']}`",
        f"- commit `{rec['git_commit']}`, {rec['created']}, {rec.get('device_name', '?')}, "
        f"{rec['machine']['cpus']} CPUs; torch {rec['versions'].get('torch', '?')}; "
        f"{rec.get('jobs', '?')} processes; deterministic kernels: {rec.get('deterministic_kernels')}",
        f"- {rec['scale']['summary']}; wall {f(rec.get('wall_seconds'), '.0f')} s of a "
        f"{f(rec.get('budget_seconds'), '.0f')} s budget",
        "",
        "| measured | value |",
        "|---|---|",
        f"| one Conditioned Majority model (paper config) | {f(cal.get('toy_steps_per_second'), '.0f')} steps/s |",
        f"| OthelloGPT, paper config (batch 1,024) | {f(cal.get('othello_steps_per_second'), '.1f')} steps/s, "
        f"{f(tera(cal.get('othello_flops_per_second')), '.1f')} TFLOP/s |",
        f"| the same under bf16 autocast (timing only) | "
        f"{f(tera(cal.get('othello_bf16_flops_per_second')), '.1f')} TFLOP/s |",
        f"| Adam-variant replay, decomposed update | {f(cal.get('decomposed_update_seconds'), '.2f')} s |",
        f"| … with influences recorded | {f(cal.get('recorded_update_seconds'), '.2f')} s "
        f"({f(cal.get('attribution_overhead_per_tracked_step'), '.0f')} training steps) |",
    ]
    frac = cal.get("othello_fraction_of_peak") or {}
    if frac:
        out.append(
            "| fraction of the dense peak | " + ", ".join(f"{k} {100 * v:.1f} %" for k, v in frac.items()) + " |"
        )
    tt = rec["numbers"].get("toy_throughput")
    if tt:
        out.append(
            f"| toy grids, {tt['jobs']} processes sharing the device | {tt['models_steps_per_second']:.0f} "
            f"model-steps/s ({tt['seconds_per_run']:.1f} s per run) |"
        )
    out += [""]
    for s in rec.get("skipped", []):
        out.append(f"- skipped: {s}")
    for e in rec.get("errors", []):
        out.append(f"- error: {e}")
    for k, v in rec.get("verdicts", {}).items():
        out.append(f"- {k}: **{v['verdict']}** ({v['results']})")
    if rec.get("provenance_note"):
        out.append(f"- note: {rec['provenance_note']}")
    return out + [""]
