"""Choosing where tensors live: one helper, so every notebook and script picks the same way."""

from __future__ import annotations


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
