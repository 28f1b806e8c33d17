"""The vendor GEMM through torch, the benchmark baselines shared by the cuda and hip backends: ``torch.matmul``
(cuBLAS on CUDA builds, hipBLASLt on ROCm builds) for float dtypes, ``torch._scaled_mm`` (cuBLASLt) for fp8."""

from __future__ import annotations

FLOAT_DTYPES = ("fp16", "bf16", "tf32", "fp32")


def torch_matmul(torch, dtype: str, m: int, n: int, k: int, sets: int = 3):
    """A callable that multiplies one of ``sets`` fresh random input pairs per call (rotating, so the cache does
    not flatter), with TF32 allowed only for ``dtype == "tf32"``; None for a dtype torch.matmul does not cover."""
    d = dtype.lower()
    if d not in FLOAT_DTYPES:
        return None
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(d, torch.float32)
    pairs = [(torch.randn(m, k, device="cuda").to(tdt), torch.randn(k, n, device="cuda").to(tdt)) for _ in range(sets)]
    turn = [0]

    def run():
        a, b = pairs[turn[0] % sets]
        turn[0] += 1
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = d == "tf32"
        try:
            return torch.matmul(a, b)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev

    return run


def torch_scaled_mm(torch, m: int, n: int, k: int, sets: int = 3):
    """A callable running ``torch._scaled_mm`` (cuBLASLt fp8 e4m3, unit scales, bf16 out) on one of ``sets``
    rotating input pairs (B column-major, as cuBLASLt wants); None when this torch has no ``_scaled_mm``."""
    fn = getattr(torch, "_scaled_mm", None)
    if fn is None:
        return None
    one = torch.ones((), device="cuda")
    pairs = [(torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn),
              torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()) for _ in range(sets)]
    turn = [0]

    def run():
        a, b = pairs[turn[0] % sets]
        turn[0] += 1
        return fn(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    return run
