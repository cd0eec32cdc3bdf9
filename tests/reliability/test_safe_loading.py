"""Safe loading: nothing the project reads from outside can execute code; artefacts are checked."""
from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest

from originlens.errors import CompatibilityError, InputError, OriginlensError
from originlens.storage import load_tensors, save_tensors

SRC = Path(__file__).resolve().parents[2] / "src" / "originlens"


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {_Evil.marker}",))


def _write_evil(path: Path, marker: Path) -> None:
    _Evil.marker = marker
    path.write_bytes(pickle.dumps({"W_O": _Evil()}))


def test_malicious_pickle_disguised_as_checkpoint_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    bad = tmp_path / "model.safetensors"
    _write_evil(bad, marker)
    with pytest.raises(InputError, match="not a readable safetensors"):
        load_tensors(bad)
    assert not marker.exists()


def test_malicious_pickle_disguised_as_tokens_is_refused(tmp_path):
    from originlens.data import load_token_array
    marker = tmp_path / "pwned"
    # an object-dtype .npy file: loading it would need pickle
    arr = np.empty(2, dtype=object)
    arr[0] = _Evil()
    _Evil.marker = marker
    np.save(tmp_path / "tokens.npy", arr, allow_pickle=True)
    with pytest.raises(OriginlensError):
        load_token_array(tmp_path / "tokens.npy", 10)
    assert not marker.exists()
    _write_evil(tmp_path / "raw.npy", marker)
    with pytest.raises(OriginlensError):
        load_token_array(tmp_path / "raw.npy", 10)
    assert not marker.exists()


def test_malicious_pickle_as_statistics_and_probes(tmp_path):
    from originlens.probes import ProbeSet
    from originlens.stats import load_statistics
    marker = tmp_path / "pwned"
    (tmp_path / "s").mkdir()
    _write_evil(tmp_path / "s" / "statistics.safetensors", marker)
    with pytest.raises(OriginlensError):
        load_statistics(tmp_path / "s")
    _write_evil(tmp_path / "p.safetensors", marker)
    with pytest.raises(OriginlensError):
        ProbeSet.load(tmp_path / "p.safetensors")
    assert not marker.exists()


def test_kind_and_format_version_are_checked(tmp_path):
    save_tensors(tmp_path / "a.safetensors", {"x": np.zeros(2)}, kind="probes")
    with pytest.raises(CompatibilityError, match="expected 'corpus-statistics'"):
        load_tensors(tmp_path / "a.safetensors", kind="corpus-statistics")
    from safetensors.numpy import save_file
    save_file({"x": np.zeros(2)}, str(tmp_path / "b.safetensors"), metadata={"format_version": "999"})
    with pytest.raises(CompatibilityError, match="format version 999"):
        load_tensors(tmp_path / "b.safetensors")


def test_source_never_unpickles_or_evals():
    """Static guard: no pickle, eval/exec, unsafe torch.load or trust_remote_code=True in the package."""
    bad = []
    for p in SRC.rglob("*.py"):
        text = p.read_text(encoding="utf-8")
        for i, line in enumerate(text.splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"\bimport pickle\b|\bpickle\.loads?\(|\bcloudpickle\b|\bdill\b", code):
                bad.append(f"{p}:{i}: pickle")
            if re.search(r"(?<![\w.])(eval|exec)\(", code):
                bad.append(f"{p}:{i}: eval/exec")
            if "allow_pickle=True" in code:
                bad.append(f"{p}:{i}: allow_pickle=True")
            if re.search(r"torch\.load\(", code) and "weights_only=True" not in code:
                bad.append(f"{p}:{i}: torch.load without weights_only=True")
            if "trust_remote_code=True" in code:
                bad.append(f"{p}:{i}: trust_remote_code=True")
    assert not bad, "\n".join(bad)
