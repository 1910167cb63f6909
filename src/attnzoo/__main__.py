"""``python -m attnzoo``, which is also how ``torchrun -m attnzoo`` starts each process."""

import sys

if __name__ == "__main__":
    try:
        # The imports (torch) take a while: a Ctrl-C here is an ordinary stop.
        from attnzoo.cli import main
        from attnzoo.training.distributed import exit_process
    except KeyboardInterrupt:
        print("attnzoo: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    exit_process(main())
