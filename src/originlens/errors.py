"""User-facing errors.

Every problem a user can cause (bad path, bad flag, wrong vocabulary, ...) is raised as an
:class:`OriginlensError` carrying *what* went wrong and *how to fix it*.  The CLI prints it as a
single line (``originlens: error: WHAT — fix: FIX``) instead of a traceback; Python callers get an
ordinary exception they can catch.  Internal bugs stay ordinary exceptions so they keep their
traceback.
"""

from __future__ import annotations


class OriginlensError(Exception):
    """An error caused by input, configuration or environment, with a suggested fix."""

    def __init__(self, what: str, fix: str | None = None) -> None:
        self.what = what
        self.fix = fix
        super().__init__(what if not fix else f"{what} — fix: {fix}")

    def one_line(self) -> str:
        """The message as printed by the CLI (newlines folded)."""
        return " ".join(str(self).split())


class InputError(OriginlensError):
    """A file, corpus or array given by the user is missing, unreadable or malformed."""


class ConfigError(OriginlensError):
    """A configuration value or flag is unknown, of the wrong type or out of range."""


class CompatibilityError(OriginlensError):
    """Artefacts that do not belong together (other vocabulary, other format version)."""


class NumericalError(OriginlensError):
    """Training or analysis produced NaN/Inf."""


class BudgetExceeded(OriginlensError):
    """A run reached its wall-clock deadline and stopped after writing a checkpoint (resumable)."""


def io_error(path: object, exc: OSError, action: str) -> OriginlensError:
    """The one-line error for an ``OSError`` while ``action`` (e.g. "writing") ``path``: a full disk and a
    path one may not write get their own wording and fix."""
    import errno

    if exc.errno == errno.ENOSPC:
        return OriginlensError(
            f"no space left on device while {action} {path}",
            "free disk space or choose another --out; earlier files are intact",
        )
    if exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
        return OriginlensError(f"cannot write {path}: {exc.strerror}", "choose a writable --out directory")
    return OriginlensError(f"I/O error while {action} {path}: {exc.strerror or exc}", "check the path and the disk")
