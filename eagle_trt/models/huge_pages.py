"""Weight memory in transparent huge pages (2 MiB), where the kernel grants them.

Decoding streams every weight once per token, so its speed is the rate at which a core pulls weight bytes from
DRAM. In 4 KiB pages a 1 GB model spans 250k pages: every page costs a TLB walk, and a core's prefetchers stop at
each page boundary and start again on the next. In 2 MiB pages both go away (docs/bench.md, "Weights in huge
pages", has the measured difference). Linux hands anonymous memory huge pages when the mapping asks for them
(`MADV_HUGEPAGE`, honoured in the kernel's default `madvise` mode); a file mapping gets them only where the page
cache happens to hold the file in 2 MiB folios (recent kernels on ext4 map those whole), which depends on how the
file was last written or read. So the runtime can copy its weights into such memory instead of mapping the file.

When: the copy costs start-up time (the bytes copied, the fresh pages the kernel must clear; on a virtual machine
that hands freed memory back to its host, every fresh 2 MiB page is faulted in again from the host, seconds per
GB), which a long-lived process wins back within its first minutes of decoding and a one-shot `run` of a few
hundred tokens may not. So the commands that decode for long (`serve`, `bench`, `tune`) ask for the arena (`prefer`) and
the rest read through the mapping; EAGLE_TRT_HUGE_PAGES=1 or 0 decides for every command (A/B runs, or a long `run`).

Invariant: an arena is zero-filled anonymous memory, starting at a 2 MiB boundary (so at the 64-byte alignment the
kernels want), owned by the tensors viewing it (torch keeps the mapping alive while any view lives). Where huge
pages are not available (another OS, THP `never`) the same memory comes in small pages: slower, never wrong.
"""

from __future__ import annotations

import mmap
import os

import torch

from eagle_trt.errors import InputError

HUGE = 2 << 20
_preferred = False


def prefer() -> None:
    """This process decodes for long: weights read from the weight cache go into an arena unless
    EAGLE_TRT_HUGE_PAGES=0."""
    global _preferred
    _preferred = True


def enabled() -> bool:
    """Whether weights read now go into an arena: EAGLE_TRT_HUGE_PAGES (1 or 0) when set, else `prefer`'s choice."""
    value = os.environ.get("EAGLE_TRT_HUGE_PAGES", "").strip()
    if not value:
        return _preferred
    if value not in ("0", "1"):
        raise InputError(f"EAGLE_TRT_HUGE_PAGES={value!r}: use 1 (weights in huge pages), 0 (a file mapping) or "
                         "leave it unset (huge pages for serve, bench and tune)")
    return value == "1"


def arena(nbytes: int) -> torch.Tensor:
    """A zero-filled uint8 tensor of nbytes in anonymous memory that asks for huge pages, starting at a 2 MiB
    boundary."""
    size = max(nbytes, 1) + HUGE  # room to move the start to a 2 MiB boundary
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            m.madvise(advice)
        except OSError:  # a kernel without THP: small pages
            pass
    whole = torch.frombuffer(m, dtype=torch.uint8)
    start = -whole.data_ptr() % HUGE
    return whole[start:start + nbytes]

