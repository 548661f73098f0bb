"""``python -m neural_arch.serve --model DIR [--host H] [--port N] [--max-batch-size N]
[--timeout-ms MS]``."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
