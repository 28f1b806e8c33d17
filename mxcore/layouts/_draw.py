"""Pictures of a layout: the operand tile as a grid, each cell labelled with lane and slot.

SVG needs nothing; PNG uses Pillow when it is installed (an optional extra); text is for terminals.
Cell labels: ``T<lane>`` over the register part — ``v<r>`` when the register holds one element,
``v<r>.<i>`` for element i of register r when it packs several, ``s<slot>`` for fp6 (elements
straddle registers).  For ldmatrix the grid shows the ``num`` stored 8x8 matrices side by side.
"""

from __future__ import annotations

import colorsys
from xml.sax.saxutils import escape

import numpy as np

from ..errors import BackendUnavailableError, LayoutError
from ._core import LdMatrixLayout

__all__ = ["render", "grid"]


def grid(layout, operand: str):
    """(title, lane grid, slot grid, slot label function) for one operand of ``layout``."""
    if isinstance(layout, LdMatrixLayout):
        num = layout.num
        inv = layout.inverse  # (num, 8, 8, 2)
        lane = np.concatenate([inv[j, :, :, 0] for j in range(num)], axis=1)
        slot = np.concatenate([inv[j, :, :, 1] for j in range(num)], axis=1)
        return (f"{layout.name}: destination lane/register of each stored element", lane, slot,
                lambda s: f"r{s // 2}.{s % 2}", layout.lanes)
    op = layout.operand(operand)
    lane, slot = op.inverse[..., 0], op.inverse[..., 1]
    offsets = np.asarray(op.bit_offsets)
    # container width: the step between neighbouring elements (byte containers hold fp4 at 8-bit steps)
    steps = np.diff(np.sort(offsets))
    width = int(steps.min()) if len(steps) else op.bits

    def label(s):
        off = int(offsets[s])
        if width >= 32:
            return f"v{off // 32}"
        if 32 % width == 0:
            return f"v{off // 32}.{(off % 32) // width}"
        return f"s{s}"  # dense 6-bit packing: elements straddle registers

    fmt = layout.format_of(operand)
    title = f"{layout.name} operand {operand.upper()} ({op.map.rows}x{op.map.cols}, {fmt})"
    if getattr(layout, "cbsz", None) is not None:
        title += f" A {layout.a_format} / B {layout.b_format}"
    return title, lane, slot, label, layout.lanes


def _colour(lane: int, lanes: int) -> tuple[int, int, int]:
    # spread neighbouring lanes apart on the hue circle so adjacent cells stay distinguishable
    hue = ((lane * 0.61803398875) % 1.0)
    r, g, b = colorsys.hls_to_rgb(hue, 0.80, 0.65)
    return int(r * 255), int(g * 255), int(b * 255)


def _svg(title, lane, slot, label, lanes) -> str:
    rows, cols = lane.shape
    cw, ch, mx, my = 44, 30, 34, 46
    w, h = mx + cols * cw + 10, my + rows * ch + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
           'font-family="monospace">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{mx}" y="18" font-size="14">{escape(title)}</text>']
    for j in range(cols):
        out.append(f'<text x="{mx + j * cw + cw / 2}" y="{my - 6}" font-size="10" text-anchor="middle">{j}</text>')
    for i in range(rows):
        y = my + i * ch
        out.append(f'<text x="{mx - 4}" y="{y + ch / 2 + 4}" font-size="10" text-anchor="end">{i}</text>')
        for j in range(cols):
            x = mx + j * cw
            ln, sl = int(lane[i, j]), int(slot[i, j])
            r, g, b = _colour(ln, lanes)
            out.append(f'<rect x="{x}" y="{y}" width="{cw}" height="{ch}" fill="rgb({r},{g},{b})" '
                       'stroke="#555" stroke-width="0.5"/>')
            out.append(f'<text x="{x + cw / 2}" y="{y + 12}" font-size="10" text-anchor="middle">T{ln}</text>')
            out.append(f'<text x="{x + cw / 2}" y="{y + 25}" font-size="9" text-anchor="middle">'
                       f'{escape(label(sl))}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _text(title, lane, slot, label, lanes) -> str:
    rows, cols = lane.shape
    cells = [[f"T{int(lane[i, j])}:{label(int(slot[i, j]))}" for j in range(cols)] for i in range(rows)]
    width = max(len(c) for row in cells for c in row)
    head = " " * 4 + " ".join(f"{j:>{width}}" for j in range(cols))
    lines = [title, head]
    for i in range(rows):
        lines.append(f"{i:>3} " + " ".join(f"{c:>{width}}" for c in cells[i]))
    return "\n".join(lines) + "\n"


def _png(title, lane, slot, label, lanes) -> bytes:
    try:
        from PIL import Image, ImageDraw
    except ImportError as exc:
        raise BackendUnavailableError("PNG output needs Pillow: pip install \"mxcore[png]\" (or pip install pillow); "
                                      "SVG (fmt='svg', --out file.svg) needs nothing") from exc
    import io

    rows, cols = lane.shape
    cw, ch, mx, my = 44, 30, 34, 46
    img = Image.new("RGB", (mx + cols * cw + 10, my + rows * ch + 10), "white")
    d = ImageDraw.Draw(img)
    d.text((mx, 8), title, fill="black")
    for i in range(rows):
        d.text((4, my + i * ch + 10), str(i), fill="black")
        for j in range(cols):
            x, y = mx + j * cw, my + i * ch
            d.rectangle([x, y, x + cw, y + ch], fill=_colour(int(lane[i, j]), lanes), outline=(85, 85, 85))
            d.text((x + 4, y + 3), f"T{int(lane[i, j])}", fill="black")
            d.text((x + 4, y + 16), label(int(slot[i, j])), fill="black")
    for j in range(cols):
        d.text((mx + j * cw + 4, my - 14), str(j), fill="black")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def render(layout, operand: str = "a", fmt: str = "svg"):
    """Render ``operand`` of a layout record as ``fmt`` ("svg" | "text" -> str, "png" -> bytes)."""
    makers = {"svg": _svg, "text": _text, "png": _png}
    if fmt not in makers:
        raise LayoutError(f"render format {fmt!r}: use svg, png or text")
    return makers[fmt](*grid(layout, operand))
