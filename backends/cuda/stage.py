"""Operand staging: a user's operand -> the buffer the GEMM kernel reads (:class:`DevOperand`).

Float dtypes (fp16/bf16/tf32/fp32) with device inputs are staged on the device only: a 16-bit operand already in
the dtype with one unit stride, a 16-byte aligned base and leading dimension is read in place (either
majorness); anything else is rounded once (RNE) by ``mx_prep_float`` into a K-major padded buffer; fp32 is split
3xTF32 (x = big + small, A' = [big | big | small], B' = [big ; small ; big] over K' = 3K).  Host float inputs are
rounded by ``mxcore.operands`` (the oracle's own rounding) and uploaded.

fp8 / MX operands arrive quantized (:class:`~mxcore.mx.ScaledTensor` / :class:`~mxcore.mx.MXTensor` whose codes
and scales may be numpy, CuPy or torch CUDA arrays) or as float data quantized on the host by
``mxcore.operands.prepare``.  fp8 codes are read as bytes (K-major: in place, or transposed by
``mx_transpose_bytes``, or padded by ``mx_prep_codes``), or decoded to f16 (``fp8_path="decode"``).  MX codes
are decoded with the block scale folded in, value * 2^(scale - smax), to bf16 (``mx_decode_codes`` in the
operand's own layout, else the transposing ``mx_prep_codes``); the epilogue multiplies by 2^(smax - 127).  smax,
the largest finite scale code, is ``MXTensor.scale_max`` (computed by the quantizer).  Device scalars are never
read on the host: a device MXTensor's smax (0-d uint8) and a device ScaledTensor's ``scale_exp`` (0-d int32) go
to the kernels as pointers (:attr:`DevOperand.exp_at`; the decode kernels' ``exp_bias_at``), host ones as ints.
The staged buffer is cached on the quantized object (quantize once, multiply many times).

Exact MX (``path="mx_exact"``: the sm_90a wgmma family's block-scaled variant, chosen by ``families.mx_path``):
MXFP4 / MXFP6 codes are re-encoded as e4m3 with their block scales folded in, mxfp8 codes in their own format
with their block scales folded in and the bits that leaves off kept as lists that ``mx_lo_fix`` adds back
(:meth:`Stager.mx_fold`, which also writes :class:`MXFactors`: int32 factor bits in the layout the kernel TMA-loads,
the live range of scale codes, per-row NaN flags, the fold flags); with :data:`MX8_FOLD` off, mxfp8 codes are
staged as fp8 bytes exactly as the fp8 path stages them and their scales go through ``gemm_sm90_mx.cu`` into
:class:`MXFactors` (part 1's per-32 blocks).
Nothing is read on the host.

Batched operands (3-D) are staged into one buffer with a batch stride (0 for an operand shared by the batch).
"""

from __future__ import annotations

import functools
import weakref

import numpy as np

from mxcore.arrays import array_kind
from mxcore.errors import UnsupportedError

from ..codec_runtime import launch, taint, zeros
from .device import as_cupy, device_info, resident_blocks
from .operand import _SPECIAL, FP8_SHORT, LO_CAP, DevOperand, MXFactors

__all__ = ["DevOperand", "MXFactors", "Stager", "register_path"]

#: staging paths a kernel family adds: path -> stage(stager, codes, scales, element, K, N) -> DevOperand (this module
#: imports no family: they register when imported)
_PATHS: dict = {}
_OWN_PATHS = ("decode", "native", "convert", "mx_exact")  # this module's: decoded to bf16 / f16, fp8 bytes, exact MX


def register_path(path: str, stage) -> None:
    """A family's staged form of an MX operand, asked for as ``stage_quantized(..., path)``."""
    _PATHS[path] = stage

_SRC_KIND = {"float64": 0, "float32": 1, "float16": 2, "bf16": 3}
_DST_KIND = {"f16": 0, "bf16": 1, "tf32": 2, "tf32_small": 3, "byte": 4, "tf32_finite": 5}
MX_BLOCK_KERNEL = 32  # the decode kernels fold one scale per 32 K
#: a lossy MXFP8 fold (gemm_sm90_mx.cu): blocks shift down by at most this many binades, and each row keeps at most
#: LO_CAP (operand.py) entries of lost bits (more: the operand is folded again without loss, per-32 blocks where
#: scales differ)
LO_SHIFT = 15
#: MXFP8 on the exact wgmma variant: folded with its lost bits kept (True), or its codes as they are with per-32
#: block factors (False: part 1's per-block promotion everywhere)
MX8_FOLD = True


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def is_mxfp8(od) -> bool:
    """An MX operand dtype with fp8 elements (its exact fold is lossy: mx_lo_fix adds its lost bits)."""
    return od.kind == "mx" and od.element in FP8_SHORT


def _host_int(x) -> bool:
    return isinstance(x, (int, np.integer))


def _logical(arr, role: str):
    """(batch, rows, cols, s_b, s_r, s_c) with rows = m (A) or n (B), cols = k, strides in elements."""
    es = arr.itemsize
    st = [s // es for s in arr.strides]
    if arr.ndim == 2:
        b, sb, (d0, d1), (s0, s1) = 1, 0, arr.shape, st
    else:
        b, sb, d0, d1, s0, s1 = arr.shape[0], st[0], arr.shape[1], arr.shape[2], st[1], st[2]
    if role == "a":
        return b, d0, d1, sb, s0, s1
    return b, d1, d0, sb, s1, s0


#: mx_sm90_fold's tables (every (shift, code) pair's code and lost bits, built once per block before its first
#: window), in windows of work: ~1600 instructions per thread, about three windows' (measured with ncu)
FOLD_TABLE_WINDOWS = 3


@functools.lru_cache(maxsize=256)
def fold_split(gx: int, windows: int, slots: int) -> int:
    """grid.y of mx_sm90_fold over ``gx`` blocks of rows and ``windows`` 128-K windows, ``slots`` blocks resident on
    the GPU at once: the fewest window-times, the waves of gx * gy blocks times a block's windows plus its tables
    (ties: the smaller gy).  H100, 8192 rows x 64 windows at three blocks per SM: 3 (2 waves of 22 windows), where
    the former rule (8 blocks per SM) gave 5 (3.23 waves, the last a quarter full)."""
    def cost(gy: int) -> int:
        return -(-gx * gy // max(slots, 1)) * (-(-windows // gy) + FOLD_TABLE_WINDOWS)

    return min(range(1, max(windows, 1) + 1), key=cost)


# staged quantized operands cached on the quantized object: {object: {(ordinal, role, path): DevOperand}}; the
# entry VERSION holds the torch version counters of the object's arrays when it was staged (see fresh_staged)
_STAGED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
VERSION = "version"


def versions(src):
    """The torch version counters of a quantized object's device arrays (codes and scales), or None (CuPy / numpy
    arrays carry none: a CuPy MXTensor is treated as immutable, ``mxcore.clear_cache(obj)`` drops what was staged
    from it)."""
    try:  # an MXTensor of torch tensors (the per-call path asks on every call)
        return (src.codes._version, src.scales._version)
    except AttributeError:
        pass
    out = None
    for name in ("codes", "scales", "scale", "scale_exp"):
        v = getattr(getattr(src, name, None), "_version", None)
        if v is not None:
            out = (out or ()) + (v,)
    return out


def fresh_staged(src):
    """The staged forms cached on ``src`` (a dict, possibly empty), dropped first when one of its torch arrays was
    changed in place since they were staged (its version counter moved): never a stale staged copy."""
    cache = _STAGED.get(src)
    if cache is None:
        return {}
    if VERSION in cache and cache[VERSION] != versions(src):
        cache.clear()
    return cache


class Stager:
    """Staging on one device (``ordinal``) with its kernel cache; call under that device and stream."""

    def __init__(self, cp, ordinal: int, kernels, sms: int):
        self.cp, self.ordinal, self.kernels, self.sms = cp, ordinal, kernels, sms

    def _prep(self, name: str):
        return self.kernels.prep(self.cp, self.ordinal, name)

    # ---- float dtypes ---------------------------------------------------------------------------------------
    def float_source(self, x, role: str, od):
        """(CuPy array, source kind) of a float operand: device arrays as they are, host arrays rounded once by
        mxcore.operands and uploaded."""
        cp = self.cp
        kind = array_kind(x)
        on_device = kind == "cupy" or (kind == "torch" and x.device.type == "cuda")
        if not on_device:
            from mxcore import dtypes as _dt
            from mxcore.arrays import to_numpy
            from mxcore.operands import prepare_one

            host = to_numpy(x)
            if host.ndim == 3:
                vals = np.stack([prepare_one(h, _dt.OperandDType(od.name, od.element, od.kind), role).values
                                 for h in host]) if len(host) else host.astype(np.float32)
            else:
                vals = prepare_one(host, _dt.OperandDType(od.name, od.element, od.kind), role).values
            if vals.dtype.name == "bfloat16":
                return cp.asarray(vals.view(np.uint16)), "bf16"
            return cp.asarray(vals), vals.dtype.name
        if kind == "torch":
            import torch

            if x.dtype == torch.bfloat16:
                return as_cupy(cp, x), "bf16"
        arr = as_cupy(cp, x)
        if arr.dtype.name not in ("float64", "float32", "float16"):
            raise UnsupportedError(f"device input of dtype {arr.dtype.name}: pass float16/float32/float64 (or torch "
                                   "bfloat16)")
        return arr, arr.dtype.name

    def _direct16(self, arr, role: str) -> DevOperand | None:
        """Use a 16-bit device array in place when the kernel can read it: a unit stride along K (K-major) or
        along M/N (M/N-major), the other stride a positive multiple of 8 elements, a 16-byte aligned base, and a
        batch stride that keeps every batch element aligned (or 0)."""
        nb, rows, cols, s_b, s_r, s_c = _logical(arr, role)
        if arr.data.ptr % 16 or (nb > 1 and (s_b < 0 or s_b % 8)):
            return None
        if (s_c == 1 or cols == 1) and (rows == 1 or (s_r > 0 and s_r % 8 == 0)):  # K-major
            return DevOperand(arr, s_r if rows > 1 else _round_up(cols, 8), True, "", 0, cols, s_b if nb > 1 else 0,
                              direct=True)
        if (s_r == 1 or rows == 1) and (cols == 1 or (s_c > 0 and s_c % 8 == 0)):  # M/N-major
            return DevOperand(arr, s_c if cols > 1 else _round_up(rows, 8), False, "", 0, cols, s_b if nb > 1 else 0,
                              direct=True)
        return None

    def _prep_float(self, arr, kind: str, role: str, dst: str, out=None, col_off: int = 0, ld: int | None = None):
        cp = self.cp
        nb, rows, cols, s_b, s_r, s_c = _logical(arr, role)
        esize = 2 if dst in ("f16", "bf16") else 4
        if out is None:
            ld = _round_up(cols, 16 // esize)
            out = cp.empty((nb, rows, ld), dtype=cp.uint16 if esize == 2 else cp.uint32)
        grid = (-(-cols // 32), -(-rows // 32), nb)
        if 0 in grid:  # nothing to copy (empty batch, M, N or K): a grid dimension of 0 is not launchable
            return out, ld
        row_fast = int(s_r == 1 and s_c != 1)
        launch(self._prep("mx_prep_float"), grid, (32, 8), (
            arr, np.int32(_SRC_KIND[kind]), np.int32(rows), np.int32(cols), np.int64(s_r), np.int64(s_c),
            np.int32(row_fast), out, np.int32(_DST_KIND[dst]), np.int64(ld), np.int64(col_off), np.int64(s_b),
            np.int64(rows * ld)))
        return out, ld

    def stage_float(self, x, role: str, od) -> DevOperand:
        arr, kind = self.float_source(x, role, od)
        name = od.name
        nb, rows, cols = _logical(arr, role)[:3]
        bstride = lambda ld: rows * ld if arr.ndim == 3 else 0  # noqa: E731
        if name in ("fp16", "bf16"):
            want = "f16" if name == "fp16" else "bf16"
            if kind == {"f16": "float16", "bf16": "bf16"}[want]:
                d = self._direct16(arr, role)
                if d is not None:
                    d.elem = want
                    return d
            buf, ld = self._prep_float(arr, kind, role, want)
            return DevOperand(buf, ld, True, want, 0, cols, bstride(ld))
        if name == "tf32":
            buf, ld = self._prep_float(arr, kind, role, "tf32")
            return DevOperand(buf, ld, True, "tf32", 0, cols, bstride(ld))
        # fp32: 3xTF32 as one tf32 GEMM over K' = 3 Kp: A' = [big | big' | small], B' = [big ; small ; big'] where
        # big' is big with inf/NaN replaced by 0 (IEEE inf and NaN: gemm_prep.cu encode_dst)
        kp = _round_up(cols, 4)
        out = zeros(self.cp, (nb, rows, 3 * kp), self.cp.uint32)
        parts = ("tf32", "tf32_finite", "tf32_small") if role == "a" else ("tf32", "tf32_small", "tf32_finite")
        for i, dst in enumerate(parts):
            self._prep_float(arr, kind, role, dst, out=out, col_off=i * kp, ld=3 * kp)
        return DevOperand(out, 3 * kp, True, "tf32", 0, 3 * kp, bstride(3 * kp))

    # ---- quantized dtypes -----------------------------------------------------------------------------------
    def upload(self, op) -> tuple:
        """(codes, scales, smax) of a prepared fp8/MX operand on this device, once per plan: device arrays as they
        are, host arrays copied; smax: the largest finite scale code (127 when there is none; MX only), an int
        for a host MXTensor, a 0-d uint8 CuPy array (never read here) for a device one."""
        cp = self.cp
        codes = as_cupy(cp, op.codes)
        if op.mx is None:
            return codes, None, None
        if op.mx.block != MX_BLOCK_KERNEL:
            raise UnsupportedError(f"operand {op.role} is an MXTensor with blocks of {op.mx.block}; the CUDA kernels "
                                   f"read OCP MX blocks of {MX_BLOCK_KERNEL} along K: quantize with block=32")
        smax = op.mx.scale_max
        return codes, as_cupy(cp, op.mx.scales), int(smax) if _host_int(smax) else as_cupy(cp, smax)

    def stage_quantized(self, op, role: str, path: str, src=None, uploaded=None, partner=None) -> DevOperand:
        """Stage a prepared fp8/MX operand (``mxcore.operands.Operand``; 2-D).  ``src``: the user's quantized
        object (MXTensor / ScaledTensor), on which the staged buffer is cached (a cached operand costs nothing);
        ``uploaded``: a callable returning :meth:`upload`'s result (memoised by the caller across ``prep()``).
        ``partner``: the other operand's dtype; on the exact MX path an MXFP4 / MXFP6 operand beside an MXFP8 one is
        staged with its elements transposed as well (``mx_fold(transposed=True)``: a recorded launch, so the
        per-call path replays it), a separate cache entry."""
        transposed = path == "mx_exact" and partner is not None and is_mxfp8(partner) and not is_mxfp8(op.dtype)
        key = (self.ordinal, role, path, MX8_FOLD if path == "mx_exact" else None, transposed)
        cache = fresh_staged(src) if src is not None else None
        if cache and key in cache:
            return cache[key]
        d = self._stage_quantized(op, role, path, uploaded() if uploaded is not None else self.upload(op), transposed)
        if src is not None:
            try:
                kept = _STAGED.setdefault(src, {})
            except TypeError:  # not weak-referenceable: no cache
                return d
            kept[key] = d
            kept[VERSION] = versions(src)
            # the staged form is read later from any stream (and by other threads): it must be complete before
            # anyone can take it from the cache, so the staging stream is waited for once, here
            self.cp.cuda.get_current_stream().synchronize()
        return d

    def _stage_quantized(self, op, role: str, path: str, uploaded, transposed: bool = False) -> DevOperand:
        from mxcore import dtypes as _dt

        od = op.dtype
        cols = op.shape[1] if role == "a" else op.shape[0]
        codes, scales, smax = uploaded
        if od.kind == "fp8":  # the per-tensor scale 2^scale_exp goes to the epilogue (a device int32 as a pointer)
            se = op.scale_exp
            exp, exp_at = (int(se), None) if _host_int(se) else (0, as_cupy(self.cp, se))
            short = FP8_SHORT[od.name]
            if path != "decode":
                buf, ld = self._stage_bytes(codes, role, od.element)
                return DevOperand(buf, ld, True, short, exp, cols, exp_at=exp_at)
            fast = self._decode_in_place(codes, role, od.element, "f16", None, (127, None), exp, cols)
            if fast is not None:
                fast.exp_at = exp_at
                return fast
            buf, ld = self._prep_codes(codes, role, od.element, "f16")
            return DevOperand(buf, ld, True, "f16", exp, cols, exp_at=exp_at)
        element = _dt.MX_ELEMENT[od.name]
        if path in _PATHS:  # a family's own staged form (registered: "wonly", the packed records of wonly/records.py)
            return _PATHS[path](self, codes, scales, element, cols, op.shape[1])
        if path not in _OWN_PATHS:  # never a silent bf16 decode in place of a form a family did not register
            raise UnsupportedError(f"internal: no staging registered for path {path!r}")
        if path == "mx_exact":  # the exact wgmma variant: fp8 bytes + block factors, or fp4/fp6 folded into e4m3
            short = FP8_SHORT.get(element)
            if short is None or MX8_FOLD:
                buf, ld, fac = self.mx_fold(codes, scales, role, cols, element, transposed)
                return DevOperand(buf, ld, True, short or "e4m3", 0, cols, mx=fac)
            buf, ld = self._stage_bytes(codes, role, element)
            return DevOperand(buf, ld, True, short, 0, cols, mx=self.mx_factors(codes, scales, role, cols))
        # decode at 2^(scale - smax), epilogue 2^(smax - 127): smax an int, or read by the kernels on the device
        bias, exp, exp_at = (smax, smax - 127, None) if _host_int(smax) else ((0, smax), -127, smax)
        bias = bias if isinstance(bias, tuple) else (bias, None)
        fast = self._decode_in_place(codes, role, element, "bf16", scales, bias, exp, cols)
        if fast is not None:
            fast.exp_at = exp_at
            return fast
        buf, ld = self._prep_codes(codes, role, element, "bf16", scales=scales, exp_bias=bias)
        return DevOperand(buf, ld, True, "bf16", exp, cols, exp_at=exp_at)

    def _prep_codes(self, codes, role: str, element: str, dst: str, scales=None, exp_bias: tuple = (127, None)):
        """``exp_bias``: (int, None), or (0, 0-d uint8 device array) read by the kernel."""
        from mxcore import formats

        cp = self.cp
        spec = formats.get(element)
        codes_d = _contiguous(cp, codes)
        _, rows, cols, _, s_r, s_c = _logical(codes_d, role)
        esize = {"f16": 2, "bf16": 2, "byte": 1}[dst]
        ld = _round_up(cols, 16 // esize)
        out = cp.empty((rows, ld), dtype=cp.uint16 if esize == 2 else cp.uint8)
        if scales is not None:
            sc = _contiguous(cp, scales)
            ss0, ss1 = sc.strides  # itemsize 1
            ss_r, ss_c = (ss0, ss1) if role == "a" else (ss1, ss0)
        else:
            sc, ss_r, ss_c = 0, 0, 0
        grid = (-(-cols // 32), -(-rows // 32))
        if 0 in grid:
            return out, ld
        launch(self._prep("mx_prep_codes"), grid, (32, 8), (
            codes_d, np.int32(rows), np.int32(cols), np.int64(s_r), np.int64(s_c), np.int32(int(s_r == 1 and s_c != 1)),
            sc, np.int64(ss_r), np.int64(ss_c), np.int32(exp_bias[0]), _ptr(exp_bias[1]), np.int32(spec.ebits), np.int32(spec.mbits),
            np.int32(spec.bias), np.int32(_SPECIAL.get(spec.specials, 0)), out, np.int32(_DST_KIND[dst]),
            np.int64(ld), np.int64(0)))
        return out, ld

    def _stage_bytes(self, codes, role: str, element: str):
        """fp8 codes as the fp8 kernels read them: K-major rows, 16-byte aligned, ld a multiple of 16 bytes.
        Codes already K-major (A in C order, B in Fortran order) are used in place; the other order is
        transposed by ``mx_transpose_bytes`` when both dimensions are multiples of 64; anything else (padding,
        other strides) goes through ``mx_prep_codes``."""
        cp = self.cp
        if codes.ndim == 2 and codes.data.ptr % 16 == 0:
            kmajor = codes if role == "a" else codes.T  # logical rows = M or N, columns = K
            if kmajor.flags.c_contiguous and kmajor.shape[1] % 16 == 0:
                return kmajor, kmajor.shape[1]
            src = kmajor.T  # C order: K x (M or N)
            if src.size and src.flags.c_contiguous and src.shape[0] % 64 == 0 and src.shape[1] % 64 == 0:
                rows, cols = src.shape
                out = cp.empty((cols, rows), dtype=cp.uint8)
                launch(self._prep("mx_transpose_bytes"), (cols // 64, rows // 64), (256,), (
                    src, np.int32(rows), np.int32(cols), np.int64(cols), out, np.int64(rows)))
                return out, rows
        return self._prep_codes(codes, role, element, "byte")

    def _factor_args(self, codes, scales, role: str, k: int, fold: bool = False):
        """What the factor kernels of ``gemm_sm90_mx.cu`` take: (the scales' arguments (scales, row stride, block
        stride), the leading arguments of mx_sm90_block_factors / mx_sm90_fold (those, then the codes', the sizes
        and the role), rows, rows_pad, MXFactors with the factor buffer allocated, info / nan zeroed, and with
        ``fold`` the window flags)."""
        cp = self.cp
        blocks = -(-k // MX_BLOCK_KERNEL)
        blocks_pad = _round_up(max(blocks, 1), 4)
        c0, c1 = (s // codes.itemsize for s in codes.strides)
        s0, s1 = (s // scales.itemsize for s in scales.strides)
        if role == "a":
            rows = codes.shape[0]
            cs_r, cs_k, ss_r, ss_j = c0, c1, s0, s1
            rows_pad, ld = rows, blocks_pad
            out = cp.empty((rows, blocks_pad), dtype=cp.int32)
        else:
            rows = codes.shape[1]
            cs_r, cs_k, ss_r, ss_j = c1, c0, s1, s0
            rows_pad = ld = _round_up(max(rows, 1), 16)
            out = cp.empty((blocks_pad, ld), dtype=cp.int32)
        # info (int32 x 8), the lossy lists' counts (int32 per row), the NaN flags and the per-window fold flags:
        # one zeroed allocation
        r1 = max(rows, 1)
        aux = zeros(cp, 32 + 4 * r1 + r1 + blocks_pad // 4, cp.uint8)
        fac = MXFactors(out, ld, blocks_pad, aux[:32].view(cp.int32), aux[32 + 4 * r1:32 + 5 * r1])
        fac.folded = aux[32 + 5 * r1:] if fold else None
        fac.lo_cnt = aux[32:32 + 4 * r1].view(cp.int32)  # used by a lossy fold only (mx_fold keeps it there)
        scale_args = (scales, np.int64(ss_r), np.int64(ss_j))
        args = scale_args + (codes, np.int64(cs_r), np.int64(cs_k), np.int32(rows), np.int32(blocks), np.int32(k),
                             np.int32(0 if role == "a" else 1), np.int32(rows_pad), np.int32(blocks_pad))
        return scale_args, args, rows, rows_pad, fac

    def _factor_kernel(self, name: str):
        from .compile import SM90_MX_FILE

        return self.kernels.get(self.cp, self.ordinal, ("sm90", name), SM90_MX_FILE, name, ("-std=c++17",))

    def _slots(self, kernel, name: str, threads: int = 256) -> int:
        """Blocks of ``kernel`` (``name``) of ``threads`` threads resident on this device at once (once per device)."""
        def make():
            attrs = kernel.attributes
            return self.sms * resident_blocks(device_info(self.cp, self.ordinal).props, int(attrs["num_regs"]),
                                              threads, int(attrs.get("shared_size_bytes", 0)))

        return self.kernels.constant(self.ordinal, ("slots", name, threads), make)

    def mx_factors(self, codes, scales, role: str, k: int) -> MXFactors:
        """The exact wgmma variant's block factors of an MX fp8 operand (``gemm_sm90_mx.cu``): A (M, K) codes with
        (M, K/32) scales, or B (K, N) codes with (K/32, N) scales; any strides."""
        _, args, _, rows_pad, fac = self._factor_args(codes, scales, role, k)
        total = rows_pad * fac.blocks_pad
        if total:
            grid = (max(1, min(-(-total // 256), 4 * self.sms)),)
            launch(self._factor_kernel("mx_sm90_block_factors"), grid, (256,), args + (
                fac.factors, np.int64(fac.ld), fac.nan, fac.info))
        return fac

    def mx_fold(self, codes, scales, role: str, k: int, element: str, transposed: bool = False):
        """An MX operand folded for the exact wgmma variant (``gemm_sm90_mx.cu``'s ``mx_sm90_fold``), as K-major
        rows with each 128-K window's block scales folded into one power of two where the blocks' exponents allow
        (one power of two for a whole row where its scales allow: ``info[3]`` = 0 when every row has one), and the
        block factors with the per-window ``folded`` flags.  MXFP4 / MXFP6: re-encoded exactly as e4m3 where the
        exponents span at most ``formats.exact_shifts(element, "e4m3fn")``, else kept per block.  MXFP8 (e4m3 /
        e5m2, in their own format): blocks shift down by up to :data:`LO_SHIFT` binades, the bits that leaves off
        kept as sorted lists per row (``lo_cnt`` / ``lo_ent``) that ``mx_lo_fix`` adds to the GEMM's result (reading
        ``lo_elt``, the elements transposed, which the fold writes too); a list longer than
        :data:`LO_CAP` folds the operand again without loss (the per-32 path where block scales differ), decided
        on the device.  ``transposed``: write ``lo_elt`` for an MXFP4 / MXFP6 operand too (the partner of an MXFP8
        one, whose lost bits ``mx_lo_fix`` adds against these elements).  Returns (elements, ld, MXFactors)."""
        from mxcore import formats

        cp = self.cp
        spec = formats.get(element)
        lossy = spec.bits == 8
        lo, hi = (-LO_SHIFT, 0) if lossy else formats.exact_shifts(element, "e4m3fn")
        scale_args, args, rows, rows_pad, fac = self._factor_args(codes, scales, role, k, fold=True)
        ldk = _round_up(max(k, 1), 16)
        elems = cp.empty((rows, ldk), dtype=cp.uint8)
        windows = fac.blocks_pad // 4
        if not lossy:
            fac.lo_cnt = None
        else:
            fac.lo_ent = cp.empty((max(rows, 1), LO_CAP, 2), dtype=cp.int32)
        if lossy or transposed:
            fac.lo_elt = cp.empty((max(windows, 1) * 128, 32 * -(-max(rows_pad, 1) // 32)), dtype=cp.uint8)
        if rows_pad:
            row_e = cp.empty(max(rows, 1), dtype=cp.int32)
            rows_grid = (max(1, min(-(-rows // 8), 8 * self.sms)),)
            gx = -(-rows_pad // 32)  # mx_sm90_fold: a block per 32 rows folds windows y, y + grid y, ... (its
            fold = self._factor_kernel("mx_sm90_fold")  # tables built once), grid y by fold_split
            fold_grid = (gx, fold_split(gx, windows, self._slots(fold, "mx_sm90_fold")))
            lists = (np.int32(LO_CAP), fac.lo_cnt, fac.lo_ent) if lossy else (np.int32(0), _NULLP, _NULLP)
            passes = [(lo, hi, _NULLP)]
            if lossy:  # after an overflow (info[4]), again without loss
                passes.append((0, 0, fac.info[4:5]))
            for i, (plo, phi, only_if) in enumerate(passes):
                launch(self._factor_kernel("mx_sm90_fold_rows"), rows_grid, (256,), scale_args + (
                    np.int32(rows), np.int32(-(-k // MX_BLOCK_KERNEL)), np.int32(plo), np.int32(phi), row_e,
                    fac.folded, np.int32(windows), only_if, fac.info, fac.lo_cnt if lossy else _NULLP))
                launch(fold, fold_grid, (256,), args + (
                    np.int32(spec.ebits), np.int32(spec.mbits), np.int32(spec.bias), np.int32(plo), np.int32(phi),
                    row_e, elems, np.int64(ldk), fac.factors, np.int64(fac.ld), fac.folded, fac.nan, fac.info,
                    np.int32(lossy), np.int32(_SPECIAL.get(spec.specials, 0)), *lists, only_if,
                    fac.lo_elt if fac.lo_elt is not None else _NULLP,
                    np.int64(fac.lo_elt.shape[1] if fac.lo_elt is not None else 0)))
                if lossy and i == 0:  # each row's entries in k order (mx_lo_fix adds them so)
                    launch(self._factor_kernel("mx_sm90_lo_sort"), rows_grid, (256,), (
                        np.int32(rows), np.int32(LO_CAP), fac.lo_cnt, fac.lo_ent))
        return elems, ldk, fac

    def _code_table(self, element: str, dst: str, scaled: bool):
        """256 x uint32 decode table: destination bits of each code, or (scaled) its exact fp32 value."""
        def make():
            from mxcore import formats

            spec = formats.get(element)
            vals = formats.decode(np.arange(1 << spec.bits, dtype=np.uint8), element).astype(np.float32)
            if scaled:
                bits = vals.view(np.uint32)
            elif dst == "f16":
                bits = vals.astype(np.float16).view(np.uint16).astype(np.uint32)
            else:
                import ml_dtypes

                bits = vals.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)
            table = np.zeros(256, dtype=np.uint32)
            table[: bits.size] = bits
            return self.cp.asarray(table)

        return self.kernels.constant(self.ordinal, ("table", element, dst, scaled), make)

    def _decode_in_place(self, codes, role: str, element: str, dst: str, scales, exp_bias: tuple, exp: int,
                         cols: int) -> DevOperand | None:
        """Decode codes elementwise in their own layout (the 16-bit kernel reads every majorness): C-ordered codes
        keep A K-major and B N-major; a transposed view of C-ordered codes (``quantize_mx`` of a transposed operand)
        is decoded as that C-ordered array, in place, so A comes out M-major and B K-major.  None when the
        contiguous dimension is not a multiple of 8 (the transposing path pads)."""
        cp = self.cp
        flip = codes.ndim == 2 and not codes.flags.c_contiguous and codes.T.flags.c_contiguous
        codes_d = codes.T if flip else _contiguous(cp, codes)
        rows_, cols_ = codes_d.shape
        if cols_ % 8 or codes_d.data.ptr % 8 or not codes_d.size:
            return None
        out = cp.empty((rows_, cols_), dtype=cp.uint16)
        table = self._code_table(element, dst, scales is not None)
        k_rows = (role == "a") == flip  # K runs down the decoded array's rows (blocks of 32 rows share a scale)
        if scales is not None:  # (i, j) of the decoded array reads scale (i / bi, j / bj) at strides (s_i, s_j)
            sc = scales.T if flip else scales
            s_i, s_j = (s // sc.itemsize for s in sc.strides)
            if k_rows and not (s_j == 1 and s_i % 8 == 0 and sc.data.ptr % 8 == 0):  # 8 scale bytes read at once
                sc = _contiguous(cp, sc)
                s_i, s_j = sc.shape[1], 1
            bi, bj = (32, 1) if k_rows else (1, 32)
        else:
            sc, bi, bj, s_i, s_j = 0, 1, 1, 0, 0
        grid = (max(1, min(-(-(rows_ * cols_ // 8) // 256), 16 * self.sms)),)
        launch(self._prep("mx_decode_codes"), grid, (256,), (
            codes_d, np.int32(rows_), np.int32(cols_), table, sc, np.int32(bi), np.int32(bj), np.int64(s_i),
            np.int64(s_j), np.int32(exp_bias[0]), _ptr(exp_bias[1]), np.int32(_DST_KIND[dst]), out))
        return DevOperand(out, cols_, not k_rows, dst, exp, cols)


def _contiguous(cp, x):
    """``cp.ascontiguousarray``; a copy taints a recording (the fast path then stages every call)."""
    if not x.flags.c_contiguous:
        taint("a staging copy")
    return cp.ascontiguousarray(x)


_NULLP = np.uint64(0)  # a null device pointer argument


def _ptr(x):
    """A kernel pointer argument: the device array, or a null pointer for None."""
    return np.uint64(0) if x is None else x
