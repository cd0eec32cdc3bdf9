"""The package builds as a wheel that carries every module, the console script and the extras."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_builds_with_every_module_and_the_console_script(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            str(ROOT),
            "-w",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheels = list(tmp_path.glob("originlens-*.whl"))
    assert len(wheels) == 1
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    src = {str(p.relative_to(ROOT / "src")) for p in (ROOT / "src" / "originlens").rglob("*.py")}
    assert src <= names, sorted(src - names)[:5]
    dist = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    meta = zipfile.ZipFile(wheels[0]).read(f"{dist}/METADATA").decode()
    entry = zipfile.ZipFile(wheels[0]).read(f"{dist}/entry_points.txt").decode()
    assert "originlens = originlens.cli.main:main" in entry
    for extra in ("hf", "sae", "syntax", "dev"):
        assert f"Provides-Extra: {extra}" in meta
    assert "Requires-Dist: torch" in meta
