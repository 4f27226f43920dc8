"""`python -m ggml_py`: the command line of ggml_py.tools.commands (also `ggml-py`)."""

import sys

from ggml_py.tools.commands import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
