"""Kernel-only speed of the MX paths on one GPU, against the vendor in the same process.

For each MX dtype (pair) and square size, on the wgmma family (sm_90): the exact block-scaled path
(``mx_path="exact"``: MXFP4 / MXFP6 folded into e4m3, mxfp8 folded with its lost bits added back; path "exact32":
mxfp8 per 32-K block, its codes as they are) and the bf16-decode path (``mx_path="decode"``) on the same
device-quantized random normal operands, then cuBLASLt per-tensor fp8 (``torch._scaled_mm``) and cuBLAS bf16
(``torch.matmul``).
CUDA events, median of ``repeats`` launches after warm-up, 3 plans rotated (``mxcore.tools.timing.time_callable``).  Each
row names the path the plan took (its variant) and, for folded operands, the fraction of 128-K windows folded and
whether every row has one factor over all of K (the fastest tier), and for mxfp8 folds the entries
of lost bits the GEMM added back (A, B).
Run: ``python -m mxcore.tools.bench_mx --sizes 8192,4096 --dtypes mxfp4,mxfp6_e2m3,mxfp6_e3m2,mxfp8,mxfp8+mxfp4``.
"""

from __future__ import annotations

__all__ = ["bench_mx"]


def _rotating(plans):
    i = [0]

    def call():
        i[0] += 1
        plans[i[0] % len(plans)].gemm()
    return call


def _lost(p):
    """(A's, B's) entries of lost bits of a lossy MXFP8 fold (the lists the GEMM adds back; -1: the operand's
    lists overflowed and it was folded again without loss; 0: not such an operand), or None without one."""
    fs = [getattr(d, "mx", None) for d in (p.da, p.db)]
    if all(f is None or f.lo_cnt is None for f in fs):
        return None
    return tuple(0 if f is None or f.lo_cnt is None else -1 if int(f.info[4]) else int(f.lo_cnt.sum()) for f in fs)


def bench_mx(sizes=(8192, 4096), dtypes=("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8"), paths=("exact", "decode"),
             repeats: int = 10, out=print) -> list[dict]:
    """Rows of {dtype, size, path, variant, tflops, vs_fp8, vs_bf16, folded, whole, lost}; printed as they
    come."""
    import cupy as cp

    import mxcore
    from mxcore import dtypes as _dt
    from mxcore.backends import get
    from mxcore.backends.cuda import stage
    from mxcore.tools.timing import time_callable

    be = get("cuda")
    measure = be.timer()
    rows = []
    for s in sizes:
        flops = 2.0 * s ** 3
        rs = cp.random.RandomState(0)
        x = rs.standard_normal((s, s), dtype=cp.float32)
        y = rs.standard_normal((s, s), dtype=cp.float32)
        vendor = {}
        for name in ("e4m3fn", "bf16"):
            base = be.vendor_baseline(name, s, s, s)
            if base is not None:
                vendor[name] = flops / time_callable(measure, base[1], repeats) / 1e12
        out(f"{s}^3 vendor: " + ", ".join(f"{k} {v:.1f} TFLOP/s" for k, v in vendor.items()))
        for d in dtypes:
            pair = tuple(d.split("+")) if "+" in d else (d, d)
            a = mxcore.quantize_mx(x, pair[0], axis=1)
            b = mxcore.quantize_mx(y, pair[1], axis=0)
            mdt = _dt.resolve(pair, be.target().arch)
            for path in paths:
                fold8 = stage.MX8_FOLD
                stage.MX8_FOLD = path != "exact32"
                try:
                    p = be.plan(a, b, mdt, mx_path="exact" if path == "exact32" else path, family="wgmma")
                finally:
                    stage.MX8_FOLD = fold8
                plans = [p, p.clone(), p.clone()]
                tf = flops / time_callable(measure, _rotating(plans), repeats) / 1e12
                fa, fb = (getattr(getattr(o, "mx", None), "folded", None) for o in (p.da, p.db))
                row = {"dtype": d, "size": s, "path": path, "variant": p.variant, "tflops": tf,
                       "vs_fp8": tf / vendor["e4m3fn"] if "e4m3fn" in vendor else None,
                       "vs_bf16": tf / vendor["bf16"] if "bf16" in vendor else None,
                       "folded": None if fa is None or fb is None else (float(fa.mean()), float(fb.mean())),
                       "whole": None if fa is None or fb is None else (int(p.da.mx.info[3]) == 0 and
                                                                      int(p.db.mx.info[3]) == 0),
                       "lost": _lost(p)}
                rows.append(row)
                ratios = " ".join(f"{k} {row[k]:.2f}" for k in ("vs_fp8", "vs_bf16") if row[k] is not None)
                fold = "" if row["folded"] is None else (f" | windows folded {row['folded'][0]:.2f}/"
                                                         f"{row['folded'][1]:.2f}, whole rows {row['whole']}")
                if row["lost"] is not None:
                    fold += f", lost-bit entries {row['lost'][0]}/{row['lost'][1]}"
                out(f"  {d:16s} {s}^3 {path:7s} {tf:7.1f} TFLOP/s | {ratios} | {p.variant}{fold}")
                for q in plans:
                    q.close()
    return rows


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m mxcore.tools.bench_mx", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="8192,4096")
    ap.add_argument("--dtypes", default="mxfp4,mxfp6_e2m3,mxfp6_e3m2,mxfp8",
                    help="MX dtypes, or A+B pairs such as mxfp8+mxfp4")
    ap.add_argument("--paths", default="exact,decode", help="exact, exact32 (mxfp8 per 32-K block), decode")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)
    bench_mx([int(v) for v in args.sizes.split(",") if v], args.dtypes.split(","), args.paths.split(","),
             args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
