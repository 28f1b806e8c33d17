"""Host side of the operands: what the kernel reads for a prepared operand, and fp8 re-encoding.

fp8 encodings: ``dtype="fp8"`` means e4m3fnuz on gfx942 and e4m3fn (OCP) on gfx950 (decided by
:func:`mxcore.dtypes.resolve`).  Bytes of the other encoding are refused with an error naming both, unless
``HipBackend.matmul(..., fp8_convert=True)`` (or :func:`convert_fp8`): values are decoded and re-encoded
(RNE), exact wherever the target can hold the value.  What is not exact:

* OCP e4m3fn -> e4m3fnuz: magnitudes in (240, 448] saturate to +-240 (FNUZ max); -0 becomes +0.
* e4m3fnuz -> OCP e4m3fn: FNUZ subnormals that are odd multiples of 2^-10 round to OCP's 2^-9 grid.
* OCP e5m2 -> e5m2fnuz: +-inf becomes NaN (0x80, FNUZ has no inf); -0 becomes +0.
* e5m2fnuz -> OCP e5m2: odd multiples of 2^-17 round to OCP's 2^-16 grid.
* NaN becomes the target's NaN code (0x80 in FNUZ).
"""

from __future__ import annotations

import numpy as np

from ... import formats
from ...errors import FormatError, UnsupportedError

__all__ = ["K_PAD", "convert_fp8", "fp8_input_convert", "operand_storage", "pack_k"]

K_PAD = 64  # packed (sub-byte) rows hold K rounded up to this many codes (zeros): whole 16-byte vectors


def _fp8_peer(name: str) -> str | None:
    """The same-layout fp8 format of the other encoding (OCP <-> FNUZ), from mxcore.formats' specs."""
    spec = formats.get(name)
    if spec.bits != 8:
        return None
    for other in formats.names():
        o = formats.get(other)
        if other != name and o.bits == 8 and (o.ebits, o.mbits) == (spec.ebits, spec.mbits) \
                and other.endswith("fnuz") != name.endswith("fnuz"):
            return other
    return None


def convert_fp8(codes, src: str, dst: str) -> np.ndarray:
    """Re-encode fp8 bytes from ``src`` to ``dst`` (OCP <-> FNUZ): exact where ``dst`` holds the value,
    RNE otherwise, magnitudes beyond ``dst``'s max saturate (e4m3fn 448 -> e4m3fnuz 240), NaN -> NaN,
    OCP inf -> FNUZ NaN.  See the module docstring for the list."""
    if _fp8_peer(src) != dst:
        raise UnsupportedError(f"convert_fp8 converts between e4m3fn<->e4m3fnuz and e5m2<->e5m2fnuz, not {src}->{dst}")
    vals = formats.decode(np.asarray(codes, dtype=np.uint8), src, dtype=np.float64)
    bad = ~np.isfinite(vals)
    out = formats.encode(np.where(bad, 0.0, vals), dst, rounding="rne", overflow="saturate")
    dspec = formats.get(dst)
    nan_code = dspec.nan_codes[0] if dspec.nan_codes else 0x80
    out = np.where(np.isnan(vals) | (np.isinf(vals) & (not dspec.has_inf)), np.uint8(nan_code), out)
    if dspec.has_inf:
        inf_codes = formats.encode(np.array([np.inf, -np.inf]), dst, overflow="saturate")
        out = np.where(np.isposinf(vals), inf_codes[0], np.where(np.isneginf(vals), inf_codes[1], out))
    return out.astype(np.uint8)


def fp8_input_convert(x, want: str, convert: bool):
    """An ml_dtypes fp8 array of the peer encoding: convert it (if asked) or leave it for prepare() to refuse."""
    name = getattr(getattr(x, "dtype", None), "name", "")
    if not name.startswith("float8_") or not convert:
        return x
    have = name.removeprefix("float8_")
    if have == want or have not in formats.names() or _fp8_peer(have) != want:
        return x
    import ml_dtypes

    codes = convert_fp8(np.asarray(x).view(np.uint8), have, want)
    return codes.view(getattr(ml_dtypes, f"float8_{want}"))


def pack_k(codes: np.ndarray, bits: int) -> np.ndarray:
    """Sub-byte codes (rows, K), one per byte, as the f8f6f4 MFMA reads them: K padded with zero codes to a
    multiple of :data:`K_PAD`, code k at bits [k*bits, (k+1)*bits) of the row's little-endian byte stream
    (the register format of the layout records: slot s at bit s*bits).  Returns (rows, K_pad*bits/8) uint8."""
    rows, k = codes.shape
    kp = -(-max(k, 1) // K_PAD) * K_PAD
    c = np.zeros((rows, kp), np.uint32)
    c[:, :k] = codes
    per = {4: 2, 6: 4}.get(bits)  # codes per group of whole bytes: 2 fp4 codes / byte, 4 fp6 codes / 3 bytes
    if per is None:
        raise FormatError(f"no packed storage rule for {bits}-bit codes (the f8f6f4 MFMAs read 4, 6 or 8 bits)")
    g = c.reshape(rows, kp // per, per)
    word = np.zeros(g.shape[:2], np.uint32)
    for j in range(per):
        word |= g[..., j] << np.uint32(j * bits)
    nbytes = per * bits // 8
    out = np.stack([(word >> np.uint32(8 * b)) & np.uint32(0xFF) for b in range(nbytes)], axis=-1)
    return out.astype(np.uint8).reshape(rows, kp * bits // 8)


def operand_storage(op, spec, role: str) -> np.ndarray:
    """What the kernel reads for a prepared :class:`mxcore.operands.Operand`: an array of
    ``spec.elem_bytes``-wide unsigned storage units (fp32/tf32 bits, fp16/bf16 bits, fp8 codes), logical
    shape (..., M, K) for A and (..., K, N) for B.  fp4 / fp6 operands (``spec.packed(role)``) come back
    packed along K (:func:`pack_k`), K-contiguous: A as a C-ordered (M, Kbytes) array, B as the transpose of
    a C-ordered (N, Kbytes) array (the one-time transpose of the staging pass); fp8 codes likewise
    K-contiguous.  tf32 is rounded here (RNE) so that the xf32 MFMA
    and gfx950's fp32 MFMA both see exactly the values the reference uses.  MX operands must use the
    instruction's scale block (``MXTensor.block``)."""
    fmt = spec.a_format if role == "a" else spec.b_format
    if getattr(op.dtype, "name", None) == "tf32":
        fmt = "tf32"  # also on gfx950, where tf32 runs through the fp32 instruction
    mx = getattr(op, "mx", None)
    if mx is not None:
        want = spec.layout().scale_block
        if int(mx.block) != want:
            raise UnsupportedError(f"operand {role}: MX blocks of {mx.block} elements; {spec.instruction} reads one "
                                   f"E8M0 scale per {want} K elements. Re-quantize with "
                                   f"mxcore.quantize_mx(x, {mx.fmt!r}, block={want})")
    if op.codes is not None:
        codes = np.asarray(op.codes)
        if codes.dtype != np.uint8:
            raise FormatError(f"operand {role}: element codes must be uint8, got {codes.dtype}")
        bits = formats.get(fmt).bits
        if codes.size and int(codes.max()) >= 1 << bits:
            raise FormatError(f"operand {role}: {fmt} codes are {bits}-bit, found code {int(codes.max())}; "
                              "pass one unpacked code per byte (mxcore.mx.MXTensor.codes)")
        if spec.packed(role):
            if codes.ndim != 2:
                raise UnsupportedError(f"operand {role}: packed {fmt} storage takes one 2-D matrix, got {codes.shape}")
            return pack_k(codes, bits) if role == "a" else pack_k(codes.T, bits).T
        # 1-byte codes (fp8, MX fp8) are quantized on the host anyway: store them K-contiguous (a one-time
        # transpose here) so the kernel's 16-byte LDS stores apply instead of per-byte transposing stores
        return np.ascontiguousarray(codes) if role == "a" else np.asfortranarray(codes)
    vals = np.asarray(op.values)
    if fmt == "tf32":
        return formats.round_to(vals, "tf32").astype(np.float32).view(np.uint32)
    np_type = formats.get(fmt).dtype  # numpy / ml_dtypes type of fp32, fp16, bf16
    if np_type is None or np.dtype(np_type).itemsize != spec.elem_bytes:
        raise FormatError(f"operand {role}: no {spec.elem_bytes}-byte storage rule for element format {fmt!r}")
    unsigned = np.dtype(f"uint{8 * spec.elem_bytes}")
    return np.asarray(vals).astype(np_type, copy=False).view(unsigned)  # a column-major input stays column-major
