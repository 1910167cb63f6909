"""The GPU lease's scripts, one module per concept; ``benchmarks/gpu_speed.py`` is the lease's entry point.

* ``plan``: how each case is run and timed, the sizes, every case in its order;
* ``measure``: one case measured (a training step, a layer, decoding), MFU;
* ``worker``: the process the cases run in, and the budget that stops it;
* ``pytest_stage``: ``pytest -m "cuda or triton"`` with the budget left;
* ``report``: ``gpu-speed.md`` (its tables), ``gpu-speed.json`` and ``summary.json``;
* ``routes``: the CUDA routes ``summary.json`` decides (``attnzoo/attention/kernels/cuda_routes.json``);
* ``speed``: the command, which runs them in turn.

Imported as ``gpu`` with ``benchmarks/`` on ``sys.path``, as running a script there puts it, like ``gpu_checks``.
"""
