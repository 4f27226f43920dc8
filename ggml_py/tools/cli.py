"""What every subcommand of the command line shares: a parser whose errors are one
line, argument types that check counts and paths before anything runs, and the one
place where an exception becomes a message and an exit status.

Exit status: 0 done, 1 the run failed (a scheduler abort, a failed check, a write
error), 2 a usage error (bad arguments, input files that are missing or of the
wrong kind, a missing optional package), 130 interrupted.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import sys
from typing import Any, Callable, NoReturn, Sequence

from ggml_py.errors import CaseFormatError, GgmlPyError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

EXIT_STATUS_HELP = ("exit status: 0 done, 1 the run failed, 2 usage error (bad arguments "
                    "or input files)")


class UsageError(Exception):
    """Bad input found after parsing (an option that does not apply, a file of the wrong
    kind, a missing optional package): exit status 2."""


def program_name() -> str:
    """How the user called us: 'python -m ggml_py', else the installed command's name."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "__main__.py" and \
            os.path.basename(os.path.dirname(argv0)) == "ggml_py":
        return "python -m ggml_py"
    name = os.path.basename(argv0)
    return name if name.startswith("ggml-py") else "ggml-py"


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: 'PROG: error: MESSAGE (see PROG --help)'."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


# ---------------------------------------------------------------------------
# argument types: each checks its value up front and says what is wrong

def count(minimum: int = 1, maximum: int | None = None) -> Callable[[str], int]:
    """An int >= minimum (1: a positive count, 0: a count that may be zero), and at most
    `maximum` where there is one."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < minimum:
            what = "positive" if minimum == 1 else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"must be {what}, got {n}")
        if maximum is not None and n > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, got {n}")
        return n
    return parse


def positive_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not x > 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return x


def endpoints(text: str) -> list[str]:
    """RPC servers: 'HOST:PORT[,HOST:PORT...]' (llama.cpp's --rpc), each checked."""
    from ggml_py.backends.rpc import parse_endpoints
    try:
        return parse_endpoints(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def shares(text: str) -> list[float]:
    """Non-negative shares 'A,B,...' with a positive sum (llama.cpp's --tensor-split)."""
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of numbers such as 3,1") from None
    if any(not 0 <= x < float("inf") for x in values) or sum(values) <= 0:
        raise argparse.ArgumentTypeError(f"shares must be non-negative with a positive sum, "
                                         f"got {text}")
    return values


def _readable_file(path: str) -> str:
    """The path of an existing, readable, non-empty file, or the reason it is not one."""
    if not os.path.exists(path):
        raise argparse.ArgumentTypeError(f"{path}: no such file")
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{path} is a folder, not a file")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{path}: permission denied")
    if os.path.getsize(path) == 0:
        raise argparse.ArgumentTypeError(f"{path} is empty")
    return path


def input_file(*suffixes: str) -> Callable[[str], str]:
    """An existing, readable, non-empty file (any name when no suffixes are given)."""
    def parse(path: str) -> str:
        _readable_file(path)
        if suffixes and not path.endswith(suffixes):
            raise argparse.ArgumentTypeError(f"{path}: expected a {' or '.join(suffixes)} file")
        return path
    return parse


def input_file_or_folder(pattern: str) -> Callable[[str], str]:
    """An existing file, or a folder with at least one file matching `pattern` in it or
    below."""
    def parse(path: str) -> str:
        if os.path.isdir(path):
            if not glob.glob(os.path.join(path, "**", pattern), recursive=True):
                raise argparse.ArgumentTypeError(f"{path}: no {pattern} files in this folder")
            return path
        return _readable_file(path)
    return parse


def output_file(*suffixes: str) -> Callable[[str], str]:
    """A file we can write: its folder exists and is writable, and it is not a folder
    itself; with suffixes, the name must end in one of them."""
    def parse(path: str) -> str:
        if suffixes and not path.lower().endswith(suffixes):
            raise argparse.ArgumentTypeError(
                f"{path}: the name must end in {', '.join(suffixes)}")
        if os.path.isdir(path):
            raise argparse.ArgumentTypeError(f"{path} is a folder")
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder):
            raise argparse.ArgumentTypeError(f"{path}: folder {folder} does not exist")
        if not os.access(folder, os.W_OK) or (os.path.exists(path)
                                              and not os.access(path, os.W_OK)):
            raise argparse.ArgumentTypeError(f"{path}: permission denied")
        return path
    return parse


def output_folder(path: str) -> str:
    """A folder to write into: it exists, or its parent does (it is created later)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{path} is a file, not a folder")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(path) and not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"{path}: folder {parent} does not exist")
    if not os.access(path if os.path.isdir(path) else parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"{path}: permission denied")
    return path


def require_module(module: str, purpose: str, extra: str) -> None:
    """UsageError unless `module` is importable: what needs it, and what to install."""
    if importlib.util.find_spec(module) is None:
        raise UsageError(f"{purpose} needs the {module} package: "
                         f"pip install {module} (or pip install \"ggml-py-sched[{extra}]\")")


# ---------------------------------------------------------------------------
# running a command: exceptions -> one line on stderr and an exit status

def _describe(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        where = e.filename if e.filename is not None else ""
        return f"{where}: {e.strerror}" if where else e.strerror
    kind = getattr(e, "kind", None)
    return str(e) + (f" [{kind}]" if kind else "")


def run(command: Callable[[], int], prog: str) -> int:
    """Run `command`; map what it raises to one line on stderr and an exit status."""
    def fail(status: int, message: str) -> int:
        print(f"{prog}: error: {message}", file=sys.stderr)
        return status

    try:
        return command()
    except BrokenPipeError:
        # the reader went away (`plan | head`): stop quietly, and keep the interpreter
        # from reporting the failed flush of stdout at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILED
    except KeyboardInterrupt:
        return fail(EXIT_INTERRUPTED, "interrupted")
    except UsageError as e:
        return fail(EXIT_USAGE, str(e))
    except (CaseFormatError, json.JSONDecodeError) as e:
        return fail(EXIT_USAGE, _describe(e))
    except (GgmlPyError, OSError, ValueError, MemoryError, NotImplementedError) as e:
        return fail(EXIT_FAILED, _describe(e))
    except Exception as e:          # a bug: still one line, the traceback on request
        if os.environ.get("GGML_PY_TRACEBACK"):
            raise
        return fail(EXIT_FAILED, f"internal error, please report it: {type(e).__name__}: "
                                 f"{e} (GGML_PY_TRACEBACK=1 shows the traceback)")


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[Any, int | None]:
    """(namespace, None), or (None, exit status) when argparse exited (--help, --version,
    a usage error): callers in tests get a status instead of SystemExit."""
    try:
        return parser.parse_args(argv), None
    except SystemExit as e:
        return None, e.code if isinstance(e.code, int) else EXIT_USAGE
