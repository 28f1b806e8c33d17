"""A staged HIP GEMM (``HipBackend.plan``): operands on the device, the output buffer, the launch pieces.

Host inputs are prepared by :mod:`mxcore.operands` (quantized / rounded once) and uploaded in their own
major; ROCm device arrays of the matmul's own float type are read in place on their device and stream, and
the output is then allocated by the same library (device in, device out).  Batches ``(B, M, K) @ (B, K, N)``
and ``(B, M, K) @ (K, N)`` run in one launch (batch in grid Z); per-tensor fp8 scales that differ between
batch elements take one launch per element (the scale is a launch argument).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .._contract import Plan
from ...errors import DeviceError, UnsupportedError
from .dlpack import device_view
from .launch import kernel_args, plan_launch
from .runtime import device_address
from .staging import fp8_input_convert, operand_storage
from .variants import compile_inputs, tile_name

__all__ = ["HipPlan", "device_operands"]


def device_operands(a, b, mdt):
    """Both operands already on a ROCm device in the matmul's own float type, one unit stride in each matrix:
    their views (read in place, no copy).  Else None (the host path)."""
    from ... import formats

    if mdt.kind != "float" or mdt.a.name == "tf32":
        return None
    want = np.dtype(formats.get(mdt.a.element).dtype).name
    views = [device_view(x) for x in (a, b)]
    if any(v is None or v.dtype != want or 1 not in v.strides[-2:] for v in views):
        return None
    if views[0].device != views[1].device:
        raise DeviceError(f"operands live on different GPUs ({views[0].device} and {views[1].device}); "
                          "move them to one device")
    return views


class HipPlan(Plan):
    """One staged ``a @ b`` on an AMD GPU (see the module docstring); frees its device memory on close."""

    def __init__(self, rt, spec, a, b, mdt, *, out_dtype="float32", scale_rounding="floor", fp8_convert=False,
                 views=None):
        self.rt, self.spec, self.mdt = rt, spec, mdt
        self.a, self.b = a, b
        self.out_dtype, self.scale_rounding, self.fp8_convert = out_dtype, scale_rounding, fp8_convert
        sa, sb = tuple(a.shape), tuple(b.shape)
        if len(sa) not in (2, 3) or len(sb) not in (2, 3) or len(sb) > len(sa):
            raise UnsupportedError(f"shapes {sa} @ {sb}: the HIP kernels take (M,K)@(K,N), (B,M,K)@(B,K,N) or "
                                   "(B,M,K)@(K,N)")
        self.batch = int(sa[0]) if len(sa) == 3 else 1
        if len(sb) == 3 and int(sb[0]) != self.batch:
            raise UnsupportedError(f"batch sizes differ: {sa[0]} and {sb[0]}")
        self.m, self.k, self.n = int(sa[-2]), int(sa[-1]), int(sb[-1])
        self.variant = f"{spec.entry} {tile_name(spec)}"
        self.views = views if views is not None else device_operands(a, b, mdt)  # None or [] on the host path
        self.device = self.views[0].device if self.views else rt.current_device()
        self.stream = self.views[0].stream if self.views else None
        self.info = rt.device(self.device)
        self.allocs: list = []
        self.launches: list = []
        self.out_obj = None
        with rt.on_device(self.device):
            source, options = compile_inputs(spec)
            self.func = rt.function(source, spec.entry, options, device=self.device)
            self.d = self._alloc_out()
        try:
            self.prep()
        except BaseException:
            self.close()  # a refused operand leaves no device memory behind
            raise

    # -- output
    def _alloc_out(self):
        shape = (self.batch, self.m, self.n) if self.batch > 1 or len(self.a.shape) == 3 else (self.m, self.n)
        if self.views:
            mod = type(self.views[0].owner[0] if isinstance(self.views[0].owner, tuple) else self.views[0].owner)
            lib = mod.__module__.split(".")[0]
            if lib == "torch":
                import torch

                self.out_obj = torch.empty(shape, dtype=torch.float32, device=f"cuda:{self.device}")
                return None
            if lib == "cupy":
                import cupy

                with cupy.cuda.Device(self.device):
                    self.out_obj = cupy.empty(shape, dtype=np.float32)
                return None
        self.out_shape = shape
        return self.rt.alloc(self.batch * self.m * self.n * 4)

    @property
    def d_addr(self) -> int:
        if self.out_obj is not None:
            return int(self.out_obj.data_ptr()) if hasattr(self.out_obj, "data_ptr") else int(self.out_obj.data.ptr)
        return device_address(self.d)

    # -- staging
    def prep(self) -> None:
        """Stage A and B: in place for device arrays of the matmul's float type, else host-side
        quantization/rounding (mxcore.operands) and an upload.  Builds the launch pieces."""
        with self.rt.on_device(self.device):
            self._free(self.allocs)
            if self.views:
                va, vb = self.views
                staged = [(va.addr, va.strides, [1.0], 0, 0), (vb.addr, vb.strides, [1.0], 0, 0)]
            else:
                staged = [self._stage(x, od, role) for x, od, role in ((self.a, self.mdt.a, "a"), (self.b, self.mdt.b, "b"))]
            (a_addr, a_st, a_sc, sa, ssa), (b_addr, b_st, b_sc, sb, ssb) = staged
            three = [len(s) == 3 for s in (a_st, b_st)]
            launch = plan_launch(
                self.spec, self.m, self.n, self.k, a_st[-2:], b_st[-2:], a_addr=a_addr, b_addr=b_addr,
                batch=self.batch, batch_strides=(a_st[0] if three[0] else 0, b_st[0] if three[1] else 0,
                                                 self.m * self.n),
                scale_batch_strides=(ssa, ssb))
            scales = [a_sc[i % len(a_sc)] * b_sc[i % len(b_sc)] for i in range(self.batch)]
            if len(set(scales)) <= 1:
                pieces = replace(launch, out_scale=float(scales[0])).pieces(self.info.max_grid)
            else:  # per-tensor fp8 scales differ per batch element: one launch each
                pieces = [p for z, s in enumerate(scales)
                          for p in replace(launch, grid=(*launch.grid[:2], 1), batch0=z, out_scale=float(s))
                          .pieces(self.info.max_grid)]
            self.launches = [(p, kernel_args(p, a_addr, b_addr, self.d_addr, sa, sb)) for p in pieces]

    def _stage(self, x, od, role):
        """Upload one host operand (a matrix or a batch of them): (address, element strides, per-batch
        tensor scales, scale address, scale batch stride)."""
        from ...arrays import array_kind, to_numpy
        from ...operands import prepare_one

        if array_kind(x) == "mx" and len(x.shape) == 3:
            raise UnsupportedError(f"operand {role}: a batched {type(x).__name__}; pass float data (mxcore quantizes "
                                   "each batch element) or one 2-D quantized tensor per call")
        if array_kind(x) not in ("mx", "numpy"):
            x = to_numpy(x)
        if array_kind(x) == "numpy":
            x = fp8_input_convert(x, od.name, self.fp8_convert)
        items = [x[i] for i in range(x.shape[0])] if len(x.shape) == 3 else [x]
        ops = [prepare_one(item, od, role, self.scale_rounding) for item in items]
        stores = [operand_storage(op, self.spec, role) for op in ops]
        rows, cols = stores[0].shape
        if stores[0].flags.f_contiguous and not stores[0].flags.c_contiguous:
            # column-major kept (the kernel reads either major; packed fp4/fp6 B is always K-contiguous)
            dev = self.rt.upload(np.stack([s.T for s in stores]) if len(x.shape) == 3 else stores[0].T)
            strides = (rows * cols, 1, rows) if len(x.shape) == 3 else (1, rows)
        else:
            dev = self.rt.upload(np.stack([np.ascontiguousarray(s) for s in stores]))
            strides = (rows * cols, cols, 1) if len(x.shape) == 3 else (cols, 1)
        self.allocs.append(dev)
        scale_addr, scale_stride = 0, 0
        if ops[0].scales is not None:
            sc = np.stack([np.ascontiguousarray(op.scales, dtype=np.uint8) for op in ops])
            sdev = self.rt.upload(sc)
            self.allocs.append(sdev)
            scale_addr, scale_stride = device_address(sdev), int(sc[0].size) if len(x.shape) == 3 else 0
        return device_address(dev), strides, [float(op.tensor_scale) for op in ops], scale_addr, scale_stride

    # -- run
    def poison(self) -> None:
        """Fill the output with NaN bytes (tests check that every element is written)."""
        with self.rt.on_device(self.device):
            if self.out_obj is not None:
                self.out_obj[...] = float("nan")
            else:
                self.rt.memset(self.d, 0xFF, self.batch * self.m * self.n * 4)

    def gemm(self) -> None:
        with self.rt.on_device(self.device):
            for piece, args in self.launches:
                self.rt.launch(self.func, piece.grid, piece.block, args, stream=self.stream)

    def result(self):
        """The output as the caller's kind of array (device arrays stay on their device)."""
        from ...arrays import like_input
        from ...reference import round_output

        if self.out_obj is not None:
            if self.out_dtype == "float32":
                return self.out_obj
            if hasattr(self.out_obj, "data_ptr"):  # torch: one rounding from fp32 on the device
                import torch

                return self.out_obj.to(getattr(torch, self.out_dtype))
            if self.out_dtype == "float16":
                return self.out_obj.astype(np.float16)
            import cupy  # no bfloat16 in CuPy: round on the host, the caller's kind of array back

            return like_input(round_output(cupy.asnumpy(self.out_obj).astype(np.float64), self.out_dtype), self.a)
        with self.rt.on_device(self.device):
            host = self.rt.download(self.d, np.empty(self.out_shape, np.float32), stream=self.stream)
        result = host if self.out_dtype == "float32" else round_output(host.astype(np.float64), self.out_dtype)
        return like_input(result, self.a, self.b)

    def clone(self) -> "HipPlan":
        return HipPlan(self.rt, self.spec, self.a, self.b, self.mdt, out_dtype=self.out_dtype,
                       scale_rounding=self.scale_rounding, fp8_convert=self.fp8_convert)

    def _free(self, ptrs) -> None:
        while ptrs:
            p = ptrs.pop()
            try:
                self.rt.free(p)
            except DeviceError:
                pass

    def close(self) -> None:
        with self.rt.on_device(self.device):
            self._free(self.allocs)
            if getattr(self, "d", None) is not None:
                self._free([self.d])
                self.d = None
        self.out_obj = None
