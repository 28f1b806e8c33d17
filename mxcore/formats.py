"""Bit-exact reference codecs for the low-precision number formats matrix cores read.

One frozen :class:`FormatSpec` per format describes it as data (exponent and mantissa widths, bias,
sign, subnormals, and which codes are special); :func:`encode`, :func:`decode` and :func:`round_to`
are generic over the spec: no code path asks a format's name.

==========  ====  ======  ====  ===========  ===========  ============  =============  =====================
format      bits  layout  bias  max normal   min normal   min subnorm.  inf / NaN      ml_dtypes
==========  ====  ======  ====  ===========  ===========  ============  =============  =====================
e4m3fn      8     S4.3    7     448          2^-6         2^-9          - / S.1111.111 float8_e4m3fn
e4m3fnuz    8     S4.3    8     240          2^-7         2^-10         - / 0x80       float8_e4m3fnuz
e5m2        8     S5.2    15    57344        2^-14        2^-16         IEEE           float8_e5m2
e5m2fnuz    8     S5.2    16    57344        2^-15        2^-17         - / 0x80       float8_e5m2fnuz
e2m3        6     S2.3    1     7.5          1            0.125         - / -          float6_e2m3fn
e3m2        6     S3.2    3     28           0.25         0.0625        - / -          float6_e3m2fn
e2m1        4     S2.1    1     6            1            0.5           - / -          float4_e2m1fn
e8m0        8     8.0     127   2^127        2^-127       (none)        - / 0xFF       float8_e8m0fnu
fp16        16    S5.10   15    65504        2^-14        2^-24         IEEE           float16
bf16        16    S8.7    127   ~3.39e38     2^-126       2^-133        IEEE           bfloat16
tf32        19    S8.10   127   ~3.40e38     2^-126       2^-136        IEEE           (none)
fp32        32    S8.23   127   ~3.40e38     2^-126       2^-149        IEEE           float32
==========  ====  ======  ====  ===========  ===========  ============  =============  =====================

Conversion rules (every one is tested in ``tests/test_formats.py``):

* **One rounding from the input value.**  Every input is rounded once from its exact value (float16,
  bfloat16 and the other ml_dtypes types embed exactly in float32).  The host path rounds with ml_dtypes'
  cast, which rounds float32 once; float64 is cast directly with ml_dtypes >= 0.7 (one rounding) and with
  older versions, which round it through float32, it is first rounded *to odd* into float32, so a float64
  input just above an fp8 midpoint still rounds up where float32 would have rounded it *onto* the
  midpoint.  mxcore's own code decides what a cast does not (the overflow and NaN policies below, rtz,
  stochastic rounding, E8M0).  The exact float64 codec (``mxcore._codec_exact``: scale by the power-of-two
  quantum at the value's exponent, round to an integer, rescale) is the oracle the fast path is tested
  against, code for code.
* **Rounding modes.**  ``"rne"``: to nearest, ties to the even significand (at every midpoint,
  subnormals included; for every format with mantissa bits that is the even code.  E8M0 has no
  mantissa bits: its ties, ``1.5 * 2^e``, go to ``2^(e+1)``, the even significand, as in ml_dtypes).
  ``"rtz"``: toward zero.  ``"stochastic"``: up with probability equal to the fraction of a quantum
  the value lies above the lower neighbour, so the expected result is the input (pass ``rng``, a
  ``numpy.random.Generator`` or a seed).
* **Overflow** (a rounded magnitude above ``max_normal``):
  ``overflow="saturate"`` (default) gives ``±max_normal``, and applies to ±inf inputs as well
  (OCP FP8 saturation mode, PTX ``cvt.satfinite``); ``overflow="nan"`` follows the format's IEEE-like
  rule, as ml_dtypes' ``astype`` does: inf where the format has inf (e5m2), NaN where it has only NaN
  (e4m3fn, the FNUZ formats, e8m0).  Under ``rounding="rtz"`` IEEE 754 gives ``±max_normal`` for
  finite overflow in either mode (only an infinite input stays infinite).  e2m1, e2m3 and e3m2 have
  neither inf nor NaN: finite and infinite overflow always saturate (OCP MX v1.0 §5.3, ml_dtypes).
* **NaN.**  Signed formats with NaN keep the NaN's sign: e4m3fn NaN → 0x7F / 0xFF, e5m2 → 0x7E /
  0xFE (quiet NaN).  FNUZ formats have one NaN, 0x80.  e2m1, e2m3, e3m2 have no NaN: ``nan="raise"``
  (default) raises :class:`~mxcore.errors.FormatError`; ``nan="zero"`` encodes NaN as +0 (code 0).
  (ml_dtypes silently turns NaN into ±0 there.)  :func:`round_to` also takes ``nan="propagate"``.
* **Zero.**  FNUZ formats have no −0: −0 and negative values that round to zero encode to 0x00.
  The other signed formats keep −0 (0x80, or 0x8 / 0x20 for fp4 / fp6).
* **E8M0** (the MX scale): unsigned, no zero, no subnormals; code c is ``2^(c-127)`` (0x00 is
  2^-127), 0xFF is NaN.  A non-power of two rounds per the rounding mode on its value (``"rne"``:
  nearest power of two, ``1.5 * 2^e`` → ``2^(e+1)``).  Positive values below 2^-127 encode to 0x00
  (there is no zero to round to, in every rounding mode).  Zero, negative values and −inf encode to
  NaN (0xFF), as ml_dtypes does.
* **Canonical codes.**  :func:`encode` returns one canonical code per value; ``encode(decode(c)) == c``
  for every code except the extra NaN payloads of e5m2 (0x7D, 0x7F, 0xFD, 0xFF re-encode to the
  quiet NaN 0x7E / 0xFE) and of the wide IEEE formats.  e4m3fn, e4m3fnuz, e5m2fnuz, e2m1, e2m3,
  e3m2 and e8m0 have no non-canonical codes.
* **Decoding** takes integer codes (or an ml_dtypes array of the same format) and returns float32
  (every value of every format here is exactly a float32).  A code outside ``[0, 2^bits)``, such as a
  byte above 0x0F for fp4, raises :class:`~mxcore.errors.FormatError`.
* **Packing**: :func:`pack_fp4` puts two e2m1 codes in a byte, the even element in the low nibble;
  :func:`pack_fp6` puts four 6-bit codes in three bytes, LSB first: value ``i`` of a group occupies bits
  ``[6i, 6i+6)`` of the little-endian 24-bit group (byte 0 = v0 | v1<<6, byte 1 = v1>>2 | v2<<4,
  byte 2 = v2>>4 | v3<<2); the order AMD's rocRoller reads fp6 buffers in (``getFp6``).
* **Device arrays.**  :func:`encode`, :func:`decode`, :func:`pack_fp4` / :func:`unpack_fp4`,
  :func:`pack_fp6` / :func:`unpack_fp6` also take CuPy arrays, torch CUDA tensors and other DLPack
  producers on a GPU: they run there (``kernels_cuda/mx_codec.cuh``, one source for NVRTC and hiprtc),
  on the array's device and the caller's current stream, and return the same kind of array, with the
  same codes as the numpy path bit for bit (every format, ``rne`` / ``rtz``, both overflow and NaN
  policies; float64 inputs are rounded from their exact value on the device too).  ``"stochastic"``
  is host-only (:class:`~mxcore.errors.UnsupportedError` on a device array).  Device calls do not
  synchronise, except to raise the errors the host raises: ``nan="raise"`` for a format without NaN,
  and integer codes wider than the format (decode / packing), each read one counter once.
"""

from __future__ import annotations

import numpy as np

from . import _codec_host as _host
from ._codec_host import nan_error, policy_checks  # noqa: F401  (the argument checks the device codecs share)
from ._format_specs import FORMATS, ROUNDINGS, SPECIALS, FormatSpec, exact_shifts, get, names  # noqa: F401
from ._formats_text import _cli  # noqa: F401  (python -m mxcore formats)

__all__ = [
    "FORMATS",
    "FormatSpec",
    "ROUNDINGS",
    "decode",
    "encode",
    "exact_shifts",
    "get",
    "names",
    "pack_fp4",
    "pack_fp6",
    "round_to",
    "unpack_fp4",
    "unpack_fp6",
]


def _refuse_masked(x) -> None:
    """A numpy masked array is refused: converting it (numpy.asarray) would drop the mask and use the masked entries
    as values."""
    if isinstance(x, np.ma.MaskedArray):
        from .errors import InputTypeError

        raise InputTypeError("a numpy masked array, whose mask mxcore.formats would ignore; pass plain data: "
                             "x.filled(value) to choose what masked entries become, or x.compressed()")


def _device(x):
    """The device codec module when ``x`` is a GPU array (CuPy, torch CUDA, DLPack on a GPU), else None.
    Imports nothing for host data; refuses masked arrays."""
    from .arrays import device_kind

    _refuse_masked(x)
    if device_kind(x) is None:
        return None
    from .backends import device_codec

    return device_codec()


def encode(x, fmt, *, rounding: str = "rne", overflow: str = "saturate", nan: str = "raise",
           rng=None):
    """Round ``x`` once to format ``fmt`` and return the canonical codes (uint8 for formats of at most 8
    bits; uint16 / uint32 for fp16, bf16 / tf32, fp32), same shape as ``x``.

    ``rounding``: ``"rne"`` | ``"rtz"`` | ``"stochastic"`` (with ``rng``: a Generator or a seed; host only).
    ``overflow``: ``"saturate"`` (±max, also for ±inf) | ``"nan"`` (inf, or NaN where the format has no inf).
    ``nan``: for formats without NaN, ``"raise"`` (FormatError) | ``"zero"`` (+0).  See the module doc.
    A device array (CuPy / torch CUDA / DLPack) is encoded on its GPU and the codes stay there.
    """
    dev = _device(x)
    if dev is not None:
        return dev.encode(x, get(fmt), rounding=rounding, overflow=overflow, nan=nan, rng=rng)
    return _host.encode(x, fmt, rounding=rounding, overflow=overflow, nan=nan, rng=rng)


def round_to(x, fmt, *, rounding: str = "rne", overflow: str = "saturate", nan: str = "raise",
             rng=None) -> np.ndarray:
    """Quantize-dequantize ``x`` to ``fmt`` (any format here, fp16 / bf16 / tf32 / fp32 included) with one
    exact rounding from the input value; returns float64 (host arrays).  Same rules as :func:`encode`;
    ``nan="propagate"`` also returns NaN for NaN inputs in formats without NaN."""
    _refuse_masked(x)
    return _host.round_to(x, fmt, rounding=rounding, overflow=overflow, nan=nan, rng=rng)


def decode(codes, fmt, *, dtype=np.float32):
    """Values of ``codes`` (integers, or an ml_dtypes array of the format) as float32 (exact for every
    format here); ``dtype=np.float64`` on request.  Invalid codes raise FormatError.  Device codes are
    decoded on their GPU (same kind of array back)."""
    dev = _device(codes)
    if dev is not None:
        return dev.decode(codes, get(fmt), dtype=dtype)
    return _host.decode(codes, fmt, dtype=dtype)


def pack_fp4(codes):
    """Pack 4-bit codes two per byte along the last axis: element 2j in the low nibble, 2j+1 in the high
    nibble.  An odd length is padded with a zero code; pass ``count`` to :func:`unpack_fp4` to trim."""
    dev = _device(codes)
    return dev.pack(codes, 4) if dev is not None else _host.pack_fp4(codes)


def unpack_fp4(packed, count: int | None = None):
    """Inverse of :func:`pack_fp4`: 2 codes per byte along the last axis, trimmed to ``count`` if given."""
    dev = _device(packed)
    return dev.unpack(packed, 4, count) if dev is not None else _host.unpack_fp4(packed, count)


def pack_fp6(codes):
    """Pack 6-bit codes four per three bytes along the last axis, LSB first: value i of a group of four
    occupies bits [6i, 6i+6) of the group's little-endian 24-bit word.  The length is padded with zero
    codes to a multiple of 4; pass ``count`` to :func:`unpack_fp6` to trim."""
    dev = _device(codes)
    return dev.pack(codes, 6) if dev is not None else _host.pack_fp6(codes)


def unpack_fp6(packed, count: int | None = None):
    """Inverse of :func:`pack_fp6` (the last axis must be a multiple of 3 bytes)."""
    dev = _device(packed)
    return dev.unpack(packed, 6, count) if dev is not None else _host.unpack_fp6(packed, count)
