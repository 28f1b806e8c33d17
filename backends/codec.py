"""The format codecs on the GPU: compile ``kernels_cuda/mx_codec.cuh`` and launch it on device arrays.

:mod:`mxcore.formats` and :mod:`mxcore.mx` call this module for CuPy arrays, torch CUDA tensors and other
DLPack producers on a GPU; results are bit-identical to the numpy path (``tests/test_device_codec.py``).

* **Where it runs, what is compiled** (:mod:`~mxcore.backends.codec_runtime`).  On the device that holds the data
  and on the caller's current stream (CuPy's for CuPy arrays, torch's for torch tensors); torch tensors are read
  through CuPy views of their memory (raw bits, bfloat16 included), outputs of torch inputs are allocated by torch
  and returned as torch tensors, CuPy and other DLPack inputs get CuPy arrays.  One module per format and device:
  the shared source (``codec.cu``, or ``codec.hip`` under CuPy on ROCm, compiled by hiprtc) plus the format's
  ``-D`` defines, built by ``cupy.RawModule`` on first use; ``compile_inputs`` gives the exact (source, options)
  for offline checks.  ``recording()`` records the launches for a later replay with new input addresses.
* **MX kernels.**  :func:`_mx_launch` runs the lane-pair quantizer (two lanes per block of 32, 16-byte loads and
  stores) on float32/float16/bfloat16 data with contiguous, aligned blocks along the last axis, and the generic
  one (one thread per block, any layout) on everything else; ``$MXCORE_MX_KERNEL`` / ``kernel=`` force either
  (``python -m mxcore.tools.bench_quant`` times both).
* **Synchronisation.**  None, except where the host path raises on data: NaN in a format without NaN under
  ``nan="raise"``, and integer codes too wide for the format (decode, packing) read one device counter.
  ``quantize_tensor`` keeps the scale on the device (one amax reduction, then the encode pass reads it).
* **Not here.**  ``rounding="stochastic"`` (host only: :class:`~mxcore.errors.UnsupportedError`).  The AMD
  path is CuPy-on-ROCm (hiprtc through ``RawModule``); a hip-python launcher is not written, and no AMD GPU
  has run these kernels (they are compile- and disassembly-checked for gfx942/gfx950 in CI).
"""

from __future__ import annotations

import numpy as np

from ..arrays import device_kind
from ..errors import FormatError, InputTypeError, ShapeError, UnsupportedError
from ..formats import FormatSpec, nan_error, policy_checks
from .codec_runtime import (FAST_SUFFIXES, INPUT_SUFFIXES, THREADS, Recording, Replay, _i64, _NULL, _on, _run,
                            _SIGNED_OF, compile_inputs, entry_points, format_defines, recording)

__all__ = [
    "Recording",
    "Replay",
    "FAST_SUFFIXES",
    "INPUT_SUFFIXES",
    "MX_KERNELS",
    "THREADS",
    "compile_inputs",
    "decode",
    "dequantize_mx",
    "dequantize_tensor",
    "encode",
    "entry_points",
    "finite_amax",
    "finite_amax_bits",
    "format_defines",
    "pack",
    "max_finite_scale",
    "quantize_mx",
    "quantize_mx_kernel_only",
    "quantize_tensor",
    "recording",
    "to_device",
    "unpack",
]

# ---- codecs -------------------------------------------------------------------------------------------------------
def encode(x, spec: FormatSpec, *, rounding="rne", overflow="saturate", nan="raise", rng=None):
    """Device :func:`mxcore.formats.encode` (same arguments); codes of ``spec.code_dtype``, same kind as ``x``."""
    policy_checks(rounding, overflow, nan)
    if rounding == "stochastic":
        raise UnsupportedError("rounding='stochastic' runs on the host only; pass host data "
                               "(mxcore.arrays.to_numpy(x)) or use rounding='rne' / 'rtz' on the device")
    with _on(x) as call:
        xb, suf = call.float_bits(x)
        out, result = call.empty(xb.shape, spec.code_dtype.name)
        count = call.counter() if not spec.has_nan else None
        call.launch(spec, f"mx_encode_{suf}", xb.size,
                    (xb, out, _i64(xb.size), np.int32(rounding == "rtz"), np.int32(overflow == "nan"),
                     count if count is not None else _NULL))
        if count is not None and nan == "raise":
            bad = int(count.get()[0])  # the one synchronisation: the host raises on NaN here too
            if bad:
                raise nan_error(spec, bad)
        return result


def _codes(call, codes, bits: int, what: str, container: str):
    """Integer codes as a contiguous CuPy array of ``container`` dtype; values that do not fit ``bits`` raise
    (one synchronisation, only when the input dtype can hold such values)."""
    cp = call.cp
    name = call.dtype_name(codes)
    c = call.cupy_view(codes)
    if name.startswith("float8") or c.dtype.kind not in "iu":
        if name.startswith("float8") and c.dtype.itemsize == 1:
            return cp.ascontiguousarray(c.view(cp.uint8))
        raise InputTypeError(f"{what} takes integer codes, got dtype {name}; "
                             "to round float values use mxcore.formats.encode")
    wide = c.dtype.kind == "i" or c.dtype.itemsize * 8 > bits
    if wide and c.size:
        bad = int(((c < 0) | (c >= (1 << bits))).sum())
        if bad:
            raise FormatError(f"{bad} code(s) do not fit {bits} bits (0..{(1 << bits) - 1:#x}) in {what}"
                              + ("; packed bytes? use unpack_fp4 / unpack_fp6 first" if bits < 8 else ""))
    return cp.ascontiguousarray(c.astype(container, copy=False))


def _float_out(dtype) -> str:
    """The name of a float dtype given as a numpy/ml_dtypes dtype, a name, or a torch dtype."""
    text = str(dtype)
    name = text[len("torch."):] if text.startswith("torch.") else np.dtype(dtype).name
    if not (name.startswith("float") or name == "bfloat16"):
        raise InputTypeError(f"dtype={dtype!r}: decoded values are floats; pass float32 (default) or float64")
    return name


def decode(codes, spec: FormatSpec, *, dtype=np.float32):
    """Device :func:`mxcore.formats.decode`: float32 values (float64 on request; other float dtypes by one
    exact-then-rounded cast from float32), same kind of array as ``codes``."""
    with _on(codes) as call:
        c = _codes(call, codes, spec.bits, "decode", spec.code_dtype.name)
        want = _float_out(dtype)
        wide = want == "float64"
        out, result = call.empty(c.shape, "uint64" if wide else "uint32")
        call.launch(spec, "mx_decode_f64" if wide else "mx_decode_f32", c.size, (c, out, _i64(c.size), _NULL))
        return _as_float(call, out, result, wide, want)


def _as_float(call, out, result, wide: bool, want: str):
    """The kernel's float bits as ``want`` values, in the caller's kind of array."""
    vals = out.view("float64" if wide else "float32")
    if call.kind != "torch":
        return vals if want in ("float32", "float64") else vals.astype(want)
    import torch

    t = result.view(torch.float64 if wide else torch.float32)
    return t if want in ("float32", "float64") else t.to(getattr(torch, want))


def pack(codes, nbits: int):
    """Device :func:`mxcore.formats.pack_fp4` (``nbits=4``) / ``pack_fp6`` (``nbits=6``) along the last axis."""
    with _on(codes) as call:
        if len(codes.shape) == 0:
            raise ShapeError(f"pack_fp{nbits} takes an array of at least one dimension (packs along the last axis)")
        c = _codes(call, codes, 8, f"pack_fp{nbits}", "uint8")
        n = c.shape[-1]
        rows = c.size // n if n else 0
        per = (-(-n // 2), 1) if nbits == 4 else (-(-n // 4), 3)
        out, result = call.empty(c.shape[:-1] + (per[0] * per[1],), "uint8")
        bad = call.counter()
        if nbits == 4 and _flat_fp4(c, out, n):
            units = c.size // 32
            grid = _stride_grid(call, units)
            call.launch(None, "mx_pack_fp4_fast", units, (c, out, _i64(units), _i64(grid * THREADS), bad), grid=grid)
        else:
            call.launch(None, f"mx_pack_fp{nbits}", rows * per[0], (c, out, _i64(rows), _i64(n), bad))
        if int(bad.get()[0]):  # one synchronisation: the host raises on codes wider than the field
            raise FormatError(f"pack_fp{nbits}: codes must be {nbits}-bit (0..{(1 << nbits) - 1})")
        return result


def _flat_fp4(codes, packed, n: int) -> bool:
    """The 16-byte fp4 packing kernels apply: contiguous rows of an even length (row boundaries on whole bytes),
    a multiple of 32 codes in all, both arrays 16-byte aligned."""
    return (n % 2 == 0 and codes.size and codes.size % 32 == 0 and codes.flags.c_contiguous
            and packed.flags.c_contiguous and codes.data.ptr % 16 == 0 and packed.data.ptr % 16 == 0)


def _stride_grid(call, units: int) -> int:
    """Blocks of a grid-stride launch over ``units`` work items: enough for one each, at most 8 per SM (one
    resident wave)."""
    return max(1, min(-(-units // THREADS), 8 * call.sm_count()))


def unpack(packed, nbits: int, count=None):
    """Device :func:`mxcore.formats.unpack_fp4` / ``unpack_fp6``."""
    with _on(packed) as call:
        if len(packed.shape) == 0:
            raise ShapeError(f"unpack_fp{nbits} takes an array of at least one dimension")
        p = _codes(call, packed, 8, f"unpack_fp{nbits}", "uint8")
        nb = p.shape[-1]
        if nbits == 6 and nb % 3:
            raise ShapeError(f"unpack_fp6: the last axis holds {nb} bytes, not a multiple of 3 (4 values in 3 bytes)")
        rows = p.size // nb if nb else 0
        n_out = 2 * nb if nbits == 4 else 4 * (nb // 3)
        out, result = call.empty(p.shape[:-1] + (n_out,), "uint8")
        units = nb if nbits == 4 else nb // 3
        if nbits == 4 and _flat_fp4(out, p, n_out):
            units = p.size // 16
            grid = _stride_grid(call, units)
            call.launch(None, "mx_unpack_fp4_fast", units, (p, out, _i64(units), _i64(grid * THREADS)), grid=grid)
        else:
            call.launch(None, f"mx_unpack_fp{nbits}", rows * units, (p, out, _i64(rows), _i64(units)))
        if count is None:
            return result
        if not 0 <= count <= n_out:
            raise ShapeError(f"unpack_fp{nbits}: count={count} but the packed data holds {n_out} values")
        return result[..., :count]


# ---- quantizers ---------------------------------------------------------------------------------------------------
def _outer_inner(shape, axis: int) -> tuple[int, int, int]:
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    return outer, int(shape[axis]), inner


MX_KERNELS = ("auto", "fast", "generic")

#: per-tensor quantization of at most this many runs of 16 elements (4 per thread of one CTA) runs both passes in
#: one CTA (``mx_quantize_tensor_small``): a decode step's activations, where the reduction's zeroing, its launch and
#: the encode's launch cost more than the data.  H200, Llama-3-8B decode step with fp8 weights graphed
#: (``bench --decode``), the two kernels -> one CTA: M = 1 (896 runs at most) 5.61 -> 4.65 ms; at 16 runs per thread
#: M = 16 (4096 runs) went 5.83 -> 6.86 ms, so larger tensors keep the two kernels
SMALL_TENSOR_RUNS = 4 * THREADS


def _mx_launch(call, spec: FormatSpec, xb, suf: str, codes, scales, smax1, shape, axis: int, block: int, rceil: bool,
               kernel: str | None = None):
    """(function, grid, args) of the MX quantization kernel for this call, chosen here and only here.

    ``mx_quantize_mx_fast_*`` (lane pairs per block, 16-byte loads and stores, one float rounding per element)
    takes blocks of 32 along the contiguous last axis of float32/float16/bfloat16 data, 16-byte aligned, with
    K a multiple of 32; everything else (other axes, K tails, other block lengths, float64, unaligned views)
    runs ``mx_quantize_mx_*`` (one thread per block, any layout), except blocks of 32 along the second-to-last axis
    of float32/float16/bfloat16 data (B [K, N] along K), which ``mx_quantize_mx_cols_*`` takes (one thread per block
    and 32-bit word of columns, coalesced rows).  All give the numpy path's bits.  ``kernel``
    (else ``$MXCORE_MX_KERNEL``): ``"auto"`` (default) runs the lane-pair or column kernel where one applies and
    the generic one elsewhere; ``"generic"`` forces the one-thread-per-block kernel, ``"fast"`` the other two
    (raising where neither applies).  History: a first lane-pair kernel matched numpy in the host build but not on an
    H200, whose arithmetic flushed its float32 subnormal intermediates; the kernel now computes no float32
    subnormal that matters (mx_codec.cuh), and the host build is also checked with subnormals flushed."""
    import os

    choice = kernel if kernel is not None else os.environ.get("MXCORE_MX_KERNEL", "auto")
    if choice not in MX_KERNELS:
        raise UnsupportedError(f"MX quantization kernel {choice!r}: pass one of {', '.join(MX_KERNELS)} "
                               "(keyword kernel= or $MXCORE_MX_KERNEL)")
    outer, k, inner = _outer_inner(shape, axis)
    n = outer * k * inner
    common = suf in FAST_SUFFIXES and block == 32 and k % 32 == 0 and n > 0
    fits = common and inner == 1 and xb.data.ptr % 16 == 0 and codes.data.ptr % 16 == 0
    per_word = 4 // np.dtype(dict(INPUT_SUFFIXES.values())[suf]).itemsize if common else 1  # columns per word
    cols = (common and axis == len(shape) - 2 and inner % per_word == 0 and xb.data.ptr % 4 == 0
            and codes.data.ptr % per_word == 0)
    if choice == "fast" and not (fits or cols):
        raise UnsupportedError("the fast MX quantizers take float32/float16/bfloat16 data, blocks of 32 along the "
                               "contiguous last axis (16-byte aligned) or along the second-to-last axis, K a "
                               "multiple of 32; use kernel='auto' for this input")
    mod = call.module(spec)
    if cols and not fits and choice != "generic":
        groups = outer * (k // 32) * (inner // per_word)
        args = (xb, codes, scales, smax1, _i64(outer), _i64(k), _i64(inner), np.int32(rceil))
        return mod.get_function(f"mx_quantize_mx_cols_{suf}"), (-(-groups // THREADS),), args
    if fits and choice != "generic":
        halves = n // 16  # two lanes per block
        grid = _stride_grid(call, halves)  # grid-stride: one resident wave at most
        args = (xb, codes, scales, smax1, _i64(halves), _i64(grid * THREADS), np.int32(rceil))
        return mod.get_function(f"mx_quantize_mx_fast_{suf}"), (grid,), args
    nb = -(-k // block)
    grid = -(-(outer * nb * inner) // THREADS)
    args = (xb, codes, scales, smax1, _i64(outer), _i64(k), _i64(inner), np.int32(block), np.int32(rceil))
    return mod.get_function(f"mx_quantize_mx_{suf}"), (grid,), args


def _swapped(c, axis: int) -> bool:
    """Whether CuPy view ``c`` is a C-contiguous array with its last two axes swapped (``y.T``, ``y.mT``: a
    transposed operand such as ``W.t()`` or ``x.t()``), quantized along one of those two axes."""
    return c.ndim >= 2 and axis >= c.ndim - 2 and not c.flags.c_contiguous and c.swapaxes(-1, -2).flags.c_contiguous


def quantize_mx(x, spec: FormatSpec, *, axis: int, block: int, rceil: bool):
    """Device OCP-MX quantization of ``x`` along ``axis`` (non-negative, validated by the caller): one kernel reads
    ``x`` once and writes the element codes (logical shape, uint8), the E8M0 scales and the largest finite
    scale code (0-d uint8; 127 when every block is NaN).  Returns ``(codes, scales, scale_max)`` as the caller's
    kind of array.  No synchronisation.  The kernel is chosen by :func:`_mx_launch`.

    A transposed view of C-contiguous data (last two axes swapped) is quantized in place of a copy: its C-ordered
    original along the other axis, codes and scales handed back as the same transposed views (the same blocks,
    the same bits; a transposed B [K, N] gets its codes K-major, as the GEMMs read them)."""
    with _on(x) as call:
        c = call.cupy_view(x)
        name = call.dtype_name(x)
        if name in INPUT_SUFFIXES and _swapped(c, axis):
            suf, bits = INPUT_SUFFIXES[name]
            other = c.ndim - 1 if axis == c.ndim - 2 else c.ndim - 2
            codes, scales, smax = _quantize_mx_bits(call, c.swapaxes(-1, -2).view(bits), suf, spec, other, block,
                                                    rceil)
            return codes.swapaxes(-1, -2), scales.swapaxes(-1, -2), smax
        xb, suf = call.float_bits(x, view=c)
        return _quantize_mx_bits(call, xb, suf, spec, axis, block, rceil)


def _quantize_mx_bits(call, xb, suf: str, spec: FormatSpec, axis: int, block: int, rceil: bool):
    """quantize_mx of the contiguous raw bits ``xb`` (kernel suffix ``suf``) inside ``call``."""
    shape = tuple(xb.shape)
    nb = -(-shape[axis] // block)
    sshape = shape[:axis] + (nb,) + shape[axis + 1:]
    codes, codes_r = call.empty(shape, "uint8")
    scales, scales_r = call.empty(sshape, "uint8")
    smax1 = call.counter()
    if xb.size:
        fn, grid, args = _mx_launch(call, spec, xb, suf, codes, scales, smax1, shape, axis, block, rceil)
        _run(fn, grid, args)
    smax, smax_r = call.empty((), "uint8")
    call.launch(spec, "mx_scale_max_finish", 1, (smax1, smax))
    return codes_r, scales_r, smax_r


def quantize_mx_kernel_only(x, spec: FormatSpec, *, axis: int = -1, block: int = 32, rceil: bool = False,
                            kernel: str | None = None):
    """A zero-argument callable that launches only the MX quantization kernel on ``x`` (outputs allocated once),
    on the current stream: what ``mxcore.tools.bench_quant`` times as the kernel's own bandwidth.  ``kernel``: as in
    :func:`_mx_launch` (``"fast"`` / ``"generic"`` to time one of the two)."""
    with _on(x) as call:
        xb, suf = call.float_bits(x)
        shape = tuple(xb.shape)
        axis = axis % len(shape)
        nb = -(-shape[axis] // block)
        codes, _ = call.empty(shape, "uint8")
        scales, _ = call.empty(shape[:axis] + (nb,) + shape[axis + 1:], "uint8")
        smax1 = call.counter()
        fn, grid, args = _mx_launch(call, spec, xb, suf, codes, scales, smax1, shape, axis, block, rceil, kernel)
    return lambda: fn(grid, (THREADS,), args)


def _amax_launch(call, spec: FormatSpec, xb, suf: str, amax, fast: bool) -> None:
    """Launch the finite-amax reduction of ``xb`` into the zeroed uint64 ``amax`` (grid-stride, one wave at most)."""
    n = xb.size
    if fast:
        runs = n // 16  # runs of 16 elements, 16-byte loads, grid-stride
        grid = _stride_grid(call, runs)
        call.launch(spec, f"mx_amax_fast_{suf}", runs, (xb, _i64(runs), _i64(grid * THREADS), amax), grid=grid)
    else:
        grid = _stride_grid(call, n)
        call.launch(spec, f"mx_amax_{suf}", n, (xb, _i64(n), _i64(grid * THREADS), amax), grid=grid)


def _runs_fit(suf: str, xb, *outs) -> bool:
    """The 16-element-run kernels apply: <=32-bit floats, a multiple of 16 elements, 16-byte aligned arrays."""
    return (suf in FAST_SUFFIXES and xb.size and xb.size % 16 == 0 and xb.data.ptr % 16 == 0
            and all(o.data.ptr % 16 == 0 for o in outs))


def finite_amax(x):
    """Device largest finite ``|x|`` (0 when there is none) as a 0-d array of ``x``'s float dtype (float16,
    bfloat16, float32), the caller's kind of array: one reduction kernel, no synchronisation."""
    from .codec_runtime import zero

    with _on(x) as call:
        bits, bits_r = call.empty((1,), "uint64")
        zero(call.cp, bits)
        xb = _amax_into(call, x, bits, "finite_amax")
        width = xb.dtype.itemsize  # the magnitude's bits sit in the low bytes (little-endian)
        if call.kind == "torch":
            import torch

            word = {2: torch.int16, 4: torch.int32}[width]
            return bits_r.view(word)[:1].view(x.dtype).reshape(())
        return bits.view(xb.dtype)[:1].view(x.dtype).reshape(())


def finite_amax_bits(xs, out) -> None:
    """The finite amax of each device array ``xs[i]`` (float16/bfloat16/float32, on one device) into ``out[i]``
    of the uint64 device array ``out`` (zeroed first), as the magnitude's bits in that array's own dtype widened to
    64 bits — the form :func:`quantize_tensor` takes as ``amax_bits``.  Bits of non-negative floats order as their
    values, so a MAX reduction of ``out`` over ranks (NCCL on int64) is the global amax.  Recorded under
    :func:`recording` (the zeroing and the launches); no synchronisation."""
    from .codec_runtime import zero

    with _on(xs[0]) as call:
        o = call.cupy_view(out).view("uint64")
        zero(call.cp, o)
        for i, x in enumerate(xs):
            _amax_into(call, x, o[i:i + 1], "finite_amax_bits")


def _amax_into(call, x, bits, what: str):
    """Launch the finite-amax reduction of float16/bfloat16/float32 ``x`` into the zeroed uint64 ``bits`` (any
    format's module holds the kernel); returns ``x``'s raw-bits view."""
    from .. import formats

    xb, suf = call.float_bits(x)
    if suf not in FAST_SUFFIXES:
        raise InputTypeError(f"{what} on the device takes float16/bfloat16/float32 data, not {call.dtype_name(x)}")
    if xb.size:
        _amax_launch(call, formats.get("e4m3fn"), xb, suf, bits, _runs_fit(suf, xb))
    return xb


def quantize_tensor(x, spec: FormatSpec, amax=None, order: str = "C", amax_bits=None):
    """Device per-tensor power-of-two scaling: one amax reduction kernel and one encode kernel that reads the
    amax from device memory (both in one single-CTA kernel for at most :data:`SMALL_TENSOR_RUNS` runs of 16);
    returns ``(codes, scale, scale_exp)`` (uint8 codes; 0-d float32 ``2^k`` and 0-d int32 ``k``) as the caller's
    kind of array.  ``amax``: a 0-d device array (any float dtype) holding the
    magnitude to scale by instead of ``x``'s own (exactly representable in ``x``'s dtype and at least ``x``'s finite
    amax, e.g. the global amax of a sharded tensor); the reduction is then skipped.  ``order="F"`` (2-D ``x``):
    the codes in column-major memory order (B [K, N] as the fp8 GEMMs read it: K contiguous), written by the
    transposing kernel when both dimensions are multiples of 64 (else one copy, recorded like the launches).
    ``amax_bits``: instead of ``amax``, a one-element uint64 device array as :func:`finite_amax_bits` writes it (read
    by the encode kernel where it lies, so a replay reads its new contents).  No synchronisation (except NaN in a
    format without NaN, which raises as the host does)."""
    with _on(x) as call:
        xb, suf = call.float_bits(x)
        n = xb.size
        cp = call.cp
        rows, cols = xb.shape if xb.ndim == 2 else (0, 0)
        transposed = (order == "F" and suf in FAST_SUFFIXES and rows and cols and rows % 64 == 0 and cols % 64 == 0
                      and xb.data.ptr % 16 == 0)
        codes, codes_r = call.empty((cols, rows) if transposed else xb.shape, "uint8")
        exp, exp_r = call.empty((), "int32")
        scale, scale_r = call.empty((), "float32")
        count = call.counter() if not spec.has_nan else None
        nan_arg = count if count is not None else _NULL
        fast = _runs_fit(suf, xb, codes)
        grid = _stride_grid(call, n // 16 if fast else n)  # the encode pass's (the same as the reduction's)
        # both passes in one CTA (mx_quantize_tensor_small): no reduction, no zeroed counter
        small = amax_bits is None and amax is None and fast and not transposed and n // 16 <= SMALL_TENSOR_RUNS
        if small:
            bits = None
        elif amax_bits is None and amax is None:
            bits = call.counter("uint64")
            _amax_launch(call, spec, xb, suf, bits, fast)
        elif amax_bits is not None:
            bits = call.cupy_view(amax_bits).view("uint64")
        else:  # the given magnitude as x's bits, widened to the kernel's uint64
            v = call.cupy_view(amax) if call.kind != "torch" else None
            want = dict(INPUT_SUFFIXES.values())[suf]
            if call.kind == "torch":
                import torch

                t = amax.detach().to(device=call.torch_device, dtype=x.dtype).reshape(1)
                word = {"uint16": torch.int16, "uint32": torch.int32, "uint64": torch.int64}[want]
                bits = call.cupy_view(t.view(word).to(torch.int64)).view(cp.uint64)
            else:
                xdt = call.cupy_view(x).dtype  # float16 / float32 (CuPy has no bfloat16)
                bits = v.astype(xdt, copy=False).reshape(1).view(want).astype(cp.uint64)
        if small:
            call.launch(spec, f"mx_quantize_tensor_small_{suf}", THREADS,
                        (xb, codes, _i64(n // 16), exp, scale, nan_arg), grid=1)
        elif transposed:
            tiles = (rows // 64) * (cols // 64)
            call.launch(spec, f"mx_quantize_tensor_t_{suf}", tiles * THREADS,
                        (xb, codes, _i64(rows), _i64(cols), bits, exp, scale, nan_arg), grid=tiles)
        elif fast:
            runs = n // 16
            call.launch(spec, f"mx_quantize_tensor_fast_{suf}", runs,
                        (xb, codes, _i64(runs), _i64(grid * THREADS), bits, exp, scale, nan_arg), grid=grid)
        else:
            call.launch(spec, f"mx_quantize_tensor_{suf}", max(n, 1), (xb, codes, _i64(n), bits, exp, scale, nan_arg))
        if count is not None:
            bad = int(count.get()[0])
            if bad:
                raise nan_error(spec, bad)
        if order == "F":  # the logical [R, C] array over column-major bytes
            if not transposed:  # one recorded copy into [C, R] bytes
                fbuf, codes_r = call.empty((cols, rows), "uint8")
                call.copy(fbuf.T, codes)
            codes_r = codes_r.t() if call.kind == "torch" else codes_r.T
        return codes_r, scale_r, exp_r


def dequantize_mx(codes, scales, spec: FormatSpec, *, axis: int, block: int, dtype):
    """Device values of MX codes/scales (float32 by default; float64 exact; other float dtypes by one rounding
    from the float32 value, which is exact or ±inf)."""
    with _on(codes) as call:
        c = call.cp.ascontiguousarray(call.cupy_view(codes))
        s = call.cp.ascontiguousarray(call.cupy_view(scales))
        outer, k, inner = _outer_inner(tuple(c.shape), axis)
        want = _float_out(dtype)
        wide = want == "float64"
        out, result = call.empty(c.shape, "uint64" if wide else "uint32")
        call.launch(spec, "mx_dequantize_mx_f64" if wide else "mx_dequantize_mx_f32", c.size,
                    (c, s, out, _i64(outer), _i64(k), _i64(inner), np.int32(block)))
        return _as_float(call, out, result, wide, want)


def dequantize_tensor(codes, spec: FormatSpec, *, scale_exp, dtype):
    """Device values of per-tensor scaled codes; ``scale_exp`` is an int (host) or a 0-d int32 device array."""
    with _on(codes) as call:
        cp = call.cp
        c = cp.ascontiguousarray(call.cupy_view(codes))
        if isinstance(scale_exp, (int, np.integer)):
            exp = cp.asarray(np.array([scale_exp], np.int32))
        else:
            exp = cp.ascontiguousarray(call.cupy_view(scale_exp).astype(cp.int32, copy=False).reshape(1))
        want = _float_out(dtype)
        wide = want == "float64"
        out, result = call.empty(c.shape, "uint64" if wide else "uint32")
        call.launch(spec, "mx_decode_f64" if wide else "mx_decode_f32", c.size, (c, out, _i64(c.size), exp))
        return _as_float(call, out, result, wide, want)


def max_finite_scale(scales):
    """The largest finite E8M0 code of device ``scales`` (127 when all are NaN) as a 0-d uint8 device array of
    the same kind, without synchronising (for MXTensors built from device arrays by hand)."""
    with _on(scales) as call:
        cp = call.cp
        s = call.cupy_view(scales).astype(cp.int32)
        m = cp.where(s == 0xFF, -1, s).max() if s.size else cp.asarray(-1, dtype=cp.int32)
        return call.native(cp.where(m < 0, 127, m).astype(cp.uint8))


def to_device(a: np.ndarray, like):
    """Host array ``a`` copied to the device of ``like`` (a CuPy array or torch CUDA tensor), same kind as ``like``."""
    kind = device_kind(like)
    if kind == "torch":
        import torch

        a = np.array(a, copy=True, order="C")  # (np.ascontiguousarray would turn a 0-d array into 1-d)
        if a.dtype.name in ("uint16", "uint32"):
            a = a.view(_SIGNED_OF[a.dtype.name])
        return torch.from_numpy(a).to(like.device)
    if kind is None:
        raise InputTypeError(f"to_device(like=...) takes a CuPy array or torch CUDA tensor, got {type(like).__name__}")
    import cupy as cp

    ordinal = like.device.id if kind == "cupy" else int(like.__dlpack_device__()[1])
    with cp.cuda.Device(ordinal):
        return cp.asarray(a)
