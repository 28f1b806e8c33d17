"""Probes of the Hopper ``wgmma.mma_async`` layouts (``kernels_cuda/probe_wgmma.cu``, sm_90a, through CuPy).

The probe kernels know no layout: each runs one wgmma on arange-coded operands and writes every lane's
accumulator registers in register order.  This module builds the inputs, decodes the values into coordinates
and returns them as ``(lanes, slots, 2)`` arrays to compare with :mod:`mxcore.layouts.hopper`:

* ``"d"`` — D of m64n64k16 (f16 from shared memory): A[i, 0] = i, A[i, 1] = 1, B[0, j] = 256, B[1, j] = j, so the
  value in (lane, slot) is 256 i + j: the accumulator's (row, col), read straight from the hardware.
* ``"a_k16"`` / ``"a_k8"`` — the register-A form of m64n16k16 (f16) / m64n16k8 (tf32): slot s of lane t holds
  t·slots + s, B[k, j] = (k == j), so D[i, j] = A[i, j]; D is located through the measured ``"d"`` map
  (columns < 16 of m64n64 and m64n16 share the per-n8-block layout), giving who holds A[i, j].

(This family's records are not ``InstructionLayout`` objects — B is read from shared memory through a
descriptor — so it is not in the register-probe protocol of :data:`backends.probes.FAMILIES`.)
"""

from __future__ import annotations

import numpy as np

__all__ = ["PROBE_FILE", "PROBE_KERNELS", "run_probes"]

PROBE_FILE = "probe_wgmma.cu"
PROBE_KERNELS = ("probe_wgmma_d", "probe_wgmma_a_f16", "probe_wgmma_a_tf32")
_OPTIONS = ("--gpu-architecture=sm_90a", "-std=c++17")


def _kernels(cp):
    from mxcore.backends.cuda.compile import source

    mod = cp.RawModule(code=source(PROBE_FILE), options=_OPTIONS)
    return {name: mod.get_function(name) for name in PROBE_KERNELS}


def _rows_bytes(mat: np.ndarray) -> np.ndarray:
    """rows x cols elements -> rows x 128 bytes (K-major rows of the swizzled tile, zero padded)."""
    raw = mat.view(np.uint8).reshape(mat.shape[0], -1)
    out = np.zeros((mat.shape[0], 128), np.uint8)
    out[:, :raw.shape[1]] = raw
    return out


def _decode_d(vals: np.ndarray) -> np.ndarray:
    v = vals.astype(np.int64)
    return np.stack([v // 256, v % 256], axis=-1)


def run_probes(cp) -> dict:
    """Run the three probes on the current device (an sm_90 GPU); {name: (lanes, slots, 2) coordinates}."""
    k = _kernels(cp)
    # D: 256 i + j
    a = np.zeros((64, 64), np.float16)
    a[:, 0], a[:, 1] = np.arange(64), 1
    b = np.zeros((64, 64), np.float16)  # rows n, K-major
    b[:, 0], b[:, 1] = 256, np.arange(64)
    out = cp.full(128 * 32, np.nan, dtype=cp.float32)
    k["probe_wgmma_d"]((1,), (128,), (cp.asarray(_rows_bytes(a)), cp.asarray(_rows_bytes(b)), out))
    d = _decode_d(cp.asnumpy(out).reshape(128, 32))
    res = {"d": d}
    # where D[i, j] (j < 16) sits in the m64n16 accumulator: the first 8 slots of the measured map
    where = np.full((64, 16, 2), -1, np.int64)
    lane, slot = np.meshgrid(np.arange(128), np.arange(8), indexing="ij")
    where[d[:, :8, 0], d[:, :8, 1], 0], where[d[:, :8, 0], d[:, :8, 1], 1] = lane, slot
    for name, kern, dtype, kk, slots in (("a_k16", "probe_wgmma_a_f16", np.float16, 16, 8),
                                        ("a_k8", "probe_wgmma_a_tf32", np.float32, 8, 4)):
        eye = np.zeros((16, kk), dtype)  # rows n, K-major: B[k, j] = (k == j)
        eye[np.arange(kk), np.arange(kk)] = 1
        out = cp.full(128 * 8, np.nan, dtype=cp.float32)
        k[kern]((1,), (128,), (cp.asarray(_rows_bytes(eye)), out))
        dvals = cp.asnumpy(out).reshape(128, 8)
        coords = np.full((128, slots, 2), -1, np.int64)
        for i in range(64):
            for j in range(kk):
                code = int(dvals[where[i, j, 0], where[i, j, 1]])
                coords[code // slots, code % slots] = (i, j)
        res[name] = coords
    return res
