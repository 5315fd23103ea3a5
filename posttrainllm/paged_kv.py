"""A paged KV cache's block allocator, and what it saves over contiguous reservation (the inference
and serving chapter, ``book/inference-serving.md``).

A server keeps each running request's keys and values until the request ends. Before vLLM
(Kwon et al., *Efficient Memory Management for Large Language Model Serving with
PagedAttention*, 2023), a server reserved one contiguous region per request, big enough for the
longest output the request might produce. The part of that region never reached is internal
fragmentation; the gaps between regions of different sizes are external fragmentation.
PagedAttention stores the cache in fixed-size *blocks* of ``block_size`` tokens, found through a
per-request *block table*, as an operating system maps pages. A request then holds only the
blocks its tokens fill, plus at most one partly filled block.

:class:`BlockAllocator` is such an allocator, in token slots rather than bytes;
:func:`simulate` replays a request trace against it and against contiguous reservation in the
same pool, and counts what each keeps in memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


class OutOfBlocks(RuntimeError):
    """The pool has no free block left for a request that needs one."""


class BlockAllocator:
    """A pool of ``num_blocks`` blocks of ``block_size`` token slots, handed out one at a time."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one slot, got {num_blocks} x {block_size}")
        self.block_size = block_size
        self.free = list(range(num_blocks - 1, -1, -1))  # a stack: the lowest-numbered block is handed out first
        self.tables: dict[int, list[int]] = {}  # request id -> its blocks, in token order
        self.lengths: dict[int, int] = {}  # request id -> tokens stored

    def append(self, request: int, tokens: int = 1) -> None:
        """Store ``tokens`` more tokens for ``request``, taking new blocks as the last one fills."""
        table, length = self.tables.setdefault(request, []), self.lengths.get(request, 0)
        needed = math.ceil((length + tokens) / self.block_size) - len(table)
        if needed > len(self.free):
            raise OutOfBlocks(f"request {request} needs {needed} more block(s) of {self.block_size} tokens; "
                              f"{len(self.free)} free")
        table.extend(self.free.pop() for _ in range(needed))
        self.lengths[request] = length + tokens

    def release(self, request: int) -> None:
        """The request has finished: its blocks go back to the pool."""
        if request not in self.tables:
            raise KeyError(f"request {request} holds no blocks")
        self.free.extend(reversed(self.tables.pop(request)))
        del self.lengths[request]

    def slot(self, request: int, position: int) -> int:
        """Where token ``position`` of ``request`` lives in the pool: block number times block size plus
        the offset in the block (what the attention kernel reads through the block table)."""
        if not 0 <= position < self.lengths.get(request, 0):
            raise IndexError(f"request {request} has no token {position}")
        return self.tables[request][position // self.block_size] * self.block_size + position % self.block_size

    @property
    def reserved_slots(self) -> int:
        return sum(len(t) for t in self.tables.values()) * self.block_size

    @property
    def used_slots(self) -> int:
        return sum(self.lengths.values())


@dataclass(frozen=True)
class Request:
    prompt: int  # tokens in the prompt
    output: int  # tokens it will generate before it stops
    max_output: int  # the limit the server must assume it could reach


def request_trace(n: int, seed: int = 0, max_output: int = 512) -> list[Request]:
    """``n`` requests with log-normal prompt lengths (median 64) and output lengths (median 96),
    clipped to ``max_output``: most answers are short, a few are long, as in chat traffic."""
    rng = np.random.default_rng(seed)
    prompts = np.clip(rng.lognormal(np.log(64), 0.8, n), 4, 1024).astype(int)
    outputs = np.clip(rng.lognormal(np.log(96), 0.9, n), 1, max_output).astype(int)
    return [Request(int(p), int(o), max_output) for p, o in zip(prompts, outputs, strict=True)]


@dataclass(frozen=True)
class Occupancy:
    scheme: str
    mean_running: float  # requests decoding at once, averaged over steps
    utilisation: float  # of the slots held, the fraction holding a real token (averaged over steps)
    steps: int  # decode steps to finish the whole trace
    preemptions: int  # requests evicted to free blocks and later recomputed (paged only)


def _admit(waiting: list[int], running: dict[int, int], take) -> None:
    while waiting and take(waiting[0]):  # first come, first served: nobody overtakes the head
        running[waiting.pop(0)] = 0


def simulate(trace: list[Request], pool_tokens: int, block_size: int | None) -> Occupancy:
    """Serve ``trace`` first come, first served from a pool of ``pool_tokens`` KV slots, one token per
    running request per step, and report the occupancy.

    ``block_size=None`` reserves ``prompt + max_output`` contiguous slots per request when it is
    admitted. Otherwise a :class:`BlockAllocator` hands out blocks as tokens arrive; a request is
    admitted when its prompt's blocks and one more are free, and when a running request needs a
    block and none is free, the most recently admitted request is preempted (its blocks freed, its
    work redone later from the prompt), as vLLM does by recomputation."""
    waiting, running, step, preemptions = list(range(len(trace))), {}, 0, 0
    running_sum, utilisation_sum = 0, 0.0
    held = 0  # contiguous: slots reserved
    allocator = BlockAllocator(pool_tokens // block_size, block_size) if block_size else None

    def take(i: int) -> bool:
        nonlocal held
        r = trace[i]
        if allocator is None:
            if held + r.prompt + r.max_output > pool_tokens:
                return False
            held += r.prompt + r.max_output
        else:
            if math.ceil(r.prompt / block_size) + 1 > len(allocator.free):
                return False
            allocator.append(i, r.prompt)
        return True

    while waiting or running:
        _admit(waiting, running, take)
        if not running:
            raise ValueError(f"a request needs more than the whole pool of {pool_tokens} slots")
        for i in sorted(running):  # one decode step: every running request writes one token
            if i not in running:
                continue  # preempted earlier in this step
            if block_size is not None:
                while i in running:
                    try:
                        allocator.append(i)
                        break
                    except OutOfBlocks:
                        victim = max(running)
                        allocator.release(victim)
                        del running[victim]
                        waiting.insert(0, victim)
                        preemptions += 1
                if i not in running:
                    continue
            running[i] += 1
        used = sum(trace[i].prompt + t for i, t in running.items())
        reserved = held if block_size is None else allocator.reserved_slots
        running_sum, utilisation_sum, step = running_sum + len(running), utilisation_sum + used / reserved, step + 1
        for i in [i for i, t in running.items() if t == trace[i].output]:
            del running[i]
            if block_size is None:
                held -= trace[i].prompt + trace[i].max_output
            else:
                allocator.release(i)
    scheme = "contiguous, reserve the maximum" if block_size is None else f"paged, blocks of {block_size}"
    return Occupancy(scheme, running_sum / step, utilisation_sum / step, step, preemptions)
