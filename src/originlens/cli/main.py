"""Entry point of the ``originlens`` command.

Each concept package contributes its subcommands through a module listed in :data:`COMMAND_MODULES`;
such a module defines ``register(subparsers)`` which adds parsers whose ``func`` attribute is called
with the parsed arguments.  User errors (:class:`~originlens.errors.OriginlensError`) are printed as one
line and exit with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

# OpenMP worker threads (torch's intra-op pool) spin while they wait for work by default; on a shared
# machine two spinning threads of a small model cost 3–8× the CPU time of one thread for identical
# results (benchmarks/threads.py).  Passive waiting keeps what a second core buys when it is free and
# loses nothing when it is not.  Read once, when the OpenMP runtime starts (the first torch import,
# which the CLI defers), so it is set here; a value the user set wins, and results do not depend on it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from ..errors import OriginlensError
from ..interrupts import Interrupted, terminate_as_interrupt
from ..progress import set_verbosity

# One module per concept; each has register(subparsers).
COMMAND_MODULES = [
    "originlens.cli.corpus_cmd",
    "originlens.cli.stats_cmd",
    "originlens.cli.assoc_cmd",
    "originlens.cli.demo_cmd",
    "originlens.cli.lm_cmd",
    "originlens.cli.lm_compare_cmd",
    "originlens.cli.lm_features_cmd",
    "originlens.cli.sae_cmd",
    "originlens.cli.ntp_cmd",
    "originlens.cli.ntp_experiment_cmd",
    "originlens.cli.report_cmd",
    "originlens.cli.results_cmd",
]


class Parser(argparse.ArgumentParser):
    """argparse with messages that always reach the terminal: an argument the stream cannot encode (a lone
    surrogate from a mis-encoded command line) is printed escaped, not raised as a UnicodeEncodeError in
    the middle of a usage error.  Subcommand parsers are of the same class."""

    def _print_message(self, message: str, file: Any = None) -> None:
        if message:
            file = file or sys.stderr
            encoding = getattr(file, "encoding", None) or "utf-8"
            super()._print_message(message.encode(encoding, "backslashreplace").decode(encoding), file)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="originlens",
        description="Where do transformer features come from? Corpus statistics and leading terms "
        "(arXiv 2601.19208) and gradient pathways (arXiv 2603.14087).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("-q", "--quiet", action="store_true", help="no progress bars or status lines")
    g.add_argument("-v", "--verbose", action="store_true", help="progress bars even when not a terminal")
    p.add_argument(
        "--log-to",
        metavar="SINKS",
        help="also mirror logged metrics to 'tensorboard' and/or "
        "'wandb' (comma-separated; the package must be installed; default: env ORIGINLENS_LOG_TO)",
    )
    from .. import __version__

    p.add_argument("--version", action="version", version=f"originlens {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    _verbosity_everywhere(p)
    return p


def _verbosity_everywhere(parser: argparse.ArgumentParser) -> None:
    """``-q`` / ``-v`` also after the sub-command (``originlens ntp train ... -q``): every sub-parser gets
    the same pair, with suppressed defaults so an absent flag never overwrites the top-level one."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for child in set(action.choices.values()):
            if not any("-q" in a.option_strings for a in child._actions):
                g = child.add_mutually_exclusive_group()
                g.add_argument(
                    "-q",
                    "--quiet",
                    action="store_true",
                    default=argparse.SUPPRESS,
                    help="no progress bars or status lines (also before the command)",
                )
                g.add_argument(
                    "-v",
                    "--verbose",
                    action="store_true",
                    default=argparse.SUPPRESS,
                    help="progress bars even when not a terminal (also before the command)",
                )
            _verbosity_everywhere(child)


def _chosen_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The deepest (sub-)parser named by the non-option words of ``argv`` (``ntp experiment`` → its parser)."""
    current = parser
    for word in argv:
        if word.startswith("-"):
            continue
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        current = subs[0].choices[word]
    return current


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status.  Ctrl-C at any
    moment, parsing and the commands' own imports included, ends with one line and status 130."""
    from .. import progress as _progress

    saved = _progress._VERBOSITY  # -q/-v apply to this command only, not to later in-process calls
    try:
        return _main(argv)
    except KeyboardInterrupt as exc:
        print("originlens: interrupted (partial outputs were not published)", file=sys.stderr)
        return 143 if str(exc) == "SIGTERM" else 130
    except Exception as exc:
        # Ctrl-C during an import can surface wrapped in another error (Python turns a KeyboardInterrupt
        # raised in a class body's __set_name__ into a RuntimeError, as torch's import showed): still an
        # interrupt, one line
        interrupt = interrupt_in_chain(exc)
        if interrupt is None:
            raise
        print("originlens: interrupted (partial outputs were not published)", file=sys.stderr)
        return 143 if str(interrupt) == "SIGTERM" else 130
    finally:
        _progress.set_verbosity(saved)


def interrupt_in_chain(exc: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt among ``exc``'s causes and contexts, if any (each link followed once)."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if isinstance(link, KeyboardInterrupt):
            return link
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return None


def run_script(fn: Callable[[], int | None], prog: str) -> int:
    """Exit status of a script's ``fn()`` (``examples/``, ``scripts/``) with the command's error handling:
    an :class:`OriginlensError` is one line ``PROG: error: …`` and status 2 (never a traceback), Ctrl-C or
    SIGTERM one line and status 130 / 143 (after a training loop's checkpoint)."""
    try:
        with terminate_as_interrupt():
            return int(fn() or 0)
    except OriginlensError as exc:
        print(f"{prog}: error: {exc.one_line()}", file=sys.stderr)
        return 2
    except Interrupted as exc:
        print(f"{prog}: interrupted by {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        print(f"{prog}: interrupted (partial outputs were not published)", file=sys.stderr)
        return 143 if str(exc) == "SIGTERM" else 130


@contextlib.contextmanager
def _rank_zero_speaks() -> Iterator[None]:
    """Under ``torchrun`` with several processes only rank 0 prints progress and summaries: the other
    ranks run quiet with their standard output discarded (errors still reach their standard error)."""
    from ..distributed import env_world

    rank, world = env_world()
    if world <= 1 or rank == 0:
        yield
        return
    set_verbosity(0)
    with open(os.devnull, "w", encoding="utf-8") as null, contextlib.redirect_stdout(null):
        yield


def _hold_what_it_writes(args: argparse.Namespace) -> None:
    """Lock, before the command does anything, every path it declared it writes (``writes``: a function
    of the parsed arguments giving its output directories and files; every leaf command declares one).
    The lock is the path's hidden sibling ``.NAME.lock`` (:func:`originlens.locks.hold_path`), so nothing
    is created at the path itself before the command has checked it; a second writer is refused at
    once, naming the owner.  Under ``torchrun`` rank 0 alone writes, so it alone locks."""
    from ..distributed import env_world
    from ..locks import hold_path

    declared = getattr(args, "writes", None)
    if declared is None or env_world()[0] != 0:
        return
    for path in declared(args):
        if path is not None:
            hold_path(path)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quiet:
        set_verbosity(0)
    elif args.verbose:
        set_verbosity(2)
    if not getattr(args, "func", None):
        chosen = _chosen_parser(parser, sys.argv[1:] if argv is None else argv)
        chosen.print_help()  # a command group without its sub-command: the group's own help
        return 0 if chosen is parser else 2
    try:
        if args.log_to is not None:
            from ..sinks import set_sinks

            set_sinks(args.log_to)
        with terminate_as_interrupt(), _rank_zero_speaks():  # SIGTERM takes the same clean path as Ctrl-C
            _hold_what_it_writes(args)
            rc = args.func(args)
    except OriginlensError as exc:
        print(f"originlens: error: {exc.one_line()}", file=sys.stderr)
        return 2
    except OSError as exc:
        # an unwritable or read-only location, a full disk, a vanished file met outside the storage layer:
        # still one line naming the path (the storage layer's wording), never a traceback
        if exc.filename is None:
            raise
        from pathlib import Path

        from ..errors import io_error

        print(f"originlens: error: {io_error(Path(exc.filename), exc, 'accessing').one_line()}", file=sys.stderr)
        return 2
    except Interrupted as exc:  # a training loop checkpointed before stopping
        print(f"originlens: interrupted by {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        print("originlens: interrupted (partial outputs were not published)", file=sys.stderr)
        return 143 if str(exc) == "SIGTERM" else 130
    finally:
        from ..locks import release_all
        from ..sinks import close_all, reset_sinks

        close_all()
        reset_sinks()
        release_all()  # a command's run directories are locked while it runs
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
