"""How the format codecs run on a GPU: what is compiled, where a call runs, and recording for replay.

* :func:`format_defines` / :func:`compile_inputs` / :func:`entry_points`: the ``-D`` defines generated from a
  :class:`~mxcore.formats.FormatSpec`, the exact (source, options) each module is built from (NVRTC, or hiprtc
  under CuPy on ROCm), and the kernels a module holds.
* :func:`_on` / :class:`_Call`: one codec call on the device that holds the data and the caller's current stream
  (torch's for torch tensors, CuPy's otherwise); views of the inputs, outputs of the caller's kind, the module
  and kernel caches (one module per format and device).
* :func:`recording` / :class:`Recording` / :class:`Replay`: the launches and counter resets of the calls made
  inside, re-run later with new input addresses into the same output buffers (``Backend.fast_matmul``).

:mod:`mxcore.backends.codec` (the codecs themselves) is built on this module.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from ..arrays import device_kind
from ..errors import InputTypeError, UnsupportedError
from ..formats import SPECIALS, FormatSpec
from ..kernels import kernel_source

__all__ = ["FAST_SUFFIXES", "INPUT_SUFFIXES", "THREADS", "Recording", "Replay", "compile_inputs", "entry_points",
           "format_defines", "recording"]

THREADS = 256
# float input types the kernels read as raw bits: numpy/torch dtype name -> (kernel suffix, unsigned bits dtype)
INPUT_SUFFIXES = {"float32": ("f32", "uint32"), "float16": ("f16", "uint16"), "bfloat16": ("bf16", "uint16"),
                  "float64": ("f64", "uint64")}
# input kinds the fast MX quantizer (mx_quantize_mx_fast_*) takes: at most 32 bits
FAST_SUFFIXES = ("f32", "f16", "bf16")
_CODE_T = {1: "mxc_u8", 2: "mxc_u16", 4: "mxc_u32"}
_SIGNED_OF = {"uint8": "uint8", "uint16": "int16", "uint32": "int32", "uint64": "int64"}


# ---- what gets compiled -----------------------------------------------------------------------------------------
def format_defines(spec: FormatSpec) -> tuple[str, ...]:
    """The ``-D`` defines that make ``mx_codec.cuh`` encode/decode ``spec``: every constant read from the spec."""
    m = spec.mbits
    maxsig = (1 << m) | (spec.max_magcode & ((1 << m) - 1))  # max normal = maxsig * 2^(emax - m)
    vals = {
        "BITS": spec.bits, "EBITS": spec.ebits, "MBITS": m, "BIAS": spec.bias, "EMIN": spec.emin, "EMAX": spec.emax,
        "SIGNED": int(spec.signed), "SUBNORMALS": int(spec.subnormals), "SPECIALS": SPECIALS.index(spec.specials),
        "HAS_INF": int(spec.has_inf), "HAS_NAN": int(spec.has_nan), "NAN_CODE": f"{spec.nan_code or 0}u",
        "INF_CODE": f"{spec.inf_codes[0] if spec.inf_codes else 0}u", "MAX_MAGCODE": f"{spec.max_magcode}u",
        "MAXSIG": f"{maxsig}ull", "CODE_T": _CODE_T[spec.code_dtype.itemsize],
    }
    return tuple(f"-DMXF_{k}={v}" for k, v in vals.items())


def compile_inputs(spec: FormatSpec | None, vendor: str = "nvidia") -> tuple[str, tuple[str, ...]]:
    """(source, options) of the codec module for ``spec`` (None: the format-free packing kernels) and vendor
    ``"nvidia"`` (NVRTC) or ``"amd"`` (hiprtc / clang-22)."""
    src = kernel_source("nvidia", "codec.cu") if vendor in ("nvidia", "cuda") else kernel_source("amd", "codec.hip")
    opts = ("-std=c++17", f"-DMXC_THREADS={THREADS}") + (format_defines(spec) if spec is not None else ())
    return src, opts


def entry_points(with_format: bool = True) -> list[str]:
    """The ``extern "C"`` kernels a module holds (with a format: all; without: the packing kernels)."""
    pack = ["mx_pack_fp4", "mx_unpack_fp4", "mx_pack_fp4_fast", "mx_unpack_fp4_fast", "mx_pack_fp6", "mx_unpack_fp6"]
    if not with_format:
        return pack
    per_input = [f"mx_{op}_{suf}" for op in ("encode", "quantize_mx", "amax", "quantize_tensor")
                 for suf, _ in INPUT_SUFFIXES.values()]
    fast = [f"mx_{op}_{suf}" for op in ("quantize_mx_fast", "quantize_mx_cols", "amax_fast", "quantize_tensor_fast",
                                         "quantize_tensor_small", "quantize_tensor_t") for suf in FAST_SUFFIXES]
    return per_input + fast + ["mx_scale_max_finish", "mx_decode_f32", "mx_decode_f64", "mx_dequantize_mx_f32",
                               "mx_dequantize_mx_f64"] + pack


# ---- recording device work for replay -------------------------------------------------------------------------------
_RECORDING = threading.local()


def _record(step) -> None:
    rec = getattr(_RECORDING, "rec", None)
    if rec is not None:
        rec.steps.append(step)


def _run(fn, grid, args) -> None:
    """Launch ``fn`` (MXC_THREADS per block) on the current device and stream, recorded under :func:`recording`."""
    fn(grid, (THREADS,), args)
    _record(("launch", fn, grid, args, (THREADS,), 0))


def launch(fn, grid, block, args, shared_mem: int = 0) -> None:
    """Launch a CuPy kernel on the current device and stream, recorded under :func:`recording` (the codec's launches
    and the GEMM staging's go through here)."""
    fn(grid, block, args, shared_mem=shared_mem)
    _record(("launch", fn, grid, args, block, shared_mem))


def zeros(cp, shape, dtype):
    """``cp.zeros``, its zeroing recorded under :func:`recording`."""
    a = cp.zeros(shape, dtype=dtype)
    _record(("zero", a))
    return a


def zero(cp, a) -> None:
    """Zero the device array ``a`` on the current stream, recorded under :func:`recording` (a replay zeroes it
    again)."""
    cp.cuda.runtime.memsetAsync(a.data.ptr, 0, a.nbytes, cp.cuda.get_current_stream().ptr)
    _record(("zero", a))


def taint(why: str) -> None:
    """Note device work made outside the recorded steps (e.g. a CuPy copy): a replay would leave its result stale."""
    rec = getattr(_RECORDING, "rec", None)
    if rec is not None and rec.tainted is None:
        rec.tainted = why


def _arrays(step):
    return step[3] if step[0] == "launch" else step[1:]


class Recording:
    """The kernel launches, zeroings and copies made under :func:`recording`, in order; ``tainted``: why a replay
    would not redo everything (None: it would)."""

    def __init__(self):
        self.steps: list = []
        self.tainted: str | None = None

    def spans(self) -> list:
        """(start, end) device address ranges of every array a recorded step wrote or read (launch arguments,
        zeroed counters, copies)."""
        return [(int(a.data.ptr), int(a.data.ptr) + int(a.nbytes)) for step in self.steps for a in _arrays(step)
                if hasattr(a, "data") and hasattr(a.data, "ptr")]

    def replay(self, inputs) -> "Replay":
        """A :class:`Replay` of the recorded work with ``inputs`` (device arrays the calls read, by address) as
        the slots that change.  Raises UnsupportedError if an input was not read in place (a copy was made)."""
        addrs = [int(x.data.ptr) for x in inputs]
        launches = []
        for step in self.steps:
            if step[0] != "launch":  # ("zero", counter) / ("copy", dst, src): kept buffers only
                launches.append(step)
                continue
            _, fn, grid, args, block, smem = step
            slots = tuple((i, addrs.index(int(a.data.ptr))) for i, a in enumerate(args)
                          if hasattr(a, "data") and hasattr(a.data, "ptr") and int(a.data.ptr) in addrs)
            args = list(args)
            for i, _ in slots:
                args[i] = np.uint64(0)  # set per replay (and the recorded input is not kept alive)
            launches.append(("launch", fn, grid, (args, slots), block, smem))
        used = {j for step in launches if step[0] == "launch" for _, j in step[3][1]}
        if used != set(range(len(addrs))):
            raise UnsupportedError("internal: a recorded input was not read in place")
        return Replay(launches)


class Replay:
    """Recorded device work re-run with new input addresses into the same output buffers (the outputs of the
    recorded calls), on the current device and stream: ``replay(addresses)``.  The caller owns the ordering: a
    replay overwrites what the previous one wrote (fine on one stream, where the previous consumers ran first).
    On CUDA each launch is packed once (:class:`~mxcore.backends.cuda.driver.RawLaunch`: a replayed launch is
    ``cuLaunchKernel`` with the input addresses set, not CuPy's per-argument kernel call); the step keeps its
    arguments, so the buffers they name stay alive as long as the replay."""

    def __init__(self, launches):
        self._launches = [_packed(step) for step in launches]

    def __call__(self, addresses=()) -> None:
        import cupy as cp

        stream = cp.cuda.get_current_stream().ptr
        for step in self._launches:
            what = step[0]
            if what == "raw":
                step[1](cp.cuda.driver, stream, [(i, addresses[j]) for i, j in step[2]])
            elif what == "zero":
                cp.cuda.runtime.memsetAsync(step[1].data.ptr, 0, step[1].nbytes, stream)
            elif what == "copy":
                cp.copyto(step[1], step[2])
            else:
                _, fn, grid, (args, slots), block, smem = step
                for i, j in slots:
                    args[i] = np.uint64(addresses[j])
                fn(grid, block, tuple(args), shared_mem=smem)


def _packed(step):
    """A recorded launch as ``("raw", RawLaunch, slots, args)`` (its parameter block packed once; ``args`` keep the
    buffers alive) on CUDA; zeroings, copies, launches under HIP and launches with an argument type the packed
    launch does not take stay as they are (CuPy's kernel call)."""
    if step[0] != "launch":
        return step
    import cupy as cp

    if getattr(cp.cuda.runtime, "is_hip", False):
        return step
    from .cuda.driver import RawLaunch

    _, fn, grid, (args, slots), block, smem = step
    try:
        raw = RawLaunch(fn, grid, block, smem, args)
    except (AttributeError, KeyError, TypeError):  # not a CuPy kernel, or an argument of another C type
        return step
    return ("raw", raw, slots, tuple(args))


@contextlib.contextmanager
def recording():
    """Record the device work of the codec calls made inside (this thread): ``with recording() as rec: ...``,
    then ``rec.replay(inputs)``."""
    prev = getattr(_RECORDING, "rec", None)
    rec = _RECORDING.rec = Recording()
    try:
        yield rec
    finally:
        _RECORDING.rec = prev


# ---- one call on one device ---------------------------------------------------------------------------------------
_MODULES: dict = {}
_FUNCTIONS: dict = {}  # (ordinal, format name, kernel name) -> CuPy function
_LOCK = threading.Lock()


class _Call:
    """The device, stream and array library of one codec call (entered with ``with _on(x) as call``)."""

    def __init__(self, cp, kind: str, ordinal: int, torch_device=None):
        self.cp, self.kind, self.ordinal, self.torch_device = cp, kind, ordinal, torch_device

    # inputs --------------------------------------------------------------------------------------------------
    def cupy_view(self, x):
        """``x`` as a CuPy array on this device (zero-copy through DLPack for torch and other producers)."""
        if self.kind == "cupy":
            return x
        if self.kind == "torch":
            import torch

            from .cuda.device import torch_view

            view = torch_view(self.cp, x)  # from the tensor's address: no DLPack capsule, no stream query
            if view is not None:
                return view
            t = x.detach()
            name = str(t.dtype).replace("torch.", "")
            if name in ("bfloat16", "float16"):  # CuPy has no bfloat16: hand over the raw bits
                t = t.view(torch.int16)
            elif name.startswith("float8"):
                t = t.view(torch.uint8)
            return self.cp.from_dlpack(t)
        return self.cp.from_dlpack(x)

    def float_bits(self, x, what: str = "x", view=None):
        """(contiguous raw-bits CuPy array, kernel suffix) of a float input; other dtypes raise as the host does.
        ``view``: ``cupy_view(x)`` where the caller has it already."""
        name = self.dtype_name(x)
        if name not in INPUT_SUFFIXES:
            raise InputTypeError(f"{what} has dtype {name} on the device; pass float32/float16/bfloat16/float64 values "
                                 "(integer codes are decoded with mxcore.formats.decode)")
        suf, bits = INPUT_SUFFIXES[name]
        c = self.cupy_view(x) if view is None else view
        return self.cp.ascontiguousarray(c).view(bits), suf

    def dtype_name(self, x) -> str:
        return str(x.dtype).replace("torch.", "")

    # outputs -------------------------------------------------------------------------------------------------
    def empty(self, shape, dtype: str):
        """(CuPy view for the kernel, the array handed back: torch for torch inputs, else the CuPy array)."""
        cp = self.cp
        if self.kind != "torch":
            a = cp.empty(shape, dtype=dtype)
            return a, a
        import torch

        store = _SIGNED_OF.get(dtype, dtype)
        if getattr(_RECORDING, "rec", None) is not None:
            # a recorded call's buffers are kept by mxcore for later replays: they come from CuPy's stream-ordered
            # pool, not torch's allocator (whose current pool may be a CUDA graph's private one, e.g. the warm-up of
            # torch.compile's cudagraph trees, which refuses allocations that outlive the run)
            view = cp.empty(shape, dtype=store)
            t = torch.from_dlpack(view)
            view = view.view(dtype)
        else:
            from .cuda.device import torch_view

            t = torch.empty(tuple(shape), dtype=getattr(torch, store), device=self.torch_device)
            view = torch_view(cp, t)
            view = (view if view is not None else cp.from_dlpack(t)).view(dtype)
        if store != dtype:
            try:
                t = t.view(getattr(torch, dtype))
            except (AttributeError, RuntimeError, TypeError):
                pass  # an older torch without this unsigned type: same bits, signed dtype
        return view, t

    def native(self, a):
        """A CuPy result as the caller's kind of array."""
        if self.kind != "torch":
            return a
        import torch

        return torch.from_dlpack(a)

    def copy(self, dst, src) -> None:
        """``dst[...] = src`` (CuPy arrays) on the current stream, recorded under :func:`recording`."""
        self.cp.copyto(dst, src)
        _record(("copy", dst, src))

    def counter(self, dtype: str = "uint32"):
        """A zeroed one-element device counter (zeroed again by a replay of a :func:`recording`)."""
        return zeros(self.cp, 1, dtype)

    def module(self, spec: FormatSpec | None):
        key = (self.ordinal, spec.name if spec is not None else None)
        mod = _MODULES.get(key)
        if mod is None:
            with _LOCK:
                mod = _MODULES.get(key)
                if mod is None:
                    vendor = "amd" if getattr(self.cp.cuda.runtime, "is_hip", False) else "nvidia"
                    src, opts = compile_inputs(spec, vendor)
                    mod = _prebuilt(self.cp, self.ordinal, src, opts) if vendor == "nvidia" else None
                    if mod is None:
                        if vendor == "nvidia":  # as compile_cuda builds it offline (nvrtc_tools.DEVICE_FLAGS)
                            from .nvrtc_tools import DEVICE_FLAGS

                            opts = (*DEVICE_FLAGS, *opts)
                        mod = self.cp.RawModule(code=src, options=opts)
                    _MODULES[key] = mod
        return mod

    def function(self, spec: FormatSpec | None, name: str):
        """Kernel ``name`` of ``spec``'s module on this device (looked up once)."""
        key = (self.ordinal, spec.name if spec is not None else None, name)
        fn = _FUNCTIONS.get(key)
        if fn is None:
            fn = _FUNCTIONS[key] = self.module(spec).get_function(name)
        return fn

    def launch(self, spec, name: str, threads: int, args, grid: int | None = None) -> None:
        if threads <= 0:
            return
        blocks = grid if grid is not None else -(-threads // THREADS)
        _run(self.function(spec, name), (blocks,), tuple(args))

    def sm_count(self) -> int:
        return _sm_count(self.cp, self.ordinal)


def _prebuilt(cp, ordinal: int, src: str, opts):
    """The codec module as a prebuilt cubin (``cuda/prebuilt.py``: the package data or the ``--prebuild`` cache),
    or None."""
    from .cuda.prebuilt import device_arch, load_module, note

    arch = device_arch(cp, ordinal)
    mod = load_module(cp, src, opts, arch, "codec.cu")
    if mod is None:
        note("compiled", "codec.cu", "*", arch)
    return mod


_SMS: dict = {}


def _sm_count(cp, ordinal: int) -> int:
    if ordinal not in _SMS:
        _SMS[ordinal] = int(cp.cuda.Device(ordinal).attributes["MultiProcessorCount"])
    return _SMS[ordinal]


def _external_stream(cp, torch_stream, ordinal: int):
    """torch's stream as a CuPy stream (the CUDA stream protocol where CuPy has it, else ExternalStream)."""
    from_external = getattr(cp.cuda.Stream, "from_external", None)
    if from_external is not None and hasattr(torch_stream, "__cuda_stream__"):
        return from_external(torch_stream)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return cp.cuda.ExternalStream(torch_stream.cuda_stream, ordinal)


@contextlib.contextmanager
def _on(x):
    """Enter ``x``'s device and the caller's current stream; yield the :class:`_Call`."""
    kind = device_kind(x)
    try:
        import cupy as cp
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise UnsupportedError("device arrays are quantized with CuPy kernels; install mxcore[cuda] "
                               "(CuPy) or pass host (numpy) data") from exc
    if kind == "torch":
        import torch

        dev = x.device
        ordinal = dev.index if dev.index is not None else torch.cuda.current_device()
        with cp.cuda.Device(ordinal):
            if not getattr(cp.cuda.runtime, "is_hip", False):
                from .cuda.device import external_stream, refuse_capture, torch_stream

                stream = external_stream(cp, torch_stream(torch, ordinal))
                refuse_capture(cp, stream.ptr, _CAPTURED_CODEC)
            else:
                stream = _external_stream(cp, torch.cuda.current_stream(dev), ordinal)
            with stream:
                yield _Call(cp, kind, ordinal, dev if dev.index is not None else torch.device("cuda", ordinal))
        return
    if kind == "cupy":
        ordinal = x.device.id
    else:
        ordinal = int(x.__dlpack_device__()[1])
    with cp.cuda.Device(ordinal):
        if not getattr(cp.cuda.runtime, "is_hip", False):
            from .cuda.device import refuse_capture

            refuse_capture(cp, cp.cuda.get_current_stream().ptr, _CAPTURED_CODEC)
        yield _Call(cp, kind, ordinal)


# a codec call allocates its outputs and counters with CuPy (and some read a count back): never inside a CUDA graph
_CAPTURED_CODEC = "a device codec call (quantize_mx, quantize_tensor, encode/decode)"


def _i64(v) -> np.int64:
    return np.int64(v)


_NULL = np.uint64(0)
