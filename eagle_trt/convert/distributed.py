"""convert's training on several processes: torch.distributed's process group, as torchrun (or `convert --nproc N`,
see `launch.py`) sets it up, and the few collective steps the training path needs.

    world = World.from_env()              # RANK / WORLD_SIZE / LOCAL_RANK of torchrun; one process without them
    with world.joined(device):            # gloo on the CPU, NCCL on CUDA; torn down at the end
        share = rank_share(global_batch, world.rank, world.size)
        loss, stops = world.sum([my_loss_part, my_stop_flag])   # every rank gets the same sums

Invariants the callers rely on:
  - One process (no torchrun) is `World()` and every collective here is then a no-op, so the single-process path
    runs exactly the code it ran before.
  - The data order is a function of the global step only: a global batch is split by `rank_share`, strided, so
    resuming at another world size replays the same global batches.
  - Every rank sees the same work dir (a shared filesystem across nodes): the feature cache's shards and the
    checkpoint are read by all ranks, written by one (the checkpoint by rank 0 alone).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass

import torch

from eagle_trt.errors import InputError

# Long enough for the collectives that wait on another rank's slow solo work (rank 0 tokenising or regenerating the
# dataset while the others wait at a barrier); EAGLE_TRT_DIST_TIMEOUT_S overrides it.
DEFAULT_TIMEOUT_S = 4 * 3600


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> "World":
        """The process's place in a torchrun job (RANK, WORLD_SIZE, LOCAL_RANK), or a world of one without them."""
        env = os.environ
        if "WORLD_SIZE" not in env:
            return cls()
        try:
            world = cls(int(env.get("RANK", "0")), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0")))
        except ValueError:
            raise InputError(f"RANK/WORLD_SIZE/LOCAL_RANK must be integers (as torchrun sets them); got "
                             f"{env.get('RANK')!r}/{env.get('WORLD_SIZE')!r}/{env.get('LOCAL_RANK')!r}") from None
        if world.size < 1 or not 0 <= world.rank < world.size:
            raise InputError(f"RANK {world.rank} does not fit WORLD_SIZE {world.size}")
        return world

    @property
    def active(self) -> bool:
        return self.size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, device: torch.device) -> torch.device:
        """Each rank's own GPU: cuda:LOCAL_RANK when training on CUDA across ranks (the device as given otherwise)."""
        if self.active and device.type == "cuda":
            if self.local_rank >= torch.cuda.device_count():
                raise InputError(f"LOCAL_RANK {self.local_rank} has no GPU: {torch.cuda.device_count()} visible; "
                                 "start at most that many processes per node")
            return torch.device("cuda", self.local_rank)
        return device

    @contextlib.contextmanager
    def joined(self, device: torch.device):
        """The default process group for this world (gloo on the CPU, NCCL on CUDA), destroyed on the way out; joined
        through the file EAGLE_TRT_DIST_STORE names where it is set (`convert --nproc`), else torchrun's env://."""
        if not self.active or torch.distributed.is_initialized():
            yield self
            return
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        timeout = datetime.timedelta(seconds=float(os.environ.get("EAGLE_TRT_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S)))
        # `convert --nproc` names a file the ranks of one machine meet through (torch's FileStore: no TCP listener);
        # torchrun's env:// otherwise, its store on the rendezvous host the user chose.
        store = os.environ.get("EAGLE_TRT_DIST_STORE")
        init = f"file://{os.path.abspath(store)}" if store else None
        torch.distributed.init_process_group(backend, init_method=init, rank=self.rank, world_size=self.size,
                                             timeout=timeout, device_id=device if device.type == "cuda" else None)
        try:
            yield self
        finally:
            torch.distributed.destroy_process_group()

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()

    def sum(self, values: list[float], device: torch.device | None = None) -> list[float]:
        """Element-wise sum over the ranks (float64 on the wire, so summed logs do not lose digits)."""
        if not self.active:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=_collective_device(device))
        torch.distributed.all_reduce(t)
        return t.tolist()

    def broadcast_object(self, obj):
        """Rank 0's `obj` on every rank (JSON-like data only: ints, floats, strings, lists, dicts)."""
        if not self.active:
            return obj
        box = [obj if self.is_main else None]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]


def _collective_device(device: torch.device | None) -> torch.device:
    # NCCL moves CUDA tensors only; gloo moves CPU tensors.
    if torch.distributed.is_initialized() and torch.distributed.get_backend() == "nccl":
        return device if device is not None and device.type == "cuda" else torch.device("cuda")
    return torch.device("cpu")


def rank_share(global_batch: list[int], rank: int, size: int) -> list[int]:
    """This rank's part of a global batch: every size-th index from the rank's own. Strided, not chunked, so a batch of
    similar lengths (the cache is ordered by length) gives every rank about the same work. Empty when the batch has
    fewer sequences than ranks (the epoch's last batch); the caller then runs a zero-weight step."""
    return global_batch[rank::size]


def rank_span(lengths: list[int], rank: int, size: int) -> tuple[int, int]:
    """[start, end) of this rank's contiguous part of a list of sequence lengths, cut so every rank gets about the
    same number of tokens (the feature cache's forward cost). Contiguous, so the parts joined in rank order are the
    list's own order."""
    total = sum(lengths)
    bounds, acc, j = [0], 0, 0
    for r in range(1, size):
        target = total * r / size
        while j < len(lengths) and acc + lengths[j] / 2 < target:
            acc += lengths[j]
            j += 1
        bounds.append(j)
    bounds.append(len(lengths))
    return bounds[rank], bounds[rank + 1]


__all__ = ["World", "rank_share", "rank_span", "DEFAULT_TIMEOUT_S"]
