"""Module 7: scaled dot-product attention, online softmax, and FlashAttention-2 (forward and backward).

Everything here is numpy (so it also runs where PyTorch does not), written to be read next to
the papers; :func:`flash_attention` wraps the same algorithm as a ``torch.autograd.Function``.

Shapes: queries ``(..., N, D)``, keys and values ``(..., M, D)`` — any leading batch/head axes.
A boolean ``mask`` is True where attention is *allowed*; ``causal=True`` lets query ``i`` see
keys ``0..i`` (it needs N == M).
"""

from __future__ import annotations

import numpy as np


def _check_qkv(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> None:
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"q, k, v need the same rank >= 2, got shapes {q.shape}, {k.shape}, {v.shape}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2] or q.shape[:-2] != k.shape[:-2]:
        raise ValueError(
            f"incompatible shapes q {q.shape}, k {k.shape}, v {v.shape}: need q (..., N, D), "
            "k (..., M, D), v (..., M, Dv) with the same leading axes"
        )
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal attention needs as many queries as keys, got {q.shape[-2]} and {k.shape[-2]}")


def causal_mask(n: int) -> np.ndarray:
    """``n x n`` booleans, True on and below the diagonal: query i may look at keys 0..i."""
    return np.tril(np.ones((n, n), dtype=bool))


def softmax(scores: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically safe softmax: subtract the max first; a row with no allowed entry gives zeros."""
    peak = np.max(scores, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    e = np.exp(scores - peak)
    total = e.sum(axis=axis, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    causal: bool = False,
    scale: float | None = None,
    return_weights: bool = False,
):
    """Naive attention: materialise the ``N x M`` scores, softmax each row, weight the values.

    ``softmax(q k^T * scale) v`` with ``scale = 1/sqrt(D)`` by default.
    """
    q, k, v = (np.asarray(t) for t in (q, k, v))
    _check_qkv(q, k, v, causal)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ np.swapaxes(k, -1, -2) * scale
    allowed = np.ones(scores.shape[-2:], dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    if causal:
        allowed = allowed & causal_mask(q.shape[-2])
    scores = np.where(allowed, scores, -np.inf)
    weights = softmax(scores)
    out = weights @ v
    return (out, weights) if return_weights else out


def multi_head_attention(
    x: np.ndarray, wq: np.ndarray, wk: np.ndarray, wv: np.ndarray, wo: np.ndarray, n_heads: int, causal: bool = True
) -> np.ndarray:
    """Self-attention with ``n_heads`` heads on ``x`` of shape ``(..., N, C)``.

    Project to queries, keys and values (``C x C`` each), split the channels into heads of
    ``C / n_heads``, attend in every head independently, concatenate, project with ``wo``.
    """
    *lead, n, c = x.shape
    if c % n_heads:
        raise ValueError(f"{c} channels do not split into {n_heads} heads")

    def heads(t: np.ndarray) -> np.ndarray:  # (..., N, C) -> (..., H, N, C/H)
        return np.swapaxes(t.reshape(*lead, n, n_heads, c // n_heads), -2, -3)

    out = attention(heads(x @ wq), heads(x @ wk), heads(x @ wv), causal=causal)
    return np.swapaxes(out, -2, -3).reshape(*lead, n, c) @ wo


# --- online softmax ---------------------------------------------------------------------------


def safe_softmax_passes(x: np.ndarray) -> tuple[np.ndarray, int]:
    """The textbook stable softmax as three passes over the input: max, sum of exps, normalise.

    Returns the probabilities and the number of times an input element was read.
    """
    reads, peak = 0, -np.inf
    for value in x:  # pass 1: the maximum
        peak, reads = max(peak, value), reads + 1
    total = 0.0
    for value in x:  # pass 2: the denominator
        total, reads = total + np.exp(value - peak), reads + 1
    out = np.empty(len(x))
    for i, value in enumerate(x):  # pass 3: normalise
        out[i], reads = np.exp(value - peak) / total, reads + 1
    return out, reads


def online_softmax_update(peak: float, total: float, value: float) -> tuple[float, float]:
    """One step of the Milakov–Gimelshein recurrence: fold ``value`` into (running max, running sum).

    When the max grows, the sum so far was of ``exp(x - old max)``; multiplying by
    ``exp(old max - new max)`` rescales it to the new max.
    """
    new_peak = max(peak, value)
    return new_peak, total * np.exp(peak - new_peak) + np.exp(value - new_peak)


def online_softmax_passes(x: np.ndarray) -> tuple[np.ndarray, int]:
    """Softmax in two passes: max and denominator together in one, then normalise."""
    reads, peak, total = 0, -np.inf, 0.0
    for value in x:
        peak, total = online_softmax_update(peak, total, value)
        reads += 1
    out = np.empty(len(x))
    for i, value in enumerate(x):
        out[i], reads = np.exp(value - peak) / total, reads + 1
    return out, reads


# --- FlashAttention-2 -------------------------------------------------------------------------


def _tile_scores(q_rows: np.ndarray, k_cols: np.ndarray, rows: slice, cols: slice, causal: bool) -> np.ndarray:
    """One ``Br x Bc`` tile of scores (``q_rows`` already scaled), future keys set to -inf."""
    s = q_rows @ np.swapaxes(k_cols, -1, -2)
    if causal:
        s = np.where(np.arange(rows.start, rows.stop)[:, None] >= np.arange(cols.start, cols.stop), s, -np.inf)
    return s


def _blocks(n: int, size: int) -> list[slice]:
    if size < 1:
        raise ValueError(f"block size must be >= 1, got {size}")
    return [slice(s, min(s + size, n)) for s in range(0, n, size)]


def flash_attention_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    causal: bool = False,
    block_q: int = 16,
    block_k: int = 16,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """FlashAttention-2 forward: returns the output and the per-row logsumexp ``L`` (shape ``(..., N)``).

    For each block of ``block_q`` queries, walk the keys/values in blocks of ``block_k`` keeping
    only a running row max ``m``, running denominator ``l`` and unnormalised output ``acc``
    (online softmax, rescaled when ``m`` grows). The ``N x M`` score matrix never exists: the
    extra memory is one ``block_q x block_k`` tile plus O(N) statistics.
    """
    q, k, v = (np.asarray(t, dtype=np.result_type(q, k, v, np.float32)) for t in (q, k, v))
    _check_qkv(q, k, v, causal)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    n, m_keys = q.shape[-2], k.shape[-2]
    out = np.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    lse = np.empty(q.shape[:-1], dtype=q.dtype)
    for rows in _blocks(n, block_q):
        qi = q[..., rows, :] * scale
        peak = np.full(qi.shape[:-1], -np.inf, dtype=q.dtype)
        total = np.zeros(qi.shape[:-1], dtype=q.dtype)
        acc = np.zeros(qi.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for cols in _blocks(m_keys, block_k):
            if causal and cols.start > rows.stop - 1:
                break  # every key in this block and after it is in the future of every query
            s = _tile_scores(qi, k[..., cols, :], rows, cols, causal)
            new_peak = np.maximum(peak, s.max(axis=-1))
            p = np.exp(s - new_peak[..., None])
            correction = np.exp(peak - new_peak)
            total = total * correction + p.sum(axis=-1)
            acc = acc * correction[..., None] + p @ v[..., cols, :]
            peak = new_peak
        out[..., rows, :] = acc / total[..., None]
        lse[..., rows] = peak + np.log(total)
    return out, lse


def flash_attention_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
    dout: np.ndarray,
    causal: bool = False,
    block_q: int = 16,
    block_k: int = 16,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FlashAttention-2 backward from only ``out`` and ``lse``: recompute each probability tile
    as ``exp(s - lse)`` instead of storing the ``N x M`` matrix.

    With ``Delta = rowsum(dout * out)``: ``dV += P^T dO``, ``dP = dO V^T``,
    ``dS = P * (dP - Delta)``, ``dQ += dS K * scale``, ``dK += dS^T Q * scale``.
    """
    _check_qkv(q, k, v, causal)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    n, m_keys = q.shape[-2], k.shape[-2]
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    delta = np.sum(dout * out, axis=-1)
    for cols in _blocks(m_keys, block_k):
        kj, vj = k[..., cols, :], v[..., cols, :]
        for rows in _blocks(n, block_q):
            if causal and cols.start > rows.stop - 1:
                continue
            s = _tile_scores(q[..., rows, :] * scale, kj, rows, cols, causal)
            p = np.exp(s - lse[..., rows, None])
            do = dout[..., rows, :]
            dv[..., cols, :] += np.swapaxes(p, -1, -2) @ do
            ds = p * (do @ np.swapaxes(vj, -1, -2) - delta[..., rows, None])
            dq[..., rows, :] += ds @ kj * scale
            dk[..., cols, :] += np.swapaxes(ds, -1, -2) @ q[..., rows, :] * scale
    return dq, dk, dv


def flash_attention(q, k, v, causal: bool = False, block_q: int = 16, block_k: int = 16):
    """FlashAttention-2 as a PyTorch op: forward and backward above, saving only the output and
    the logsumexp (shape ``(..., N)``) for the backward pass."""
    return _flash_function().apply(q, k, v, causal, block_q, block_k)


_FLASH = None


def _flash_function():
    global _FLASH
    if _FLASH is None:
        import torch

        class FlashAttention(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, causal, block_q, block_k):
                out, lse = flash_attention_forward(
                    *(t.detach().cpu().numpy() for t in (q, k, v)), causal=causal, block_q=block_q, block_k=block_k
                )
                out_t, lse_t = torch.from_numpy(out).to(q.device), torch.from_numpy(lse).to(q.device)
                ctx.save_for_backward(q, k, v, out_t, lse_t)
                ctx.options = (causal, block_q, block_k)
                return out_t

            @staticmethod
            def backward(ctx, dout):
                causal, block_q, block_k = ctx.options
                arrays = [t.detach().cpu().numpy() for t in (*ctx.saved_tensors, dout.contiguous())]
                grads = flash_attention_backward(*arrays, causal=causal, block_q=block_q, block_k=block_k)
                device = ctx.saved_tensors[0].device
                return (*(torch.from_numpy(g).to(device) for g in grads), None, None, None)

        _FLASH = FlashAttention
    return _FLASH
