"""OthelloGPT gradient-pathway experiment (arXiv 2603.14087, the Othello task) — driver.

Train a GPT on synthetic Othello, probe the board from the player-to-move's perspective at every layer,
attribute the training updates to direct / pre-cached / shared pathways at the 16 central cells
(Adam variant, replayed from checkpoints), and report the integrated influence per component for
NTP-useful and NTP-useless cells next to the paper's values; optionally evaluate the probes on
recorded games.  All the work is :func:`originlens.experiments.othello_run.run_othello_experiment`
(``originlens ntp experiment othello-run`` is the same with every option as a flag; the multi-seed
experiment with nulls and tests is ``originlens ntp experiment othello``).

    # CPU scale: 3 layers × 64, 500 steps of 64 games (measured: 35 min wall on 2 cores shared with
    # ~8 other jobs — 4.4 min training, 31 min attribution of which 65 % the influence JVPs)
    python examples/othello_pathways.py --out runs/othello
    # with recorded games (WTHOR .wtb or one transcript per line)
    python examples/othello_pathways.py --out runs/othello --human-games WTH_2001.wtb
    # the paper's model (6 × 256, batch 1024, 5000 steps, positions 4..56) on a GPU
    python examples/othello_pathways.py --out runs/othello-paper --paper --device cuda

``--greedy-standin N`` writes N games of a greedy player (each move maximises the discs flipped,
ties uniform) as a WTHOR file and evaluates the probes on them as if they were recorded games: a
*distribution-shift stand-in*, not human play, for machines without a game database.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from originlens.experiments import othello_run as exp

PAPER_MIDPOINTS = {
    ("direct", 2): 7.61,
    ("direct", 1): -0.97,
    ("precached", 2): -0.66,
    ("precached", 1): 1.80,
    ("shared", 2): 8.64,
    ("shared", 1): 6.42,
}


def greedy_games(n: int, seed: int) -> np.ndarray:
    """(n, 60) move tokens of a greedy player: the legal move flipping the most discs (ties uniform)."""
    from originlens.tasks.othello import (
        BITS,
        BLACK_START,
        PASS,
        WHITE_START,
        flips,
        legal_bitboard,
        popcount,
        unpack_bits,
    )

    rng = np.random.default_rng(seed)
    own = np.full(n, BLACK_START, dtype=np.uint64)
    opp = np.full(n, WHITE_START, dtype=np.uint64)
    out = np.full((n, 60), PASS, dtype=np.int64)
    for t in range(60):
        legal = unpack_bits(legal_bitboard(own, opp)).astype(bool)  # (n, 64)
        gain = np.full((n, 64), -1.0)
        for c in range(64):
            rows = legal[:, c]
            if rows.any():
                bit = np.where(rows, BITS[c], np.uint64(0))
                gain[rows, c] = popcount(flips(own, opp, bit))[rows] + rng.random(int(rows.sum())) * 0.5
        mv = np.where(legal.any(1), gain.argmax(1), PASS)
        out[:, t] = mv
        bit = np.where(mv != PASS, BITS[np.minimum(mv, 63)], np.uint64(0))
        fl = flips(own, opp, bit)
        own, opp = opp & ~fl, own | bit | fl
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="experiment directory")
    ap.add_argument("--paper", action="store_true", help="the paper's model and schedule (a GPU job)")
    ap.add_argument("--steps", type=int, help="training steps (default 500; --paper 5000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    ap.add_argument("--human-games", help="recorded games (WTHOR .wtb or one transcript per line)")
    ap.add_argument(
        "--greedy-standin",
        type=int,
        default=0,
        metavar="N",
        help="evaluate the probes on N greedy-player games (a stand-in, not human games)",
    )
    args = ap.parse_args(argv)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    given = dict(seed=args.seed, device=args.device, human_games=args.human_games)
    if args.steps is not None:
        given["steps"] = args.steps
    cfg = exp.OthelloExperimentConfig.paper(**given) if args.paper else exp.OthelloExperimentConfig(**given)
    if not args.paper and args.steps is None:
        cfg.steps = 500
    if args.greedy_standin:
        from originlens.tasks.othello_records import write_wthor

        path = Path(args.out) / "greedy-standin.wtb"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            write_wthor(path, greedy_games(args.greedy_standin, 2026))
        cfg.human_games = str(path)
    record = exp.run_othello_experiment(cfg, args.out)
    print("\n".join(exp.summary_lines(record)))
    by = {(s["component"], s["type"]): s for s in record["attribution"]["summary"]}
    print("\nsign agreement with the paper's integrated influence (bar midpoints; magnitudes not comparable):")
    for (c, ty), mid in PAPER_MIDPOINTS.items():
        s = by.get((c, ty))
        if s is not None:
            print(
                f"  {c:9s} {exp.TYPE_NAMES[ty]:11s} ours {s['mean']:+.4g}  paper {mid:+.2f}  "
                f"{'same sign' if np.sign(s['mean']) == np.sign(mid) else 'opposite sign'}"
            )
    if args.greedy_standin:
        print("(recorded-games rows above: greedy-engine stand-in games, NOT human games)")
    return 0


if __name__ == "__main__":
    from originlens.cli.main import run_script

    sys.exit(run_script(main, "othello_pathways.py"))
