"""The pathways paper's synthetic-world experiments at the paper's configuration within a time budget on one
GPU (``originlens.experiments.paper_scale``; docs/reproduce.md, "On your own GPU").

Runs from a checkout without installing: ``PYTHONPATH=src python3 scripts/paper_scale.py --budget-minutes 8``
(CUDA PyTorch, numpy, scipy, safetensors, pyarrow, numba, matplotlib, tqdm).  ``--smoke``: the same run at
tiny size on the CPU in under a minute (a test runs it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the originlens command does (read at torch's start)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from originlens.cli.paper_scale_cmd import main

if __name__ == "__main__":
    sys.exit(main())
