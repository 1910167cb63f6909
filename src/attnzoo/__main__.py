"""``python -m attnzoo``, which is also how ``torchrun -m attnzoo`` starts each process."""

from attnzoo.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
