"""``python -m attnzoo`` and the ``attnzoo`` command (its console-script entry point is :func:`main`); also how
``torchrun -m attnzoo`` starts each process."""

from __future__ import annotations

import sys
from typing import NoReturn


def main() -> NoReturn:
    try:
        # The imports (torch) take seconds: a Ctrl-C then is an ordinary stop, not a traceback. Nothing imported
        # before this point loads torch (attnzoo/__init__.py is lazy).
        from attnzoo.cli import main as run_command
        from attnzoo.distributed import exit_process
    except KeyboardInterrupt:
        print("attnzoo: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    exit_process(run_command())


if __name__ == "__main__":
    main()
