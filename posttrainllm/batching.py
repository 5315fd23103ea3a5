"""Static against continuous batching, simulated on a request trace (the inference and serving
chapter, ``book/inference-serving.md``).

A decode step of a batch costs about the same whether it holds one sequence or sixteen: it is
dominated by reading the weights (see the roofline in the same chapter). So a server wants every
step full. *Static* batching takes up to ``max_batch`` waiting requests, decodes until the longest
of them is done, and returns them together; a slot whose request finished early idles until
then, and requests that arrive meanwhile wait for the next batch. *Continuous* (iteration-level)
batching (Yu et al., *Orca*, OSDI 2022) re-forms the batch at every step: a finished request
leaves at once and a waiting one takes its slot.

The simulation runs in seconds of a cost model ``step_seconds(batch)``, which the chapter
measures on the book's base model; prompts are ignored (no prefill), so the difference is the
scheduling alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Arrival:
    time: float  # seconds after the trace starts
    output: int  # tokens to generate


def poisson_trace(n: int, rate: float, seed: int = 0, median_output: int = 96, max_output: int = 512) -> list[Arrival]:
    """``n`` requests arriving as a Poisson process of ``rate`` per second, with log-normal output
    lengths (median ``median_output``, clipped to ``max_output``)."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1 / rate, n))
    outputs = np.clip(rng.lognormal(np.log(median_output), 0.9, n), 1, max_output).astype(int)
    return [Arrival(float(t), int(o)) for t, o in zip(times, outputs, strict=True)]


@dataclass(frozen=True)
class Served:
    scheme: str
    tokens_per_s: float  # output tokens over the time from the first arrival to the last completion
    p50_s: float  # latency, arrival to the response being returned
    p99_s: float
    mean_batch: float  # sequences in a step, averaged over steps (idle slots of static batches count)
    useful: float  # of the rows computed, the fraction that produced a token someone asked for


def _served(scheme: str, trace: list[Arrival], done: list[float], now: float, batches: list[int]) -> Served:
    latency = np.array(done) - np.array([a.time for a in trace])
    tokens = sum(a.output for a in trace)
    return Served(scheme, float(tokens / (now - trace[0].time)), float(np.percentile(latency, 50)),
                  float(np.percentile(latency, 99)), float(np.mean(batches)), tokens / sum(batches))


def static(trace: list[Arrival], max_batch: int, step_seconds: Callable[[int], float]) -> Served:
    """Up to ``max_batch`` requests that have arrived start together and return together when the
    longest is done; the batch keeps its size (finished rows are padding) until then."""
    done, batches, now, i = [0.0] * len(trace), [], 0.0, 0
    while i < len(trace):
        now = max(now, trace[i].time)
        members = [j for j in range(i, min(i + max_batch, len(trace))) if trace[j].time <= now]
        steps = max(trace[j].output for j in members)
        now += steps * step_seconds(len(members))
        batches += [len(members)] * steps
        for j in members:
            done[j] = now
        i += len(members)
    return _served(f"static, up to {max_batch}", trace, done, now, batches)


def continuous(trace: list[Arrival], max_batch: int, step_seconds: Callable[[int], float]) -> Served:
    """At every step, requests that have arrived fill free slots (first come, first served), and
    each running request returns as soon as its own last token is out."""
    done, batches, now, i = [0.0] * len(trace), [], 0.0, 0
    running: dict[int, int] = {}  # request -> tokens still to generate
    while i < len(trace) or running:
        if not running:
            now = max(now, trace[i].time)
        while i < len(trace) and trace[i].time <= now and len(running) < max_batch:
            running[i] = trace[i].output
            i += 1
        now += step_seconds(len(running))
        batches.append(len(running))
        for j in list(running):
            running[j] -= 1
            if running[j] == 0:
                done[j] = now
                del running[j]
    return _served(f"continuous, up to {max_batch}", trace, done, now, batches)
