"""The kernel builds the default choice uses, enumerated without a GPU: what ``mxcore/prebuilt/`` ships compiled.

A *build* is one compile of one source: (source file, options as the backend passes them to NVRTC through CuPy,
arch compiled for) plus the entry points the backend takes from it.  :func:`default_builds` walks a grid of
problems (:data:`SHAPES` x :data:`DTYPES`) for a device description (:data:`TARGETS`: arch and SM counts, no GPU)
through the same rules a plan applies — ``families.family_for`` / ``mx_path``, ``variants.choose_tile``,
``sm90.choose_sm90``, ``wonly.wonly_path`` / ``wonly.choose`` — with
the operand forms a call can stage (16-bit operands read in place or rounded into K-major copies, fp8 / MX codes as
quantization writes them, MX per-call counts 0-2, weights whose scales fold or not, fp32 or 16-bit outputs), and
adds the staging, codec and weight-packing modules those paths launch.  What the plans decide on a GPU that this
walk cannot see (a caller's unusual strides or alignment, options such as ``tile=``) compiles at run time as before.

Each family's rule is one function the plans call too (``variants.choose``, ``sm90.choose``, ``wonly.choose``);
tests/test_prebuilt.py builds the real plans on a fake device and checks that they ask for exactly
the enumerated builds, and ``python -m mxcore bench --first-call`` on a GPU names every kernel still compiled at run
time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

__all__ = ["DTYPES", "SHAPES", "TARGETS", "Build", "Target", "codec_builds", "default_builds", "emit_jobs",
           "problem_builds", "target_for"]


@dataclass(frozen=True)
class Target:
    """A device description for the rules: the arch the plans see (``sm_90``, ``sm_80``) and multiprocessor counts
    of the GPUs of that class whose choices are unioned."""

    arch: str
    sms: tuple[int, ...]
    label: str


#: the GPUs the package data serves: sm_90 (H100 / H200 SXM: 132 SMs, H100 PCIe: 114; the wgmma builds are
#: sm_90a) and sm_80 (A100: 108 SMs; an sm_80 cubin also runs on sm_86 / sm_87 / sm_89, e.g. A10 with 72)
TARGETS = {"sm_90": Target("sm_90", (132, 114), "H100 / H200 / GH200"),
           "sm_80": Target("sm_80", (108, 72), "A100 (and sm_86 / sm_89 GPUs: the sm_80 cubins run there)")}

_SQUARES = (128, 256, 512, 1024, 2048, 4096, 8192)
_LLM_M = (1, 16, 64, 512, 4096)
_LLM_KN = ((4096, 4096), (4096, 1024), (4096, 14336), (14336, 4096), (8192, 8192))
#: the problems (M, N, K) the enumeration walks: squares 128..8192, LLM decode / prefill shapes
SHAPES = tuple([(s, s, s) for s in _SQUARES] + [(m, n, k) for m in _LLM_M for k, n in _LLM_KN])

_FLOATS = ("fp16", "bf16", "tf32", "fp32")
_FP8 = ("e4m3fn", "e5m2")
_MX = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4")
#: every dtype mix matmul runs on CUDA: the float dtypes, fp8 pairs (sm_89 and newer), MX pairs, weight-only pairs
DTYPES = (tuple(_FLOATS) + tuple((a, b) for a in _FP8 for b in _FP8) + tuple((a, b) for a in _MX for b in _MX)
          + tuple((a, b) for a in ("bf16", "fp16") for b in _MX))

_OUT_BYTES = (4, 2)  # fp32 or 16-bit outputs (the wgmma family's TMA-store epilogue differs)
_PER_CALL = (0, 1, 2)  # MX operands quantized by the call itself (families.mx_path weighs it)


@dataclass(frozen=True)
class Build:
    """One compile: ``file`` of ``kernels_cuda/`` with ``options`` (as the backend passes them; an
    ``--gpu-architecture=`` among them names the arch) for ``arch``; ``entries``: the kernels taken from it."""

    file: str
    options: tuple
    arch: str
    entries: tuple

    @property
    def module(self) -> tuple:
        return (self.file, self.options, self.arch)


def _build(file: str, options, arch: str, *entries: str) -> Build:
    """A build of ``file`` with ``options`` on a device of ``arch``: compiled for that arch, or for the one an
    ``--gpu-architecture=`` option names (as the backend's lookup and CuPy's compile do)."""
    options = tuple(options)
    forced = [o.split("=", 1)[1] for o in options if o.startswith("--gpu-architecture=")]
    return Build(file, options, forced[-1] if forced else arch, tuple(entries))


def _merge(builds) -> list[Build]:
    """One Build per module (file, options, arch), entries unioned, in first-seen order."""
    out: dict = {}
    for b in builds:
        have = out.get(b.module)
        out[b.module] = b if have is None else replace(have, entries=tuple(dict.fromkeys(have.entries + b.entries)))
    return list(out.values())


# ------------------------------------------------------------------------------------------------------------
# the modules every path of a kind launches
# ------------------------------------------------------------------------------------------------------------
def _prep(arch: str) -> Build:
    from .compile import PREP_FILE, PREP_KERNELS

    return _build(PREP_FILE, ("-std=c++17",), arch, *PREP_KERNELS)


def codec_builds(arch: str, elements) -> list[Build]:
    """The device codec modules (``codec.cu``, one per element format; ``None``: the packing kernels) for
    ``elements``, with every entry point each holds."""
    return [_codec(arch, el) for el in elements]


@functools.lru_cache(maxsize=None)
def _codec(arch: str, element) -> Build:
    from mxcore import formats

    from ..codec_runtime import compile_inputs, entry_points

    spec = formats.get(element) if element is not None else None
    _, opts = compile_inputs(spec, "nvidia")
    return _build("codec.cu", opts, arch, *entry_points(spec is not None))


@functools.lru_cache(maxsize=None)
def _pack(arch: str) -> Build:
    from .wonly.records import PACK_FILE, formula_options

    return _build(PACK_FILE, ("-std=c++17", *formula_options()), arch, "mx_wonly_pack", "mx_wonly_ranges",
                  "mx_wonly_fence")


def _sm90_mx(arch: str) -> Build:
    """The exact MX path's fold and fix kernels (the stager and Sm90Plan build them for the device's own arch)."""
    from .sm90 import SM90_MX_FILE, SM90_MX_KERNELS

    return _build(SM90_MX_FILE, ("-std=c++17",), arch, *SM90_MX_KERNELS)


# ------------------------------------------------------------------------------------------------------------
# the GEMM families (the plans' choices, mirrored)
# ------------------------------------------------------------------------------------------------------------
def _mma_sync(arch: str, sms: int, elems: tuple, a_kmajor: bool, b_kmajor: bool, m: int, n: int) -> Build:
    """The mma.sync family's build (variants.choose) for staged elements ``elems`` (A, B) and majorness."""
    from .compile import GEMM_FILE
    from .variants import choose, gemm_options, native_fp8

    v = choose(elems[0], elems[1], a_kmajor, b_kmajor, m, n, sms, fp8_convert=not native_fp8(arch))
    return _build(GEMM_FILE, gemm_options(v), arch, "mx_gemm")


def _wgmma(a_elem: str, b_elem: str, a_kmajor: bool, b_kmajor: bool, m: int, out_bytes: int,
           mx: bool = False) -> Build:
    """The wgmma family's build (sm90.choose: swapped for small M unless exact MX; TMA stores for aligned outputs)."""
    from .sm90 import SM90_FILE, SM90_KERNEL, choose

    v = choose(a_elem, b_elem, a_kmajor, b_kmajor, m, out_bytes=out_bytes, mx=mx)
    return _build(SM90_FILE, v.options(), "sm_90", SM90_KERNEL)  # its options name sm_90a


def _gemm(arch: str, sms: int, mdt, elems: tuple, majors, shape) -> list[Build]:
    """The GEMM of staged elements ``elems`` (A, B) in each majorness of ``majors`` for ``shape`` (m, n, k)."""
    from .families import family_for

    m, n, k = shape
    out = []
    fam = family_for(arch, mdt, (1, m, n, k))
    for ak, bk in majors:
        if fam == "wgmma":
            out += [_wgmma(elems[0], elems[1], ak, bk, m, ob) for ob in _OUT_BYTES]
        else:
            out.append(_mma_sync(arch, sms, elems, ak, bk, m, n))
    return out


_SIXTEEN = ((True, True), (True, False))  # 16-bit operands: K-major copies or read in place (B N-major)


def _wonly(arch: str, sms: int, act: str, element: str, m: int, n: int, k: int, folds: bool) -> Build:
    """The registers path's build (wonly.choose: kernel, tile, tensor-copy activations, clusters)."""
    from . import wonly as rules

    v = rules.choose(rules.WonlyProblem(m, n, k, act, element, arch, sms, folds), "registers").variant
    entries = (v.entry, "mx_wonly_xperm") if v.tma_x else (v.entry,)
    return _build(v.file, v.options(), v.arch or arch, *entries)


# ------------------------------------------------------------------------------------------------------------
# one problem, all of it
# ------------------------------------------------------------------------------------------------------------
def problem_builds(arch: str, sms: int, dtype, shape) -> list[Build]:
    """The builds one problem of ``dtype`` (a name or an (A, B) pair) and ``shape`` (M, N, K) can launch on a device of
    ``arch`` with ``sms`` multiprocessors, over the operand forms the defaults stage (module docstring)."""
    from mxcore import dtypes as _dt

    from . import wonly as rules
    from .families import family_for, mx_path
    from .operand import FP8_SHORT

    m, n, k = shape
    mdt = _dt.resolve(dtype, arch)
    out = [_prep(arch)]
    if mdt.kind == "float":
        elem = {"fp16": "f16", "bf16": "bf16"}.get(mdt.a.name, "tf32")
        kk = 3 * -(-k // 4) * 4 if mdt.a.name == "fp32" else k
        return out + _gemm(arch, sms, mdt, (elem, elem), _SIXTEEN if elem != "tf32" else _SIXTEEN[:1], (m, n, kk))
    if mdt.kind == "fp8":
        out += codec_builds(arch, dict.fromkeys((mdt.a.element, mdt.b.element)))
        return out + _gemm(arch, sms, mdt, (FP8_SHORT[mdt.a.name], FP8_SHORT[mdt.b.name]), _SIXTEEN[:1], shape)
    if mdt.kind == "mx":
        out += codec_builds(arch, dict.fromkeys((mdt.a.element, mdt.b.element)))
        fam = family_for(arch, mdt, (1, m, n, k))
        paths = {mx_path(fam, mdt, None, (1, m, n, k), per_call) for per_call in _PER_CALL}
        if "mx_exact" in paths:
            els = tuple(FP8_SHORT.get(od.element, "e4m3") for od in (mdt.a, mdt.b))
            out += [_sm90_mx(arch)] + [_wgmma(els[0], els[1], True, True, m, ob, mx=True) for ob in _OUT_BYTES]
        if None in paths:  # decoded to bf16 (A stays K-major, B in its own N-major order, or padded K-major)
            out += _gemm(arch, sms, mdt, ("bf16", "bf16"), _SIXTEEN, shape)
        return out
    act = "f16" if mdt.a.name == "fp16" else "bf16"  # weight-only: fp16/bf16 activations x an MX weight
    element = _dt.MX_ELEMENT[mdt.b.name]
    out += codec_builds(arch, (mdt.b.element,))
    for folds in (False, True):
        if rules.wonly_path(rules.WonlyProblem(m, n, k, act, element, arch, sms, folds)) == "registers":
            out += [_pack(arch), _wonly(arch, sms, act, element, m, n, k, folds)]
        else:  # staged: the weight decoded to bf16 (N-major), the bf16 GEMM
            out += _gemm(arch, sms, mdt, ("bf16", "bf16"), _SIXTEEN, shape)
    return out


def target_for(arch: str, sms: int | None = None) -> Target:
    """The device description of ``arch`` (``sm_90a`` is sm_90): a packaged target's, or for another arch (or a
    known SM count, ``sms``) one of its own."""
    from .variants import sm_of

    sm = sm_of(arch)
    base = TARGETS.get(f"sm_{sm}")
    if sms is None and base is not None:
        return base
    return Target(f"sm_{sm}", (sms,) if sms else _OTHER_SMS, f"sm_{sm}")


_OTHER_SMS = (132, 108, 72)  # an arch without a packaged target: the SM counts of common GPUs, unioned


def default_builds(target) -> tuple[Build, ...]:
    """Every build the default choice uses on ``target`` (a key of :data:`TARGETS`, or a :class:`Target`) over
    :data:`SHAPES` x :data:`DTYPES`, one per module (entries unioned), sorted by file, arch and options.  The package
    command (``python -m mxcore kernels --prebuild --package``), ``--prebuild`` and the CI test share it."""
    from mxcore.errors import UnknownNameError

    if isinstance(target, str):
        if target not in TARGETS:
            raise UnknownNameError(f"no prebuilt target {target!r}; have: {', '.join(TARGETS)}")
        target = TARGETS[target]
    return _default_builds(target)


@functools.lru_cache(maxsize=None)
def _default_builds(t: Target) -> tuple[Build, ...]:
    from .variants import supported_dtypes

    ok = set(supported_dtypes(t.arch))
    builds = []
    for dtype in DTYPES:
        names = (dtype,) if isinstance(dtype, str) else dtype
        if not set(names) <= ok:
            continue
        for sms in t.sms:
            for shape in SHAPES:
                builds += problem_builds(t.arch, sms, dtype, shape)
    return tuple(sorted(_merge(builds), key=lambda b: (b.file, b.arch, b.options)))


def emit_jobs(arch: str) -> list[dict]:
    """``kernels --emit``'s jobs on ``arch``: the offline compile jobs (``emit.compile_jobs``, one per build) of the
    builds the default choice uses (:func:`default_builds`; the codec has its own).  Variants that only an option
    selects compile on first use."""
    from .emit import compile_jobs, plain_options

    chosen = {(b.file, plain_options(b.options)) for b in default_builds(target_for(arch))}
    return [j for j in compile_jobs(arch) if (j["file"], plain_options(j["options"])) in chosen]

