"""Run ``originlens ARGS...`` and SIGKILL the process at a chosen point (driver for test_kill_resume.py).

Usage: ``python _killpoint.py SPEC -- ARGS...`` where SPEC is JSON:

* ``{"op": "replace", "match": GLOB, "when": "before"|"after", "nth": N}``: at the N-th ``os.replace`` whose
  destination matches GLOB, kill just before the rename (the temporary file is complete but unpublished)
  or just after it (the file is published, nothing after it ran);
* ``{"op": "write", "match": GLOB, "nth": N}``: the N-th file opened with ``os.fdopen`` whose path matches
  GLOB receives only the first half of its first ``write`` (flushed and fsynced), then the process dies:
  a torn file on disk, as after a power cut in the middle of a checkpoint write;
* ``{"op": "call", "target": "module:Class.method", "when": "before"|"after", "nth": N}``: kill at the
  N-th call of a method (patched on the class, so every caller sees it).

``"modules": [...]`` (optional, added by ``_helpers.run_cli``) registers only those CLI command modules,
so that e.g. ``corpus build`` does not pay for importing torch through unrelated subcommands.

The kill is ``os.kill(getpid(), SIGKILL)``: no ``finally`` blocks, ``atexit`` handlers or buffered flushes
run, exactly as when the machine or the OOM killer stops the process.  If the point is never reached
the command runs to completion and its exit status is returned.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import os
import signal
import sys

spec = json.loads(sys.argv[1])
argv = sys.argv[sys.argv.index("--") + 1 :]
_count = 0


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _hit(path: str) -> bool:
    global _count
    if fnmatch.fnmatch(str(path), spec["match"]):
        _count += 1
        return _count == spec.get("nth", 1)
    return False


if spec["op"] == "replace":
    _real_replace = os.replace

    def _replace(src, dst, *a, **k):
        if _hit(os.fspath(dst)):
            if spec.get("when", "after") == "before":
                _die()
            _real_replace(src, dst, *a, **k)
            _die()
        return _real_replace(src, dst, *a, **k)

    os.replace = _replace

elif spec["op"] == "write":
    _real_fdopen = os.fdopen

    class _Torn:
        def __init__(self, f):
            self._f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self._f.__exit__(*exc)

        def write(self, data):
            self._f.write(data[: len(data) // 2])
            self._f.flush()
            os.fsync(self._f.fileno())
            _die()

        def __getattr__(self, name):
            return getattr(self._f, name)

    def _fdopen(fd, *a, **k):
        f = _real_fdopen(fd, *a, **k)
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return f
        return _Torn(f) if _hit(path) else f

    os.fdopen = _fdopen

elif spec["op"] == "call":
    mod, attr = spec["target"].split(":")
    owner = importlib.import_module(mod)
    *path, meth = attr.split(".")
    for p in path:
        owner = getattr(owner, p)
    _real = getattr(owner, meth)
    _calls = 0

    def _wrapped(*a, **k):
        global _calls
        _calls += 1
        hit = _calls == spec.get("nth", 1)
        if hit and spec.get("when", "before") == "before":
            _die()
        out = _real(*a, **k)
        if hit:
            _die()
        return out

    setattr(owner, meth, _wrapped)
else:  # pragma: no cover
    raise SystemExit(f"unknown op {spec['op']!r}")

import originlens.cli.main as cli  # noqa: E402

if spec.get("modules"):  # register only the command under test (same code path, faster start-up)
    cli.COMMAND_MODULES = list(spec["modules"])
sys.exit(cli.main(argv))
