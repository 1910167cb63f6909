"""The GPU scripts, one module per concept, one entry point per job beside this package:

* ``benchmarks/gpu_speed.py``, a lease's first call (``speed``); ``benchmarks/gpu_check.py``, the numerics, dispatch
  and speed checks (``check/``); ``bash scripts/gpu_kit.sh`` (``benchmarks/gpu_kit.py``), the whole kit (``kit``).

The lease's speed run:

* ``plan``: how each case is run and timed, the sizes, every case in its order;
* ``measure``: one case measured (a training step, a layer, decoding), MFU;
* ``worker``: the process the cases run in, and the budget that stops it;
* ``pytest_stage``: ``pytest -m "cuda or triton"`` with the budget left;
* ``report``: ``gpu-speed.md`` (its tables), ``gpu-speed.json`` and ``summary.json``;
* ``routes``: the CUDA routes ``summary.json`` decides (``attnzoo/attention/kernels/cuda_routes.json``);
* ``speed``: the command, which runs them in turn.

The check: ``check/command`` runs ``check/plan`` (combinations, sizes, tolerances, the report's records),
``check/numerics``, ``check/dispatch``, ``check/speed`` and ``check/report``. The kit: ``kit``, whose stages run the
other two as commands.

Imported as ``gpu`` with ``benchmarks/`` on ``sys.path``, as running a script there puts it.
"""
