"""Each process of a comparison's run that trains on several (``nproc_per_run``): launched by
:func:`attnzoo.compare.executors.launch_ranks` as
``python -m torch.distributed.run --standalone --nproc_per_node N -m attnzoo.compare.ranks SCRATCH``.

It ends with the worker that launched it (:func:`attnzoo.compare.executors.end_with`), joins torchrun's process
group, runs the pickled work (:func:`attnzoo.compare.runner.train_rank`) and leaves the group; a rank that fails
records its error in ``SCRATCH`` for the worker to report, its traceback in the run's log.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from pathlib import Path
from typing import NoReturn

import torch

from attnzoo.compare.executors import JOB_FILE, RANK_ERROR, end_with
from attnzoo.distributed import exit_process, init_distributed, shutdown_distributed


def main(scratch: Path) -> NoReturn:
    rank_work, spec, out_dir, job, threads, worker = pickle.loads((scratch / JOB_FILE).read_bytes())
    end_with(worker)
    torch.set_num_threads(threads)
    rank, world_size = os.environ.get("RANK", "?"), os.environ.get("WORLD_SIZE", "?")
    try:
        rank_work(spec, out_dir, job, init_distributed(spec.train.device))
    except BaseException as err:  # a stop by signal too: the run did not finish
        traceback.print_exc()
        error = f"rank {rank} of {world_size}: {type(err).__name__}: {err}"
        (scratch / RANK_ERROR.format(rank=rank)).write_text(error, encoding="utf-8")
        shutdown_distributed()  # no barrier: a peer may be gone
        exit_process(1)
    shutdown_distributed(synchronize=True)  # every rank finished: leave together
    exit_process(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
