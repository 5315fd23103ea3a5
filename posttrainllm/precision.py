"""Module 3 (finished in module 8): fp16 as a number format, and what rounding does to a sum.

An IEEE half-precision number has 1 sign bit, 5 exponent bits and 10 fraction bits:

    sign | exponent (5) | fraction (10)
      s  |   e e e e e  | f f f f f f f f f f       value = (-1)^s * 2^(e-15) * 1.f   (0 < e < 31)
                                                     value = (-1)^s * 2^(-14) * 0.f   (e = 0: subnormal)

so it holds about 3 decimal digits, its largest finite value is 65504, and the smallest
positive number is 2^-24 (a subnormal). Mixed-precision training (module 8) is built around
those three facts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Fp16Fields:
    sign: int
    exponent: int  # the stored 5-bit field, biased by 15
    fraction: int  # the stored 10-bit field
    kind: str  # "normal", "subnormal", "zero", "inf" or "nan"

    @property
    def bits(self) -> str:
        return f"{self.sign:01b} {self.exponent:05b} {self.fraction:010b}"


def fp16_fields(x: float) -> Fp16Fields:
    """The three fields of ``x`` rounded to fp16: ``fp16_fields(1.0).bits == '0 01111 0000000000'``."""
    with np.errstate(over="ignore"):  # a value past 65504 becoming inf is the lesson, not an accident
        raw = int(np.array(x, dtype=np.float16).view(np.uint16))
    sign, exponent, fraction = raw >> 15, (raw >> 10) & 0x1F, raw & 0x3FF
    if exponent == 0x1F:
        kind = "nan" if fraction else "inf"
    elif exponent == 0:
        kind = "subnormal" if fraction else "zero"
    else:
        kind = "normal"
    return Fp16Fields(sign, exponent, fraction, kind)


def fp16_value(fields: Fp16Fields) -> float:
    """Rebuild the number from its fields with the formula in the module docstring."""
    sign = -1.0 if fields.sign else 1.0
    if fields.kind == "inf":
        return sign * float("inf")
    if fields.kind == "nan":
        return float("nan")
    if fields.exponent == 0:
        return sign * 2.0**-14 * (fields.fraction / 1024)
    return sign * 2.0 ** (fields.exponent - 15) * (1 + fields.fraction / 1024)


def spacing(x: float, dtype=np.float16) -> float:
    """The gap from ``x`` to the next representable number above it in ``dtype``.

    In fp16 it is 2^-10 at 1, 1 at 1024, and 32 at 32768: precision is relative, not absolute.
    """
    return float(np.spacing(np.array(abs(x), dtype=dtype)))


def sum_sequential(values: np.ndarray, dtype=np.float16) -> float:
    """Add left to right with the running total held in ``dtype`` (a naive accumulator)."""
    total = np.zeros((), dtype=dtype)
    for v in np.asarray(values, dtype=dtype):
        total = (total + v).astype(dtype)
    return float(total)


def sum_kahan(values: np.ndarray, dtype=np.float16) -> float:
    """Compensated (Kahan) summation in ``dtype``: carry the rounding error of each add forward."""
    total = np.zeros((), dtype=dtype)
    carry = np.zeros((), dtype=dtype)
    for v in np.asarray(values, dtype=dtype):
        y = (v - carry).astype(dtype)
        t = (total + y).astype(dtype)
        carry = ((t - total) - y).astype(dtype)
        total = t
    return float(total)


def sum_fp32_accumulate(values: np.ndarray, dtype=np.float16) -> float:
    """Store in ``dtype`` but accumulate in fp32, then round once: what GPU matmul units do."""
    return float(np.asarray(values, dtype=dtype).astype(np.float32).sum(dtype=np.float32).astype(dtype))


def underflow_fraction(values: np.ndarray, scale: float = 1.0, dtype=np.float16) -> float:
    """Share of non-zero ``values * scale`` that round to zero in ``dtype`` (lost gradients)."""
    values = np.asarray(values, dtype=np.float64)
    nonzero = values != 0
    rounded = (values[nonzero] * scale).astype(dtype)
    return float(np.mean(rounded == 0)) if nonzero.any() else 0.0
