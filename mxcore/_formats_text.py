"""``python -m mxcore formats``: the format reference table, printed from the specs."""

from __future__ import annotations

import argparse

import numpy as np

from ._codec_host import _table
from ._format_specs import FORMATS, FormatSpec, get

# ---- the reference table (python -m mxcore formats) ----------------------------------------------
def _exact(v: float) -> str:
    """Exact text for a dyadic value: '448 = 1.75 x 2^8', '2^-9 (0.001953125)', '2^127 (~1.70141e+38)'."""
    if v == 0:
        return "0"
    f, e = np.frexp(abs(v))
    mant, exp = float(f) * 2, int(e) - 1
    sgn = "-" if v < 0 else ""
    pow_txt = f"{sgn}2^{exp}" if mant == 1.0 else f"{sgn}{mant!r} x 2^{exp}"
    dec = repr(float(v))
    dec = dec[:-2] if dec.endswith(".0") else dec
    if "e" not in dec and len(dec.lstrip("-").replace(".", "").lstrip("0")) <= 15:  # repr is then exact
        return dec if dec == pow_txt or (mant == 1.0 and 0 <= exp < 4) else f"{dec} = {pow_txt}"
    return f"{pow_txt} (~{v:.6g})"


def _short(v: float) -> str:
    """The value part of :func:`_exact`: '448', '57344', '1.9921875 x 2^127' (never a bare significand)."""
    txt = _exact(v)
    if " = " in txt:
        return txt.split(" = ")[0]
    return txt.split(" (~")[0]


def _bits(code: int, spec: FormatSpec) -> str:
    b = format(code, f"0{spec.bits}b")
    parts = []
    i = 0
    if spec.signed:
        parts.append(b[0])
        i = 1
    parts.append(b[i:i + spec.ebits])
    if spec.mbits:
        parts.append(b[i + spec.ebits:])
    return " ".join(parts)


def _hex(code: int, spec: FormatSpec) -> str:
    return f"0x{code:0{(spec.bits + 3) // 4}X}"


def _codes_text(codes, spec: FormatSpec) -> str:
    if not codes:
        return "none"
    return ", ".join(_hex(c, spec) for c in codes)


def _nan_text(spec: FormatSpec) -> str:
    if not spec.has_nan:
        return "none (encode raises on NaN by default; nan='zero' gives +0)"
    if spec.specials == "ieee":
        return (f"exponent all ones, mantissa != 0 ({len(spec.nan_codes) if spec.bits <= 8 else 'many'} codes); "
                f"encode gives {_hex(spec.nan_code, spec)}"
                + (f" / {_hex(spec.nan_code | (1 << (spec.bits - 1)), spec)}" if spec.signed else ""))
    return _codes_text(spec.nan_codes, spec)


def _describe(spec: FormatSpec) -> list[str]:
    max_txt = _exact(spec.max_normal)
    rows = [
        ("bits", f"{spec.bits}   layout {spec.layout}  ({int(spec.signed)} sign, {spec.ebits} exponent, "
                 f"{spec.mbits} mantissa)"),
        ("exponent bias", str(spec.bias)),
        ("max normal", f"{max_txt}   code {_hex(spec.max_code, spec)}"),
        ("min normal", f"{_exact(spec.min_normal)}   code {_hex((1 << spec.mbits) if spec.subnormals else 0, spec)}"),
        ("min subnormal", f"{_exact(spec.min_subnormal)}   code {_hex(1, spec)}" if spec.subnormals
         else "none (no subnormals)"),
        ("zero", ("+0 " + _hex(0, spec) + (f", -0 {_hex(spec.negative_zero_code, spec)}" if spec.has_negative_zero
                                         else ", no -0 (-0 encodes to +0)" if spec.signed else ""))
         if spec.has_zero else "none (values below min normal encode to the smallest code)"),
        ("inf", _codes_text(spec.inf_codes, spec) if spec.has_inf else "none"),
        ("NaN", _nan_text(spec)),
        ("overflow", f"overflow='saturate' -> {'+-' if spec.signed else ''}{_short(spec.max_normal)} (inf too); "
                     "overflow='nan' -> "
                       + ("inf" if spec.has_inf else "NaN" if spec.has_nan else "saturates too (no inf/NaN)")),
        ("ml_dtypes", np.dtype(spec.dtype).name if spec.dtype is not None else "none"),
        ("aliases", ", ".join(spec.aliases) or "-"),
    ]
    out = [f"{spec.name}: {spec.title}"]
    out += [f"  {k:<14s} {v}" for k, v in rows]
    return out


def _class(spec: FormatSpec, code: int, v: float) -> str:
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "inf"
    if v == 0:
        return "zero"
    mag = code & ((1 << (spec.ebits + spec.mbits)) - 1)
    if spec.subnormals and (mag >> spec.mbits) == 0:
        return "subnormal"
    return "normal"


def _table_lines(spec: FormatSpec) -> list[str]:
    vals = _table(spec.name)
    bw = len(_bits(0, spec))
    lines = [f"{'code':>6s}  {'bits':<{bw}s}  {'class':<9s}  {'value':>22s}  exact"]
    lines.append("-" * len(lines[0]) + "-" * 12)
    for code in range(1 << spec.bits):
        v = float(vals[code])
        cls = _class(spec, code, v)
        if cls in ("NaN", "inf"):
            vtxt = ("-" if np.signbit(v) and spec.specials != "fnuz" else "+") + ("NaN" if cls == "NaN" else "inf")
            exact = ""
        else:
            vtxt = repr(v) if v != 0 else ("-0.0" if np.signbit(v) else "0.0")
            f, e = np.frexp(abs(v))
            if v == 0:
                exact = ""
            elif cls == "subnormal":
                q = spec.emin - spec.mbits
                exact = f"{'-' if v < 0 else ''}{int(abs(v) / np.ldexp(1.0, q))} x 2^{q}"
            else:
                mant = repr(float(f) * 2).removesuffix(".0")
                exact = f"{'-' if v < 0 else ''}{mant} x 2^{int(e) - 1}"
        lines.append(f"{_hex(code, spec):>6s}  {_bits(code, spec):<{bw}s}  {cls:<9s}  {vtxt:>22s}  {exact}")
    return lines


def _summary() -> list[str]:
    head = (f"{'format':<9s} {'bits':>4s} {'S.E.M':<7s} {'bias':>4s} {'max normal':>13s} {'min normal':>11s} "
            f"{'min subnorm':>11s} {'inf':>4s} {'NaN':<14s} {'-0':>3s}  ml_dtypes")
    lines = [head, "-" * len(head)]
    for s in FORMATS.values():
        nan = ("IEEE" if s.specials == "ieee" else _codes_text(s.nan_codes, s)) if s.has_nan else "-"
        sub = f"2^{int(np.frexp(s.min_subnormal)[1]) - 1}" if s.subnormals else "-"
        mx = f"{s.max_normal:.6g}" if s.max_normal < 1e6 else f"{s.max_normal:.4g}"
        lines.append(
            f"{s.name:<9s} {s.bits:>4d} {f'{int(s.signed)}.{s.ebits}.{s.mbits}':<7s} {s.bias:>4d} {mx:>13s} "
            f"{'2^' + str(s.emin):>11s} {sub:>11s} {'yes' if s.has_inf else '-':>4s} {nan:<14s} "
            f"{'yes' if s.has_negative_zero else '-':>3s}  {np.dtype(s.dtype).name if s.dtype is not None else '-'}")
    return lines


def _cli(argv: list[str]) -> int:
    """``python -m mxcore formats [NAME] [--table]``."""
    argv = list(argv)
    if argv[:1] == ["formats"]:
        argv = argv[1:]
    p = argparse.ArgumentParser(prog="python -m mxcore formats",
                                description="number-format properties and, with --table, every code and its value")
    p.add_argument("name", nargs="?", help="a format or alias (e4m3fn, fp8, e5m2, e2m1, e8m0, ...); default: all")
    p.add_argument("--table", action="store_true",
                   help="list every code with its bits and value (formats of <= 8 bits)")
    args = p.parse_args(argv)
    specs = [get(args.name)] if args.name else list(FORMATS.values())
    out: list[str] = []
    if not args.name:
        out += _summary() + [""]
    for spec in specs:
        out += _describe(spec)
        if args.table:
            if spec.bits <= 8:
                out += ["", f"  all {1 << spec.bits} codes of {spec.name} (bits: "
                            f"{'sign exponent mantissa' if spec.signed else 'exponent'}):"]
                out += ["  " + line for line in _table_lines(spec)]
            else:
                out.append(f"  (no code table for a {spec.bits}-bit format: {1 << spec.bits} codes)")
        out.append("")
    print("\n".join(out).rstrip("\n"))
    return 0
