"""OCP Microscaling (MX v1.0) block quantization and per-tensor power-of-two fp8 scaling.

An :class:`MXTensor` holds one element code per value and one E8M0 scale per block of ``block`` (32)
consecutive values along ``axis``; value = decode(code, element) * 2^(scale - 127).

Scale policies (``scale_rounding``), for a block with largest magnitude ``amax``:

* ``"floor"`` (OCP MX v1.0 §6.3, the default): ``shared_exp = floor(log2(amax)) - emax_elem``, with
  ``emax_elem`` the exponent of the element format's largest normal (e4m3 8, e5m2 15, e2m3 2,
  e3m2 4, e2m1 2).  Elements ``x / 2^shared_exp`` are then rounded to nearest-even and saturated to
  ±max, so the largest element may clip: amax 500 in e4m3 gives scale 2^0 and stores 448; amax 7 in
  e2m1 gives scale 2^0 and stores 6.
* ``"rceil"`` (cuBLAS / cuDNN / TransformerEngine): ``scale = 2^ceil(log2(amax / max_elem))``, the
  smallest power of two that makes every element fit, so nothing clips (amax 500 in e4m3 → 2^1).
  Computed exactly (no float rounding of ``amax / max_elem`` can move it across a power of two).

Special blocks, in both policies:

* The scale exponent is clamped to [-127, 127] (E8M0 codes 0x00..0xFE); elements then round and
  saturate as usual (a block of values below 2^-127 · min_subnormal quantizes to zeros).
* **All-zero block: scale code 0x00 (2^-127)** - the clamp of ``floor(log2(0)) = -inf``; its
  elements are +0 (or −0 codes for −0 inputs) and it decodes to zeros.
* **A NaN or ±inf anywhere in a block: scale code 0xFF (NaN)**; the block's element codes are 0 and
  the whole block decodes to NaN.
* K (the length along ``axis``) need not be a multiple of ``block``: the last, partial block is
  scaled from its real elements only (as if padded with zeros).  ``codes`` keeps the logical shape;
  ``scales`` has ``ceil(K / block)`` entries along ``axis``.

Per-tensor scaling (:func:`quantize_tensor`, the plain ``fp8`` matmul dtypes): ``scale =
2^ceil(log2(amax / max_normal))`` over the finite values - the smallest power of two with
``amax / scale <= max_normal``, so no finite value saturates and the range is used fully.  An all-zero
(or all-non-finite) tensor gets scale 1.  The exponent is clamped to [-126, 127] so the scale is a
normal float32 (GPU kernels take it as a float32); finite values beyond that saturate.  NaN encodes
to the format's NaN; ±inf to inf (e5m2) or NaN (formats without inf).

Device data (CuPy arrays, torch CUDA tensors, DLPack producers on a GPU) is quantized on its GPU, on the
caller's current stream, by the kernels of ``kernels_cuda/mx_codec.cuh`` (``mxcore.backends.codec``), with
the same codes and scales bit for bit: :func:`quantize_mx` is one pass that reads the input once and writes
codes, scales and ``MXTensor.scale_max``; :func:`quantize_tensor` is one amax reduction and one encode pass
that reads the scale from device memory (``ScaledTensor.scale`` / ``scale_exp`` stay on the device).
Neither synchronises.  The tensors keep the input's kind of array; ``to_host()`` / ``to_device(like=...)``
(and :func:`to_host` / :func:`to_device`) move them.  ``block`` other than 32 is a codec feature only:
matmul takes blocks of 32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _codec_exact as _exact
from . import _codec_host as _host
from . import formats as _f
from .arrays import device_kind
from .dtypes import MX_BLOCK, MX_ELEMENT, canonical_operand
from .errors import FormatError, InputTypeError, ShapeError, UnknownNameError, UnsupportedError

__all__ = [
    "MXTensor",
    "SCALE_ROUNDINGS",
    "ScaledTensor",
    "dequantize",
    "mx_element",
    "quantize_mx",
    "quantize_tensor",
    "to_device",
    "to_host",
]

SCALE_ROUNDINGS = ("floor", "rceil")
_E8M0_BIAS = 127
_E8M0_NAN = 0xFF


def mx_element(fmt: str) -> tuple[str, _f.FormatSpec]:
    """Canonical MX format name (``mxfp8`` → ``mxfp8_e4m3``) and its element :class:`FormatSpec`."""
    try:
        name = canonical_operand(fmt) if isinstance(fmt, str) else None
    except UnknownNameError:
        name = None
    if name not in MX_ELEMENT:
        raise UnknownNameError(f"{fmt!r} is not an MX format; MX formats: {', '.join(MX_ELEMENT)} "
                               "(aliases mxfp8, mxfp6)")
    return name, _f.get(MX_ELEMENT[name])


def _codec():
    from .backends import device_codec

    return device_codec()


def _dtype_name(a) -> str:
    return str(a.dtype).replace("torch.", "")


def _moveaxis(a, src: int, dst: int):
    kind = device_kind(a)
    if kind == "torch":
        return a.movedim(src, dst)
    if kind is not None:
        import cupy

        return cupy.moveaxis(cupy.asarray(a), src, dst)
    return np.moveaxis(a, src, dst)


@dataclass(frozen=True, eq=False)
class MXTensor:
    """An OCP MX block-quantized tensor (see the module doc for the scale rules).

    ``codes``: uint8 element codes, logical shape, one per element, unpacked (see :meth:`packed`).
    ``scales``: uint8 E8M0 codes, ``shape`` with ``axis`` of length ``ceil(K / block)``.
    ``fmt``: canonical MX name (``"mxfp8_e4m3"``, ``"mxfp4"``, ...).  ``axis``: the block axis,
    non-negative.  ``block``: elements per scale (32; other lengths are codec-only, matmul refuses them).
    ``shape``: the logical shape.  ``scale_max``: the largest finite scale code (127 when every block is
    NaN), what a GEMM needs to place the blocks' range; an int for host tensors, a 0-d uint8 device array
    for device tensors (computed on the device, so staging a device MXTensor needs no host sync).

    Codes and scales are numpy arrays, or both CuPy arrays / both torch CUDA tensors on one device (from
    :func:`quantize_mx` of device data, or :meth:`to_device`).  Device tensors are validated by dtype and
    shape only (checking every code's range would synchronise); :meth:`to_host` / :meth:`to_device` move them.
    """

    codes: object
    scales: object
    fmt: str
    axis: int
    block: int = MX_BLOCK
    shape: tuple = ()
    scale_max: object = None

    def __post_init__(self):
        name, spec = mx_element(self.fmt)
        object.__setattr__(self, "fmt", name)
        kinds = (device_kind(self.codes), device_kind(self.scales))
        if kinds[0] != kinds[1]:
            raise InputTypeError(f"MXTensor codes and scales must live in the same place, got {type(self.codes).__name__} "
                                 f"and {type(self.scales).__name__}; use MXTensor.to_host() / to_device(like=...)")
        if kinds[0] is None:
            codes, scales = np.asarray(self.codes), np.asarray(self.scales)
        else:
            codes, scales = self.codes, self.scales
        if _dtype_name(codes) != "uint8" or _dtype_name(scales) != "uint8":
            raise InputTypeError(f"MXTensor codes and scales must be uint8 arrays, "
                                 f"got {_dtype_name(codes)} and {_dtype_name(scales)}")
        shape = tuple(self.shape) if self.shape else tuple(codes.shape)
        if tuple(codes.shape) != shape:
            raise ShapeError(f"MXTensor codes have shape {tuple(codes.shape)} but shape={shape}")
        if not 0 <= self.axis < max(len(shape), 1) or self.block < 1:
            raise ShapeError(f"MXTensor axis={self.axis}, block={self.block} do not fit shape {shape}")
        want = list(shape)
        want[self.axis] = -(-shape[self.axis] // self.block)
        if tuple(scales.shape) != tuple(want):
            raise ShapeError(f"MXTensor scales have shape {tuple(scales.shape)}; shape {shape} with blocks of "
                             f"{self.block} along axis {self.axis} needs {tuple(want)}")
        if kinds[0] is None:
            if codes.size and int(codes.max()) >> spec.bits:
                raise FormatError(f"MXTensor codes hold values above {(1 << spec.bits) - 1:#x}, not {spec.name} "
                                  "codes (packed bytes? unpack them first)")
            finite = scales[scales != _E8M0_NAN]
            scale_max = int(finite.max()) if finite.size else _E8M0_BIAS
        else:
            scale_max = self.scale_max if self.scale_max is not None else _codec().max_finite_scale(scales)
        object.__setattr__(self, "codes", codes)
        object.__setattr__(self, "scales", scales)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "scale_max", scale_max)

    @property
    def element(self) -> str:
        """The element format's name in :mod:`mxcore.formats` (``e4m3fn``, ``e2m1``, ...)."""
        return MX_ELEMENT[self.fmt]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def device(self) -> str | None:
        """``"cupy"`` / ``"torch"`` for device tensors, None on the host."""
        return device_kind(self.codes)

    def to_host(self) -> MXTensor:
        """The same tensor with numpy codes and scales (a device→host copy; synchronises)."""
        if self.device is None:
            return self
        from .arrays import to_numpy

        return MXTensor(to_numpy(self.codes), to_numpy(self.scales), self.fmt, self.axis, self.block, self.shape)

    def to_device(self, like) -> MXTensor:
        """The same tensor on the device of ``like`` (a CuPy array or torch CUDA tensor), as that kind of array."""
        host = self.to_host()
        c = _codec()
        return MXTensor(c.to_device(host.codes, like), c.to_device(host.scales, like), self.fmt, self.axis, self.block,
                        self.shape, c.to_device(np.array(host.scale_max, np.uint8), like))

    def scale_values(self):
        """The block scales as float64 (2^(code-127); NaN for code 0xFF), where the scales live."""
        return _f.decode(self.scales, "e8m0", dtype=np.float64)

    def packed(self):
        """Element codes packed along ``axis`` (moved back in place): two fp4 per byte (even element in
        the low nibble), four fp6 per three bytes (LSB first); fp8 codes are returned as they are."""
        bits = _f.get(self.element).bits
        if bits == 8:
            return self.codes
        c = _moveaxis(self.codes, self.axis, -1)
        p = _f.pack_fp4(c) if bits == 4 else _f.pack_fp6(c)
        return _moveaxis(p, -1, self.axis)

    @classmethod
    def from_blocks(cls, blocks, scales, fmt: str = "mxfp4") -> MXTensor:
        """An MXTensor from the packed block layout of published MX checkpoints, without requantizing.

        ``blocks``: uint8 ``[..., n_blocks, B]`` with the 32 element codes of each block packed into ``B`` bytes:
        mxfp4 ``B = 16``, two E2M1 codes per byte, the earlier element in the low nibble (gpt-oss's
        ``*.blocks`` tensors); mxfp6 ``B = 24``, four codes per three bytes, LSB first (:func:`mxcore.formats.pack_fp6`);
        mxfp8 ``B = 32``, one code per byte.  ``scales``: uint8 E8M0 codes ``[..., n_blocks]`` (bias 127, 0xFF NaN;
        gpt-oss's ``*.scales``).  numpy arrays, or torch / CuPy arrays (device data stays on its device).  The
        result has shape ``[..., n_blocks * 32]``, blocked along its last axis; for a weight stored ``[out, in]``
        that is the K axis of ``W.T`` (pass ``MXTensor(t.codes.T, t.scales.T, t.fmt, 0)`` as matmul's B)."""
        name, spec = mx_element(fmt)
        nbytes = MX_BLOCK * spec.bits // 8
        kind = device_kind(blocks)
        if kind is None:  # host data (numpy, torch CPU tensors, lists): the host MXTensor keeps numpy arrays
            blocks = np.asarray(blocks)
        if device_kind(scales) is None:
            scales = np.asarray(scales)
        if _dtype_name(blocks) != "uint8" or _dtype_name(scales) != "uint8":
            raise InputTypeError(f"from_blocks takes uint8 blocks and scales, got {_dtype_name(blocks)} and "
                                 f"{_dtype_name(scales)}")
        bshape, sshape = tuple(blocks.shape), tuple(scales.shape)
        if len(bshape) < 2 or bshape[-1] != nbytes or bshape[:-1] != sshape:
            raise ShapeError(f"from_blocks({name}) takes blocks [..., n_blocks, {nbytes}] and scales [..., n_blocks]; "
                             f"got blocks {bshape} and scales {sshape}")
        b = blocks
        if spec.bits == 4:
            parts = (b & 0x0F, b >> 4)
        elif spec.bits == 6:
            if kind == "torch":
                import torch

                wide = b.to(torch.int32)
            else:
                wide = b.astype(np.int32)
            word = wide[..., 0::3] | (wide[..., 1::3] << 8) | (wide[..., 2::3] << 16)
            parts = tuple(((word >> (6 * i)) & 0x3F) for i in range(4))
        else:
            parts = (b,)
        if len(parts) > 1:
            if kind == "torch":
                import torch

                codes = torch.stack(parts, dim=-1).to(torch.uint8)
            elif kind is not None:
                import cupy

                codes = cupy.stack(parts, axis=-1).astype(cupy.uint8)
            else:
                codes = np.stack(parts, axis=-1).astype(np.uint8)
        else:
            codes = b
        shape = bshape[:-2] + (bshape[-2] * MX_BLOCK,)
        return cls(codes.reshape(shape), scales, name, len(shape) - 1, MX_BLOCK, shape)

    def __repr__(self) -> str:
        where = f", device={self.device!r}" if self.device else ""
        return (f"MXTensor(fmt={self.fmt!r}, shape={self.shape}, axis={self.axis}, block={self.block}, "
                f"scales{tuple(self.scales.shape)}{where})")


@dataclass(frozen=True, eq=False)
class ScaledTensor:
    """A per-tensor scaled tensor: value = decode(codes, fmt) * scale.

    ``codes``: uint8; ``fmt``: element format name (``e4m3fn``, ``e5m2``, ``e4m3fnuz``, ``e5m2fnuz``, ...).
    Host tensors: ``scale`` a Python float, a power of two, and ``scale_exp`` its exponent (int).  Device
    tensors (from :func:`quantize_tensor` of device data): ``codes`` a CuPy array / torch CUDA tensor,
    ``scale`` a 0-d float32 and ``scale_exp`` a 0-d int32 device array of the same kind, computed on the
    device and never read back (a GEMM reads them there; ``float(t.scale)`` synchronises)."""

    codes: object
    scale: object
    fmt: str
    scale_exp: object = None

    def __post_init__(self):
        spec = _f.get(self.fmt)
        object.__setattr__(self, "fmt", spec.name)
        if device_kind(self.codes) is None:
            object.__setattr__(self, "codes", np.asarray(self.codes))
            object.__setattr__(self, "scale", float(self.scale))
            f, e = np.frexp(self.scale)
            if not (np.isfinite(self.scale) and self.scale > 0 and f == 0.5):
                raise FormatError(f"ScaledTensor scale must be a positive power of two, got {self.scale!r}")
            object.__setattr__(self, "scale_exp", int(e) - 1)
        elif device_kind(self.scale) is None or self.scale_exp is None:
            raise InputTypeError("a device ScaledTensor needs scale and scale_exp as 0-d device arrays "
                                 "(mxcore.quantize_tensor makes them); or build it on the host and call to_device")
        if _dtype_name(self.codes) != "uint8":
            raise InputTypeError(f"ScaledTensor codes must be uint8, got {_dtype_name(self.codes)}")

    @property
    def shape(self) -> tuple:
        return tuple(self.codes.shape)

    @property
    def ndim(self) -> int:
        return len(self.codes.shape)

    @property
    def device(self) -> str | None:
        return device_kind(self.codes)

    def to_host(self) -> ScaledTensor:
        """The same tensor with numpy codes and a float scale (synchronises for device tensors)."""
        if self.device is None:
            return self
        from .arrays import to_numpy

        return ScaledTensor(to_numpy(self.codes), float(np.ldexp(1.0, int(to_numpy(self.scale_exp)))), self.fmt)

    def to_device(self, like) -> ScaledTensor:
        """The same tensor on the device of ``like`` (CuPy array / torch CUDA tensor), that kind of array."""
        host = self.to_host()
        c = _codec()
        return ScaledTensor(c.to_device(host.codes, like), c.to_device(np.array(host.scale, np.float32), like),
                            self.fmt, c.to_device(np.array(host.scale_exp, np.int32), like))

    def __repr__(self) -> str:
        if self.device:
            return f"ScaledTensor(fmt={self.fmt!r}, shape={self.shape}, scale on {self.device})"
        return f"ScaledTensor(fmt={self.fmt!r}, shape={self.shape}, scale=2**{self.scale_exp})"


def to_host(t):
    """An :class:`MXTensor` / :class:`ScaledTensor` with host (numpy) arrays; plain arrays via mxcore.arrays.to_numpy."""
    if isinstance(t, (MXTensor, ScaledTensor)):
        return t.to_host()
    from .arrays import to_numpy

    return to_numpy(t)


def to_device(t, like):
    """``t`` (an :class:`MXTensor`, :class:`ScaledTensor` or host array) on the device of ``like`` (a CuPy array
    or torch CUDA tensor), as that kind of array."""
    if isinstance(t, (MXTensor, ScaledTensor)):
        return t.to_device(like)
    return _codec().to_device(np.asarray(t), like)


def _check_block(block, k: int) -> None:
    """``block`` must be a positive integer no longer than ``max(K, MX_BLOCK)``: a longer block only
    pads with zeros (and would allocate ``block`` elements per row)."""
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise ShapeError(f"block={block!r}; pass a positive integer (OCP MX uses {MX_BLOCK})")
    if block > max(k, MX_BLOCK):
        raise ShapeError(f"block={block} is longer than the blocked axis ({k} elements): a block longer than "
                         f"max(K, {MX_BLOCK}) holds only padding; pass block={MX_BLOCK} (OCP MX) or at most {max(k, MX_BLOCK)}")


def _check_axis(axis) -> None:
    """An axis is an integer (a bool, float or string would be read as something else, or fail deep inside)."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise InputTypeError(f"axis={axis!r} ({type(axis).__name__}); pass an integer axis, e.g. axis=-1 (blocks "
                             "along rows, an A operand) or axis=0 (along columns, a B operand)")


def _check_values(x, what: str) -> None:
    from .arrays import check_unmasked

    check_unmasked(x, what)


def _is_real_number(v) -> bool:
    return (isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)))


def _host_amax(amax) -> float:
    """A host ``amax``: a real, finite, non-negative number (a Python or numpy scalar, or a 0-d real array)."""
    if not _is_real_number(amax):
        if getattr(amax, "shape", None) is None or getattr(amax, "dtype", None) is None:
            raise InputTypeError(f"amax={amax!r} ({type(amax).__name__}); pass a real number (a float or a 0-d "
                                 "array), or omit amax")
        if tuple(amax.shape) != ():
            raise ShapeError(f"amax has shape {tuple(amax.shape)}; pass one magnitude (a float or a 0-d array), e.g. "
                             "the maximum over every shard")
        from .arrays import to_numpy

        a = to_numpy(amax)
        if a.dtype.kind not in "fiu" and not (a.dtype.kind == "V" and a.dtype.name.startswith(("float", "bfloat"))):
            raise InputTypeError(f"amax has dtype {amax.dtype}; pass a real number (a float), or omit amax")
        amax = a.astype(np.float64)[()]
    value = float(amax)
    if not np.isfinite(value) or value < 0:
        raise FormatError(f"amax={value!r}; pass a finite magnitude >= 0 (the largest finite |x| over every shard), "
                          "or omit amax to use x's own")
    return value


def _check_device_amax(amax) -> None:
    """A device ``amax`` is one element on a GPU; its value is not read (that would synchronise)."""
    from .arrays import device_kind as _kind

    if amax is None:
        return
    if _kind(amax) is None:
        raise InputTypeError(f"amax={amax!r} ({type(amax).__name__}) is not on a GPU but x is; pass a 0-d array on "
                             "x's device (e.g. the all-reduced amax), or omit amax")
    if tuple(amax.shape) not in ((), (1,)):
        raise ShapeError(f"amax has shape {tuple(amax.shape)}; pass one magnitude (a 0-d array on x's device)")


def _float_dtype(dtype):
    """``dequantize``'s result dtype as a numpy / ml_dtypes dtype: a real floating-point type only."""
    import ml_dtypes

    if dtype is None:
        raise InputTypeError("dtype=None; pass a float dtype: np.float32 (default), np.float64 (exact), "
                             "np.float16 or ml_dtypes.bfloat16")
    text = str(dtype)
    if (type(dtype).__module__ or "").startswith("torch") and text.startswith("torch."):
        text = text[len("torch."):]
        dtype = ml_dtypes.bfloat16 if text == "bfloat16" else text
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        raise InputTypeError(f"dtype={dtype!r} is not a dtype; pass a float dtype: np.float32 (default), np.float64 "
                             "(exact), np.float16 or ml_dtypes.bfloat16") from None
    if dt.kind == "f" and dt.itemsize <= 8:
        return dt
    if dt.kind == "V":
        try:
            ml_dtypes.finfo(dt)
            return dt
        except (TypeError, ValueError):
            pass
    raise InputTypeError(f"dtype={dt} for dequantize: the values are real floating-point numbers; pass np.float32 "
                         "(default), np.float64 (exact), np.float16 or ml_dtypes.bfloat16")


def quantize_mx(x, fmt: str, *, axis: int = -1, block: int = MX_BLOCK, scale_rounding: str = "floor") -> MXTensor:
    """Quantize ``x`` (float array) to MX format ``fmt`` with one E8M0 scale per ``block`` consecutive
    elements along ``axis`` (A [M, K]: axis=-1; B [K, N]: axis=0).  See the module doc for the rules.

    Device data (CuPy array, torch CUDA tensor, DLPack producer on a GPU): one kernel on that GPU and the
    caller's current stream reads ``x`` once and writes codes, scales and ``scale_max``; the MXTensor keeps
    them there, as the input's kind of array; bit-identical to the host path; no synchronisation."""
    name, spec = mx_element(fmt)
    if scale_rounding not in SCALE_ROUNDINGS:
        raise UnsupportedError(f"scale_rounding={scale_rounding!r}; use 'floor' (OCP MX v1.0) or 'rceil' (cuBLAS)")
    _check_axis(axis)
    _check_values(x, "x")
    if device_kind(x) is not None:
        shape = tuple(x.shape)
        if not shape:
            raise ShapeError("quantize_mx takes an array of at least one dimension")
        if not -len(shape) <= axis < len(shape):
            raise ShapeError(f"axis={axis} is out of range for an array of shape {shape}")
        axis = axis % len(shape)
        _check_block(block, shape[axis])
        codes, scales, smax = _codec().quantize_mx(x, spec, axis=axis, block=int(block),
                                                   rceil=scale_rounding == "rceil")
        return MXTensor(codes, scales, name, axis, int(block), shape, smax)
    xa = _host.as_float(x)
    if xa.ndim == 0:
        raise ShapeError("quantize_mx takes an array of at least one dimension")
    if not -xa.ndim <= axis < xa.ndim:
        raise ShapeError(f"axis={axis} is out of range for an array of shape {xa.shape}")
    axis = axis % xa.ndim
    _check_block(block, xa.shape[axis])
    codes, scales = _host.quantize_mx(xa, spec, axis=axis, block=block, rceil=scale_rounding == "rceil")
    return MXTensor(codes, scales, name, axis, block, xa.shape)


def quantize_tensor(x, fmt: str, *, amax=None, order: str = "C") -> ScaledTensor:
    """Per-tensor power-of-two scaling to element format ``fmt`` (``e4m3fn``, ``fp8``, ``e5m2``,
    ``e4m3fnuz``, ...): ``scale = 2^ceil(log2(amax / max_normal))`` over the finite values (1 for an
    all-zero tensor), exponent clamped to [-126, 127]; codes = encode(x / scale).

    ``amax``: scale by this magnitude instead of ``x``'s own finite amax — e.g. the global amax of a tensor
    sharded across GPUs, so that every shard gets the whole tensor's scale.  It must be at least ``x``'s finite
    amax and exactly representable in ``x``'s dtype (a maximum over values of that dtype is); a float or 0-d
    array for host data (checked: ShapeError otherwise), a 0-d array on ``x``'s device for device data (not
    checked there: that would synchronise).

    ``order``: the codes' memory order, ``"C"`` (default) or ``"F"`` (2-D only: column-major, as the GEMM kernels
    read a B operand [K, N] — K contiguous — so matmul stages nothing; on the device one transposing encode).

    Device data: one amax reduction kernel (none with ``amax``), then one encode kernel that reads the amax
    (and so the scale) from device memory; the returned ScaledTensor keeps ``scale`` / ``scale_exp`` on the
    device.  It does not synchronise (except for NaN input in a format without NaN, which raises as on the host)."""
    spec = _f.get(fmt)
    if spec.bits > 8 or not spec.signed:
        raise UnsupportedError(f"quantize_tensor makes codes of a signed format of at most 8 bits; got {spec.name}")
    if order not in ("C", "F"):
        raise UnsupportedError(f"order={order!r}; use 'C' (row-major codes) or 'F' (column-major, 2-D)")
    if order == "F" and len(getattr(x, "shape", ())) != 2:
        raise ShapeError(f"order='F' is for 2-D tensors (B [K, N]); got shape {tuple(getattr(x, 'shape', ()))}")
    _check_values(x, "x")
    if device_kind(x) is not None:
        _check_device_amax(amax)
    elif amax is not None:
        amax = _host_amax(amax)
    if device_kind(x) is not None:
        codes, scale, exp = _codec().quantize_tensor(x, spec, amax=amax, order=order)
        return ScaledTensor(codes, scale, spec.name, exp)
    xa = _host.as_float(x)
    own = _host.finite_amax(xa)
    if amax is None:
        amax = own
    else:
        if not amax >= own:
            raise ShapeError(f"amax={amax!r} is below the tensor's own largest finite magnitude {own!r}: pass the "
                             "maximum over every shard (or omit amax)")
    k = _exact.tensor_exponent(amax, spec)
    codes = _host.encode_scaled(xa, spec, k)
    return ScaledTensor(np.asfortranarray(codes) if order == "F" else codes, float(np.ldexp(1.0, k)), spec.name)


def dequantize(t, dtype=np.float32) -> np.ndarray:
    """Values of an :class:`MXTensor` or :class:`ScaledTensor`, computed exactly in float64 and rounded
    once to ``dtype`` (float32 by default; values beyond float32's range, such as 448 · 2^127, become
    ±inf there: ask for ``dtype=np.float64`` to stay exact).  Device tensors are dequantized on their GPU and
    return the same kind of array."""
    if not isinstance(t, (MXTensor, ScaledTensor)):
        raise InputTypeError(f"dequantize takes an MXTensor or a ScaledTensor, got {type(t).__name__}; "
                             "make one with mxcore.quantize_mx or mxcore.quantize_tensor")
    dtype = _float_dtype(dtype)
    if isinstance(t, (MXTensor, ScaledTensor)) and t.device is not None:
        c = _codec()
        if isinstance(t, MXTensor):
            return c.dequantize_mx(t.codes, t.scales, _f.get(t.element), axis=t.axis, block=t.block, dtype=dtype)
        return c.dequantize_tensor(t.codes, _f.get(t.fmt), scale_exp=t.scale_exp, dtype=dtype)
    if isinstance(t, MXTensor):
        return _host.dequantize_mx(t.codes, t.scales, _f.get(t.element), axis=t.axis, block=t.block, dtype=dtype)
    if isinstance(t, ScaledTensor):
        return _host.dequantize_tensor(t.codes, _f.get(t.fmt), t.scale_exp, dtype=dtype)
    raise InputTypeError(f"dequantize takes an MXTensor or a ScaledTensor, got {type(t).__name__}")
