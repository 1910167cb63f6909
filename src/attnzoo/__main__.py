"""``python -m attnzoo``, which is also how ``torchrun -m attnzoo`` starts each process."""

import sys

if __name__ == "__main__":
    try:
        from attnzoo.cli import main  # the imports (torch) take a while: a Ctrl-C here is an ordinary stop
    except KeyboardInterrupt:
        print("attnzoo: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    raise SystemExit(main())
