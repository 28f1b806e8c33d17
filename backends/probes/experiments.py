"""The probe (or the emulator) as a tiny GEMM, the "where did each element go" experiment, and test inputs
with one right answer (exact products and sums) plus the reference D and a loose error bound."""

from __future__ import annotations

import numpy as np

from mxcore import dtypes as _dt
from mxcore.errors import UnsupportedError

from .common import family
from .registers import slots

__all__ = ["arange_probe", "error_bound", "exact_grid", "exact_values", "random_values", "reference_d",
           "run_matrices", "where_elements"]


def run_matrices(layout, a, b, c, *, scale_a=None, scale_b=None, device: str = "emulate") -> np.ndarray:
    """D = A·B + C through one instruction: ``a`` (M×K), ``b`` (K×N), ``c`` (M×N) are float values exactly
    representable in the layout's formats; ``scale_a``/``scale_b`` E8M0 codes (M×K/32, K/32×N) for the
    scaled MFMAs.  The matrices are scattered by the table, run on ``device`` ("cuda", "hip" or "emulate":
    mxcore.emulate.execute) and D is gathered back by the table; returns float64 (M×N)."""
    from mxcore import emulate

    regs = [slots(layout, r, x) for r, x in (("a", a), ("b", b), ("c", c))]
    scales = {}
    if getattr(layout, "scale_a", None) is not None:
        if scale_a is None or scale_b is None:
            raise UnsupportedError(f"{layout.name} is block-scaled: pass scale_a and scale_b (E8M0 codes)")
        scales = {"scale_a": emulate.scatter(layout, "scale_a", np.asarray(scale_a, dtype=np.uint8)),
                  "scale_b": emulate.scatter(layout, "scale_b", np.asarray(scale_b, dtype=np.uint8))}
    if device == "emulate":
        d = emulate.execute(layout, *regs, **scales)
    else:
        fam = family(layout)
        if device != fam.DEVICE:
            raise UnsupportedError(f"device {device!r}: {layout.name} runs on {fam.DEVICE!r} (or 'emulate')")
        d = fam.run(layout, *regs, **scales)
    return np.asarray(emulate.gather(layout, "c", np.asarray(d, dtype=np.float64)), dtype=np.float64)


# ---- the arange experiment: where did each element go? -----------------------------------------------------------
def _exact_integers(fmt: str, n: int) -> bool:
    """Whether registers of ``fmt`` hold every integer 0..n-1 as a value (significand bits incl. the implicit one)."""
    from mxcore import formats

    return not _dt.holds_codes(fmt) and n <= (1 << (formats.get(fmt).mbits + 1)) + 1


def arange_probe(layout, operand_name: str, run) -> np.ndarray:
    """Find where each element of A (or B) went.  Returns ``where`` (rows×cols): the row-major index of the
    element the instruction actually used in each position -- equal to arange exactly when the table is right
    (-1 where D held no single element).

    The index goes into the operand directly when its format (and C's) holds 0..N-1 exactly (fp32, tf32,
    fp16, small bf16 tiles); otherwise bit by bit (one run per bit, values 0/1, exact in every format).  The
    partner is identity-like (A: B[k, j] = 1 iff k == j + off; B: A[i, k] = 1 iff k == i + off; off steps
    through K), C is zero, and the index is read back from D.  ``run(a, b, c) -> d`` multiplies matrices of
    values through the instruction (``lambda a, b, c: run_matrices(layout, a, b, c, device="cuda")``)."""
    m, n, k = layout.m, layout.n, layout.k
    rows, cols = (m, k) if operand_name == "a" else (k, n)
    count = rows * cols
    index = np.arange(count, dtype=np.int64).reshape(rows, cols)
    fmt = getattr(layout, f"{operand_name}_format")
    direct = _exact_integers(fmt, count) and _exact_integers(layout.c_format, count)
    planes = [None] if direct else list(range(max(1, int(count - 1).bit_length())))
    where = np.zeros((rows, cols), dtype=np.int64)
    bad = np.zeros((rows, cols), dtype=bool)
    c = np.zeros((m, n))
    step = n if operand_name == "a" else m
    for plane in planes:
        values = (index if plane is None else (index >> plane) & 1).astype(np.float64)
        for off in range(0, k, step):
            width = min(step, k - off)
            if operand_name == "a":  # D[i, j] = A[i, j + off]
                partner = np.zeros((k, n))
                partner[off + np.arange(width), np.arange(width)] = 1.0
                got = run(values, partner, c)[:, :width]
                dst = (slice(None), slice(off, off + width))
            else:  # D[i, j] = B[i + off, j]
                partner = np.zeros((m, k))
                partner[np.arange(width), off + np.arange(width)] = 1.0
                got = run(partner, values, c)[:width, :]
                dst = (slice(off, off + width), slice(None))
            ok = np.isfinite(got) & (got == np.round(got)) & (got >= 0) & ((plane is None) | (got <= 1))
            vals = np.where(ok, got, 0).astype(np.int64)
            bad[dst] |= ~ok
            if plane is None:
                where[dst] = vals
            else:
                where[dst] |= vals << plane
    where[bad] = -1
    return where


def where_elements(layout, operand_name: str, where) -> list[str]:
    """The disagreements between the table and what the instruction did (empty when they agree): for each
    element, the (lane, slot) the hardware read it from versus the table's (lane, slot)."""
    op = getattr(layout, operand_name)
    rows, cols = where.shape
    out = []
    for r in range(rows):
        for c in range(cols):
            e = int(where[r, c])
            if e == r * cols + c:
                continue
            table = tuple(int(x) for x in op.inverse[r, c])
            if 0 <= e < rows * cols:
                lane, slot = (int(x) for x in op.inverse[e // cols, e % cols])
                out.append(f"{operand_name.upper()}[{r},{c}]: the instruction reads it from lane {lane} slot {slot}; "
                           f"the table says lane {table[0]} slot {table[1]}")
            else:
                out.append(f"{operand_name.upper()}[{r},{c}]: D held no single element there; the table says "
                           f"lane {table[0]} slot {table[1]}")
    return out


# ---- test inputs and the reference ---------------------------------------------------------------------------------
def _finite_values(fmt: str) -> np.ndarray:
    from mxcore import formats

    spec = formats.get(fmt)
    vals = np.asarray(formats.decode(np.arange(1 << spec.bits, dtype=np.uint8), fmt), dtype=np.float64)
    return np.unique(vals[np.isfinite(vals)])


def exact_values(fmt: str, shape, rng, *, grid: int = 8, vmax: float = 8.0) -> np.ndarray:
    """Random values of ``fmt`` that are multiples of 1/grid with |v| <= vmax (zero included), so that
    products and short sums of them are exact in fp32: D = A·B + C then has one right answer."""
    cand = np.arange(-int(vmax * grid), int(vmax * grid) + 1) / grid
    from mxcore import formats

    keep = cand[formats.round_to(cand, fmt) == cand]
    return rng.choice(keep, size=shape)


def random_values(fmt: str, shape, rng) -> np.ndarray:
    """Random finite values of ``fmt``: any finite code for the <= 8-bit formats, rounded normals otherwise."""
    from mxcore import formats

    if _dt.holds_codes(fmt):
        return rng.choice(_finite_values(fmt), size=shape)
    return formats.round_to(rng.standard_normal(shape) * 4.0, fmt).astype(np.float64)


def exact_grid(layout) -> dict:
    """exact_values() settings for ``layout``: every D = A·B + C exact in C's format."""
    if layout.c_format == "fp16":
        return {"grid": 2, "vmax": 2.0}
    if getattr(layout, "scale_a", None) is not None:
        return {"grid": 8, "vmax": 4.0}
    return {"grid": 8, "vmax": 8.0}


def reference_d(layout, a, b, c, *, scale_a=None, scale_b=None) -> np.ndarray:
    """D = A·B + C from the decoded values, exact products and float64 sum (mxcore.reference's model), one
    rounding to C's format.  ``scale_a`` (M×K/32) and ``scale_b`` (K/32×N) E8M0 codes scale 32-K blocks."""
    from mxcore.reference import round_output

    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if scale_a is not None:
        sa = np.exp2(np.asarray(scale_a, dtype=np.float64) - 127.0)
        a64 = a64 * np.repeat(sa, layout.k // sa.shape[1], axis=1)
    if scale_b is not None:
        sb = np.exp2(np.asarray(scale_b, dtype=np.float64) - 127.0)
        b64 = b64 * np.repeat(sb, layout.k // sb.shape[0], axis=0)
    d = a64 @ b64 + np.asarray(c, dtype=np.float64)
    return round_output(d, "float32" if layout.c_format == "fp32" else "float16").astype(np.float64)


def error_bound(layout, a, b, c, *, scale_a=None, scale_b=None) -> np.ndarray:
    """A loose per-element bound for |hardware - reference| on arbitrary inputs: (K + 2) units of C's last
    place on the sum of magnitudes (fp32 accumulators: 2^-23; fp16: 2^-10).  Matrix cores differ in
    summation order and in how they round partial sums; layout errors are far larger than this."""
    ulp = 2.0 ** (-23 if layout.c_format == "fp32" else -10)
    mag = reference_d(layout, np.abs(a), np.abs(b), np.abs(c), scale_a=scale_a, scale_b=scale_b)
    return (layout.k + 2) * ulp * np.abs(mag) + 2.0 ** -126
