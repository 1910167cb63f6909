"""``python -m attnzoo`` and the ``attnzoo`` command (its console-script entry point is :func:`main`); also how
``torchrun -m attnzoo`` starts each process."""

from __future__ import annotations

import sys
from typing import NoReturn


def main() -> NoReturn:
    try:
        # attnzoo.cli loads no torch (the command's module does, within run_command, which takes a Ctrl-C
        # there as an ordinary stop); a Ctrl-C this early is one too.
        from attnzoo.cli import main as run_command
    except KeyboardInterrupt:
        print("attnzoo: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    code = run_command()
    if "attnzoo.distributed" in sys.modules:  # where a torchrun worker joins its process group
        from attnzoo.distributed import exit_process

        exit_process(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
