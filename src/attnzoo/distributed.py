"""Process groups, devices and data-parallel wrapping.

Launched by ``torchrun``, every process joins one process group (nccl on CUDA, gloo on CPU) and trains a
replica (DDP) or a shard (FSDP2) of the model. Launched plainly, the same code runs as a world of one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from attnzoo.validation import DEVICE_NAMES, is_device_name, require

CPU = torch.device("cpu")


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` → this process's GPU if there is one, else the CPU; ``cuda`` → this process's GPU."""
    require(is_device_name(name), "device", name, DEVICE_NAMES)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={name!r} is invalid: torch sees no CUDA device here; use 'cpu'")
        if device.index is None:
            device = torch.device("cuda", local_rank)
    return device


@dataclass(frozen=True)
class Distributed:
    """This process's place in the job; a world of one when not launched by torchrun."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = CPU

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (any picklable object)."""
        if not self.enabled:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value: Any) -> list[Any] | None:
        """Every rank's ``value``, in rank order, on rank 0; ``None`` elsewhere."""
        if not self.enabled:
            return [value]
        values = [None] * self.world_size if self.is_main else None
        dist.gather_object(value, values, dst=0)
        return values


def init_distributed(device: str = "auto") -> Distributed:
    """Join torchrun's process group if this process was launched by torchrun (``WORLD_SIZE`` is set)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Distributed(device=resolve_device(device))
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    resolved = resolve_device(device, local_rank)
    if resolved.type == "cuda":
        torch.cuda.set_device(resolved)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if resolved.type == "cuda" else "gloo", device_id=_device_id(resolved))
    return Distributed(rank=rank, local_rank=local_rank, world_size=world_size, device=resolved)


def _device_id(device: torch.device) -> torch.device | None:
    # Binding the group to its GPU lets nccl connect eagerly; gloo takes no device.
    return device if device.type == "cuda" else None


def shutdown_distributed(*, synchronize: bool = False) -> None:
    """Leave the process group. ``synchronize`` (after a run that succeeded on every rank): first wait at a
    barrier until every rank is done with it, so that no rank tears down its connections while a peer still
    writes its checkpoint, plot or summary. Never on an error path, where a peer may be gone and the barrier
    would wait for it until the timeout."""
    if dist.is_initialized():
        if synchronize:
            dist.barrier()
        dist.destroy_process_group()


def joined_process_group() -> bool:
    """Whether this process was launched as one rank of several (by torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def exit_process(code: int) -> NoReturn:
    """End the program with ``code``; a torchrun worker without running the interpreter's teardown.

    ``destroy_process_group`` does not end everything a process group started: after FSDP2's ``fully_shard``
    the gloo backend (its ``pt_gloo_runloop`` workers and the ``gloo_tcp_loop`` transport thread) stays alive,
    still referenced inside torch, until the process exits. The objects that own those threads are then
    destroyed by the interpreter's and the C++ runtime's exit-time teardown, in no defined order and while the
    threads still run, which intermittently ended a finished rank with ``terminate called without an active
    exception`` (SIGABRT) after its checkpoint was written. Everything of a run is on disk (atomically written
    and closed) when this is called, so a worker flushes its output and ends with ``os._exit``, which runs no
    destructor; a process that never joined a group exits normally.
    """
    if not joined_process_group():
        sys.exit(code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def parallelize(model: nn.Module, env: Distributed, strategy: str) -> nn.Module:
    """Wrap for data parallelism: DDP keeps a replica per rank; FSDP2 shards each block and the rest."""
    if not env.enabled:
        return model
    if strategy == "ddp":
        return DistributedDataParallel(model, device_ids=[env.device.index] if env.device.type == "cuda" else None)
    fully_shard = _fully_shard()
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    return model


def _fully_shard() -> Any:
    """FSDP2's ``fully_shard``: public in torch.distributed.fsdp from torch 2.6, while attnzoo supports 2.4."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        raise ValueError(
            f"--parallel fsdp needs FSDP2 (torch.distributed.fsdp.fully_shard, torch >= 2.6); this is torch "
            f"{torch.__version__}. Use --parallel ddp."
        ) from None
    return fully_shard


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce for all but the last micro-batch of a step (gradient accumulation)."""
    if isinstance(model, DistributedDataParallel) and not enabled:
        with model.no_sync():
            yield
    else:
        if not isinstance(model, DistributedDataParallel) and hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(enabled)  # an FSDP2-sharded model
        yield
