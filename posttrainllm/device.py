"""Choosing where tensors live: one helper, so every notebook and script picks the same way.

The library's functions (``train``, ``evaluate``, ``generate``...) run a model where it already is,
unless a ``device`` argument or ``POSTTRAINLLM_DEVICE`` (``auto``, ``cuda``, ``cuda:1``, ``mps``) says
otherwise. They borrow that device: the model (and an optimizer's state) go there for the call and
come back where they were, so the cells around the call, which make their tensors on the CPU, run
unchanged. The book's models are built on the CPU and the notebooks' stored outputs are CPU
outputs; ``POSTTRAINLLM_DEVICE=auto`` moves the training, evaluation and decoding those functions do
to a GPU, not the cells that call a model directly. A model you move yourself (``model.to("cuda")``)
stays there. The torchrun trainer (:mod:`posttrainllm.pretrain`) defaults to ``auto``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

ENV = "POSTTRAINLLM_DEVICE"


def available_devices() -> list[str]:
    import torch

    found = ["cpu"]
    if torch.cuda.is_available():
        found.append("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        found.append("mps")
    return found


def resolve_device(name: str = "auto") -> str:
    """``"auto"`` picks CUDA, then Apple MPS, then the CPU; a named device must exist.

    >>> resolve_device("cpu")
    'cpu'
    """
    found = available_devices()
    if name == "auto":
        return next(d for d in ("cuda", "mps", "cpu") if d in found)
    kind = name.split(":", 1)[0]
    if kind not in ("cpu", "cuda", "mps"):
        raise ValueError(f"unknown device {name!r}: use 'auto', 'cpu', 'cuda' or 'mps'")
    if kind not in found:
        raise ValueError(f"device {name!r} is not available on this machine (available: {', '.join(found)})")
    return name


def place(model, device: str | None):
    """Move ``model`` (in place) to ``device`` and return the device's name. ``None`` means
    ``POSTTRAINLLM_DEVICE`` when it is set, else wherever the model already is (a model the caller
    moved to a GPU stays there). Apple's MPS has no float64, the dtype of the book's own models:
    that is said, not crashed on."""
    import torch

    first = next(model.parameters(), None)
    if device is None:
        device = os.environ.get(ENV) or (str(first.device) if first is not None else "cpu")
    device = resolve_device(device)
    if device.startswith("mps") and first is not None and first.dtype == torch.float64:
        raise ValueError("MPS has no float64 and this model is float64: convert it with model.float() first, "
                         "or use device='cpu'")
    model.to(device)
    return device


def _move_state(optimizer, device) -> None:
    """An optimizer's per-parameter tensors (Adam's moments) follow their parameters. ``step``
    stays where it is: PyTorch keeps it on the CPU unless the optimizer is capturable or fused."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if key != "step" and hasattr(value, "to"):
                state[key] = value.to(device)


@contextmanager
def borrowed(model, device: str | None, optimizer=None) -> Iterator[str]:
    """Run the ``with`` body with ``model`` (and ``optimizer``'s state) on ``device`` (chosen as
    :func:`place` chooses), then put them back where they were, even when the body raises."""
    first = next(model.parameters(), None)
    home = first.device if first is not None else None
    device = place(model, device)
    if optimizer is not None:
        _move_state(optimizer, device)
    try:
        yield device
    finally:
        if home is not None and next(model.parameters()).device != home:
            model.to(home)
            if optimizer is not None:
                _move_state(optimizer, home)
