"""Every name of the public API resolves; importing the package does not import torch."""

import subprocess
import sys

import originlens


def test_public_names_resolve():
    for name in originlens.__all__:
        assert getattr(originlens, name) is not None, name


def test_import_is_cheap():
    code = "import sys, originlens, originlens.stats; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
