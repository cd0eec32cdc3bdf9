"""Command-line options shared by several commands, defined once.

* :func:`float_list`: comma-separated finite numbers (``--lrs``, ``--coefficients``).
* :func:`int_list` / :func:`int_list_or_all`: the one integer-list grammar (``1,3``, ``1-6``, ``4-56:4``).
* :func:`add_device`: ``--device`` for every command that takes one (the names of :mod:`originlens.devices`).
* :func:`add_option`: every option whose spelling was unified across commands (:data:`RENAMED`: one spelling
  per concept — ``--n-layers`` is a model's depth, ``--layers`` a selection of layers, ``--max-windows``
  how many inputs are read, ``--top-tokens`` the K most frequent tokens) takes its old spelling for one
  more release with a one-line deprecation warning.
* :func:`add_threads` / :func:`apply_threads`: ``--threads N`` (torch's CPU thread count, process-wide).
  ``N`` must be an integer ≥ 1; anything else is an argparse error (one line, status 2).  On CPU the
  thread count can change the last bits of matrix products; ``ntp train`` records it in
  ``environment.json`` and warns when a run is resumed with another count (docs/reliability.md).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

# new spelling → the old spellings it replaces (accepted with a warning until the next release)
RENAMED: dict[str, tuple[str, ...]] = {
    "--n-layers": ("--layers",),  # a model's depth; --layers selects layers (lm compare, ntp attribute)
    "--max-windows": ("--max-texts",),  # how many windows / texts are read
    "--top-tokens": ("--top-k",),  # the K most frequent tokens of the statistics
}


class _RenamedStore(argparse._StoreAction):
    """``store`` that warns when the option was given under an old spelling (see :data:`RENAMED`)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        new = self.option_strings[0]
        if option_string is not None and option_string != new:
            import sys

            print(
                f"originlens: warning: {option_string} is now spelled {new}; the old spelling stops working in "
                "the next release",
                file=sys.stderr,
            )
        super().__call__(parser, namespace, values, option_string)


def add_option(p: Any, flag: str, **kwargs: Any) -> Any:
    """``p.add_argument(flag, **kwargs)``, plus the old spellings of ``flag`` listed in :data:`RENAMED`
    (accepted with a deprecation warning; the help names them)."""
    olds = RENAMED.get(flag, ())
    if not olds:
        return p.add_argument(flag, **kwargs)
    kwargs.setdefault("dest", flag.lstrip("-").replace("-", "_"))
    kwargs.setdefault("metavar", flag.lstrip("-").upper().replace("-", "_"))
    kwargs["help"] = (kwargs.get("help") or "").rstrip() + f" (old spelling {', '.join(olds)}: deprecated)"
    return p.add_argument(flag, *olds, action=_RenamedStore, **kwargs)


def positive_int(s: str) -> int:
    """argparse type: an integer ≥ 1."""
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer ≥ 1, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer ≥ 1, got {v}")
    return v


def add_threads(p: Any, help: str = "torch CPU threads (default: torch's choice)") -> None:
    """Add ``--threads N`` to parser or argument group ``p``."""
    p.add_argument("--threads", type=positive_int, default=None, metavar="N", help=help)


def apply_threads(args: argparse.Namespace) -> None:
    """Set torch's CPU thread count from ``args.threads`` when given (imports torch only then)."""
    n = getattr(args, "threads", None)
    if n is not None:
        import torch

        torch.set_num_threads(int(n))


def finite_float(s: str) -> float:
    """argparse type: a finite real number (``nan`` and ``inf`` are usage errors)."""
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {s}")
    return v


def utf8_text(s: str) -> str:
    """argparse type: text that is valid UTF-8 (Python passes undecodable argument bytes as surrogates,
    which no tokenizer can encode)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = s[exc.start : exc.end].encode("utf-8", "surrogateescape")
        raise argparse.ArgumentTypeError(
            f"not valid UTF-8 text (bytes {bad!r} at character {exc.start}); pass the text in UTF-8"
        ) from None
    return s


def float_list(s: str) -> list[float]:
    """argparse type: comma-separated finite numbers, e.g. ``1,100`` or ``0.005,0.05``."""
    try:
        out = [float(v) for v in s.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,100, got {s!r}") from None
    if not out or not all(math.isfinite(v) for v in out):
        raise argparse.ArgumentTypeError(f"expected finite numbers like 1,100, got {s!r}")
    return out


def add_device(p: Any, *, default: str | None = "cpu", help: str = "") -> None:
    """Add ``--device`` (cpu | cuda | cuda:N | auto) to parser or group ``p``: the name is checked when
    parsing, its availability when the command runs (:func:`originlens.devices.resolve_device`)."""
    from ..devices import SPECS, device_arg

    what = help or ("where to compute" + (f" (default {default})" if default else ""))
    p.add_argument("--device", type=device_arg, default=default, metavar="DEVICE", help=f"{SPECS}: {what}")


def add_device_map(p: Any) -> None:
    """Add ``--device-map MAP`` to parser or group ``p``: Hugging Face models' ``device_map`` (passed to
    ``from_pretrained``; refused beside another ``--device`` and for other formats when the model loads)."""
    p.add_argument(
        "--device-map",
        default=None,
        metavar="MAP",
        help="Hugging Face models only: from_pretrained's device_map, e.g. auto (spreads the layers over the "
        "available devices; needs accelerate) or cuda:0; not with --device",
    )


def int_list(s: str) -> list[int]:
    """argparse type, the one integer-list grammar of the CLI: comma-separated ``N``, inclusive ranges
    ``A-B`` and strided ranges ``A-B:S`` (``1,3``, ``1-6``, ``4-56:4``; a leading minus is a sign)."""
    out: list[int] = []
    try:
        for part in s.split(","):
            part = part.strip()
            if not part:
                continue
            body, _, stride = part.partition(":")
            step = int(stride) if stride else 1
            if step < 1:
                raise ValueError
            if "-" in body[1:]:
                i = body.index("-", 1)
                a, b = int(body[:i]), int(body[i + 1 :])
                out += list(range(a, b + 1, step))
            elif stride:
                raise ValueError
            else:
                out.append(int(body))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,3 or 1-6 or 4-56:4, got {s!r}") from None
    if not out:
        raise argparse.ArgumentTypeError(f"no integers in {s!r} (e.g. 1,3 or 1-6)")
    return out


def int_list_or_all(s: str) -> list[int] | None:
    """:func:`int_list`, or ``all`` → None (every index)."""
    return None if s.strip().lower() == "all" else int_list(s)


def shard_arg(s: str) -> tuple[int, int]:
    """argparse type of ``--shard I/N`` (0 ≤ I < N)."""
    try:
        i, n = (int(v) for v in s.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N, e.g. 0/4, got {s!r}") from None
    if n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"I/N needs 0 ≤ I < N, got {s!r}")
    return i, n
