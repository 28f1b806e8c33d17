"""Grid, block and the scalar arguments of one GEMM launch, split to the device's grid limits.

``gemm_mfma.hip`` covers N tiles with grid X, M tiles with grid Y (from ``m_tile0``; the kernel renumbers
the X*Y blocks chiplet by chiplet, :func:`xcd_order`) and batches with grid Z (from ``batch0``).  When M / BM exceeds the device's grid-Y limit or the batch its grid-Z limit,
:meth:`Launch.pieces` splits the launch into several with offsets; each piece is a complete launch.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, replace

from ...errors import UnsupportedError

__all__ = ["XCDS", "Launch", "kernel_args", "plan_launch", "xcd_order"]

XCDS = 8  # chiplets (XCDs) of MI300X / MI325X / MI355X; the block order stays a bijection for any device


def xcd_order(linear: int, blocks: int, xcds: int = XCDS) -> int:
    """The tile that linear block ``linear`` of ``blocks`` computes (gemm_mfma.hip mx_xcd_order): the
    dispatcher deals blocks round-robin to ``xcds`` chiplets, so chiplet c runs blocks c, c+xcds, ...;
    those get one contiguous run of tiles (row-major over N tiles), the first ``blocks % xcds`` runs one
    tile longer."""
    per = -(-blocks // xcds)
    tall = blocks % xcds or xcds
    xcd, local = linear % xcds, linear // xcds
    return xcd * per + local if xcd < tall else tall * per + (xcd - tall) * (per - 1) + local

_INDEX_LIMIT = 2**31 - 1024  # row / column / k indices are 32-bit ints in the kernel; addresses are 64-bit


@dataclass(frozen=True)
class Launch:
    """One GEMM launch (strides in elements; scale batch strides in bytes)."""

    grid: tuple
    block: tuple
    sam: int
    sak: int
    sbk: int
    sbn: int
    ldd: int
    m: int
    n: int
    k: int
    a_vec_ok: int
    b_vec_ok: int
    out_scale: float = 1.0
    sab: int = 0  # batch strides of A, B, D (0: the operand is shared by every batch)
    sbb: int = 0
    sdb: int = 0
    ssa: int = 0  # batch strides of the A / B block-scale arrays
    ssb: int = 0
    m_tile0: int = 0  # first M tile (grid Y offset) of this piece
    batch0: int = 0  # first batch (grid Z offset) of this piece

    def pieces(self, max_grid: tuple) -> list["Launch"]:
        """This launch as pieces whose grid fits ``max_grid`` (x, y, z block counts)."""
        gx, gy, gz = self.grid
        if gx > max_grid[0]:
            raise UnsupportedError(f"N needs {gx} column tiles; the device allows {max_grid[0]} blocks in grid X")
        out = []
        for z0 in range(0, gz, max_grid[2]):
            for y0 in range(0, gy, max_grid[1]):
                out.append(replace(self, grid=(gx, min(max_grid[1], gy - y0), min(max_grid[2], gz - z0)),
                                   m_tile0=self.m_tile0 + y0, batch0=self.batch0 + z0))
        return out


def _vec_ok(strides: tuple, contiguous_axis: int, base_addr: int, elem_bytes: int, batch_stride: int) -> int:
    other = strides[1 - contiguous_axis]
    return int(strides[contiguous_axis] == 1 and base_addr % 16 == 0 and (other * elem_bytes) % 16 == 0
               and (batch_stride * elem_bytes) % 16 == 0)


def plan_launch(spec, m: int, n: int, k: int, a_strides: tuple, b_strides: tuple, *, a_addr: int = 0,
                b_addr: int = 0, ldd: int | None = None, out_scale: float = 1.0, batch: int = 1,
                batch_strides: tuple = (0, 0, 0), scale_batch_strides: tuple = (0, 0)) -> Launch:
    """Arguments for ``spec`` on a (batch of) (m, k) x (k, n) problem(s).  ``a_strides`` = (stride of m,
    stride of k), ``b_strides`` = (stride of k, stride of n), in storage units (elements; bytes for packed
    fp4 / fp6, which must be K-contiguous); one stride of each operand must be 1.  ``a_addr``/``b_addr``: device addresses (16-byte alignment enables the vector loads).
    ``batch_strides``: (A, B, D) element strides between batches (0 broadcasts an operand)."""
    if min(m, n, k) < 1:
        raise UnsupportedError(f"kernel launch needs M, N, K >= 1, got {m}, {n}, {k} (the API handles empty shapes)")
    for name, st in (("A", a_strides), ("B", b_strides)):
        if 1 not in st:
            raise UnsupportedError(f"operand {name} strides {st}: the kernel needs one unit stride; copy it first")
    if max(m, n, k) > _INDEX_LIMIT:
        raise UnsupportedError(f"{m}x{n}x{k}: a dimension beyond 2^31 elements; split the problem")
    if batch < 1:
        raise UnsupportedError(f"batch of {batch}: needs at least one matrix")
    for name, role, st in (("A", "a", a_strides[1]), ("B", "b", b_strides[0])):
        if spec.packed(role) and st != 1:
            raise UnsupportedError(f"operand {name}: {spec.stored_bits(role)}-bit codes are stored packed along K and "
                                   f"need a unit K stride, got {st}; stage it through hip.operand_storage")
    bm, bn, _ = spec.tile
    a_cont = 1 if a_strides[1] == 1 else 0  # K-contiguous A: axis 1
    b_cont = 0 if b_strides[0] == 1 else 1  # K-contiguous B: axis 0
    sab, sbb, sdb = (int(s) for s in batch_strides)
    return Launch(
        grid=(-(-n // bn), -(-m // bm), int(batch)),
        block=(spec.threads, 1, 1),
        sam=int(a_strides[0]), sak=int(a_strides[1]), sbk=int(b_strides[0]), sbn=int(b_strides[1]),
        ldd=int(n if ldd is None else ldd), m=m, n=n, k=k,
        a_vec_ok=_vec_ok(tuple(a_strides), a_cont, a_addr, spec.elem_bytes, sab),
        b_vec_ok=_vec_ok(tuple(b_strides), b_cont, b_addr, spec.elem_bytes, sbb),
        out_scale=float(out_scale), sab=sab, sbb=sbb, sdb=sdb,
        ssa=int(scale_batch_strides[0]), ssb=int(scale_batch_strides[1]),
    )


def kernel_args(launch: Launch, a_addr: int, b_addr: int, d_addr: int, sa_addr: int, sb_addr: int) -> tuple:
    """The ctypes argument tuple of gemm_mfma.hip's entry point, in its parameter order."""
    c = ctypes
    L = launch
    return (c.c_void_p(a_addr), c.c_void_p(b_addr), c.c_void_p(d_addr), c.c_void_p(sa_addr), c.c_void_p(sb_addr),
            c.c_longlong(L.sam), c.c_longlong(L.sak), c.c_longlong(L.sbk), c.c_longlong(L.sbn),
            c.c_longlong(L.ldd), c.c_longlong(L.sab), c.c_longlong(L.sbb), c.c_longlong(L.sdb),
            c.c_longlong(L.ssa), c.c_longlong(L.ssb), c.c_int(L.m), c.c_int(L.n), c.c_int(L.k),
            c.c_int(L.a_vec_ok), c.c_int(L.b_vec_ok), c.c_int(L.m_tile0), c.c_int(L.batch0),
            c.c_float(L.out_scale), c.c_int(L.grid[1]))
