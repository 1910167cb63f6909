"""``python -m attnzoo``, which is also how ``torchrun -m attnzoo`` starts each process."""

from attnzoo.cli import main
from attnzoo.training.distributed import exit_process

if __name__ == "__main__":
    exit_process(main())
