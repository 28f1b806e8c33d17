"""Pictures of a layout: the operand tile as a grid, each cell labelled with lane and slot.

SVG needs nothing; PNG uses Pillow when it is installed (an optional extra); text is for terminals.
Cell labels: ``T<lane>`` over the register part — ``v<r>`` when the register holds one element,
``v<r>.<i>`` for element i of register r when it packs several, ``s<slot>`` for fp6 (elements
straddle registers).  For ldmatrix the grid shows the ``num`` stored 8x8 matrices side by side.

A wgmma operand in shared memory (:class:`~._smem.SmemLayout`) is drawn as two panels: its swizzle atom (8 rows x
the swizzle span in 16-byte chunks; each cell is a physical chunk, labelled with the logical chunk of that row
stored there, coloured by the logical chunk) and the tile in 16-byte chunks (rows: M/N for a K-major operand, K
for an M/N-major one; each cell labelled ``@<byte address>`` from a start address 0 and ``p<physical chunk>``,
coloured by the physical chunk within its swizzle row, so the permutation shows as shuffled colours).
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass
from xml.sax.saxutils import escape

import numpy as np

from ..errors import BackendUnavailableError, LayoutError
from ._core import LdMatrixLayout
from ._smem import SmemLayout

__all__ = ["render", "grid", "panels"]


@dataclass(frozen=True)
class Panel:
    """One picture: a title and a rows x cols grid of cells (upper label, lower label, colour key)."""

    title: str
    top: list
    bottom: list
    colour: np.ndarray
    colours: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.colour.shape


def grid(layout, operand: str):
    """(title, lane grid, slot grid, slot label function, lanes) for one register operand of ``layout``."""
    if isinstance(layout, LdMatrixLayout):
        num = layout.num
        inv = layout.inverse  # (num, 8, 8, 2)
        lane = np.concatenate([inv[j, :, :, 0] for j in range(num)], axis=1)
        slot = np.concatenate([inv[j, :, :, 1] for j in range(num)], axis=1)
        return (f"{layout.name}: destination lane/register of each stored element", lane, slot,
                lambda s: f"r{s // 2}.{s % 2}", layout.lanes)
    op = layout.operand(operand)
    if isinstance(op, SmemLayout):
        raise LayoutError(f"{layout.name} operand {operand}: in shared memory, drawn by panels(), not grid()")
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


def _register_panel(layout, operand) -> Panel:
    title, lane, slot, label, lanes = grid(layout, operand)
    rows, cols = lane.shape
    top = [[f"T{int(lane[i, j])}" for j in range(cols)] for i in range(rows)]
    bottom = [[label(int(slot[i, j])) for j in range(cols)] for i in range(rows)]
    return Panel(title, top, bottom, np.asarray(lane), lanes)


def atom_panel(atom) -> Panel:
    """The swizzle atom: cell (row r, physical chunk p) holds logical chunk ``atom.logical_at()[r, p]``."""
    logical = atom.logical_at()
    rows, cols = logical.shape
    title = (f"{atom.name} swizzle atom ({atom.cute} on byte addresses): 8 rows x {atom.span} bytes,\n"
             f"{atom.atom_bytes}-byte pattern; cell = physical 16-byte chunk,\nlabel = logical chunk stored there")
    top = [[f"c{int(logical[r, p])}" for p in range(cols)] for r in range(rows)]
    bottom = [[f"@{r * atom.span + 16 * p}" for p in range(cols)] for r in range(rows)]
    return Panel(title, top, bottom, logical, cols)


def smem_panels(name: str, fmt: str, lay: SmemLayout) -> list[Panel]:
    """The swizzle atom (if any) and the tile in 16-byte chunks, addresses from a start address 0."""
    t = lay.elements_per_chunk
    addr = lay.addresses(0)
    if (lay.major == "K") == (lay.role == "a"):  # chunk = T consecutive columns
        chunk_addr = addr[:, ::t]
        what = f"rows {'M' if lay.role == 'a' else 'K'}, columns 16-byte chunks of {t} {'K' if lay.role == 'a' else 'N'}"
    else:  # chunk = T consecutive rows: draw the transpose so that a grid row is one memory row
        chunk_addr = addr[::t, :].T
        what = f"rows {'K' if lay.role == 'a' else 'N'}, columns 16-byte chunks of {t} {'M' if lay.role == 'a' else 'K'}"
    span = lay.atom.span if lay.atom is not None else 16
    phys = (chunk_addr % span) // 16
    rows, cols = chunk_addr.shape
    top = [[f"@{int(chunk_addr[i, j])}" for j in range(cols)] for i in range(rows)]
    bottom = [[f"p{int(phys[i, j])}" for j in range(cols)] for i in range(rows)]
    title = (f"{name} operand {'A' if lay.role == 'a' else 'B'}\nin shared memory ({lay.rows}x{lay.cols}, {fmt}): "
             f"{lay.major}-major, swizzle {lay.swizzle}, LBO {lay.lbo}, SBO {lay.sbo};\n{what};\n"
             f"@ byte address from the start, p physical chunk in its {span}-byte row")
    out = [atom_panel(lay.atom)] if lay.atom is not None else []
    return out + [Panel(title, top, bottom, phys, max(1, span // 16))]


def panels(layout, operand: str, smem: dict | None = None) -> list[Panel]:
    """The pictures of one operand: one grid for a register operand; swizzle atom and tile for a wgmma operand in
    shared memory (``smem``: major, swizzle, lbo, sbo for ``WgmmaLayout.smem``)."""
    from .hopper import WgmmaLayout

    if isinstance(layout, WgmmaLayout):
        op = layout.operand(operand)
        if isinstance(op, SmemLayout):
            lay = layout.smem(op.role, **(smem or {}))
            return smem_panels(layout.name, layout.format_of(operand), lay)
    if smem:
        raise LayoutError(f"{layout.name} operand {operand}: major / swizzle / LBO / SBO apply to wgmma operands in "
                          "shared memory (operand B or A_smem of a wgmma record)")
    return [_register_panel(layout, operand)]


def _colour(key: int, keys: int) -> tuple[int, int, int]:
    # spread neighbouring keys apart on the hue circle so adjacent cells stay distinguishable
    hue = ((key * 0.61803398875) % 1.0)
    r, g, b = colorsys.hls_to_rgb(hue, 0.80, 0.65)
    return int(r * 255), int(g * 255), int(b * 255)


_CW, _CH, _MX, _MY, _GAP, _LINE = 44, 30, 34, 46, 20, 16


def _head(p) -> int:
    """Height above a panel's grid: the title's lines and the column numbers."""
    return _MY + _LINE * p.title.count("\n")


def _size(pans, char: float) -> tuple[int, int]:
    w = max(max(_MX + p.shape[1] * _CW + 10, _MX + int(char * max(map(len, p.title.split("\n")))) + 10) for p in pans)
    h = sum(_head(p) + p.shape[0] * _CH for p in pans) + _GAP * (len(pans) - 1) + 10
    return w, h


def _svg(pans) -> str:
    w, h = _size(pans, 8.4)  # monospace at 14 px: 0.6 em per character
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
           'font-family="monospace">',
           f'<rect width="{w}" height="{h}" fill="white"/>']
    y0 = 0
    for p in pans:
        rows, cols = p.shape
        for n, line in enumerate(p.title.split("\n")):
            out.append(f'<text x="{_MX}" y="{y0 + 18 + _LINE * n}" font-size="14">{escape(line)}</text>')
        head = _head(p)
        for j in range(cols):
            out.append(f'<text x="{_MX + j * _CW + _CW / 2}" y="{y0 + head - 6}" font-size="10" '
                       f'text-anchor="middle">{j}</text>')
        for i in range(rows):
            y = y0 + head + i * _CH
            out.append(f'<text x="{_MX - 4}" y="{y + _CH / 2 + 4}" font-size="10" text-anchor="end">{i}</text>')
            for j in range(cols):
                x = _MX + j * _CW
                r, g, b = _colour(int(p.colour[i, j]), p.colours)
                out.append(f'<rect x="{x}" y="{y}" width="{_CW}" height="{_CH}" fill="rgb({r},{g},{b})" '
                           'stroke="#555" stroke-width="0.5"/>')
                out.append(f'<text x="{x + _CW / 2}" y="{y + 12}" font-size="10" text-anchor="middle">'
                           f'{escape(p.top[i][j])}</text>')
                out.append(f'<text x="{x + _CW / 2}" y="{y + 25}" font-size="9" text-anchor="middle">'
                           f'{escape(p.bottom[i][j])}</text>')
        y0 += head + rows * _CH + _GAP
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _text(pans) -> str:
    blocks = []
    for p in pans:
        rows, cols = p.shape
        cells = [[f"{p.top[i][j]}:{p.bottom[i][j]}" for j in range(cols)] for i in range(rows)]
        width = max(len(c) for row in cells for c in row)
        head = " " * 4 + " ".join(f"{j:>{width}}" for j in range(cols))
        lines = [p.title, head]
        for i in range(rows):
            lines.append(f"{i:>3} " + " ".join(f"{c:>{width}}" for c in cells[i]))
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def _png(pans) -> bytes:
    try:
        from PIL import Image, ImageDraw
    except ImportError as exc:
        raise BackendUnavailableError("PNG output needs Pillow: pip install \"mxcore[png]\" (or pip install pillow); "
                                      "SVG (fmt='svg', --out file.svg) needs nothing") from exc
    import io

    w, h = _size(pans, 6.5)  # Pillow's default bitmap font
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    y0 = 0
    for p in pans:
        rows, cols = p.shape
        head = _head(p)
        for n, line in enumerate(p.title.split("\n")):
            d.text((_MX, y0 + 8 + _LINE * n), line, fill="black")
        for i in range(rows):
            d.text((4, y0 + head + i * _CH + 10), str(i), fill="black")
            for j in range(cols):
                x, y = _MX + j * _CW, y0 + head + i * _CH
                d.rectangle([x, y, x + _CW, y + _CH], fill=_colour(int(p.colour[i, j]), p.colours),
                            outline=(85, 85, 85))
                d.text((x + 4, y + 3), p.top[i][j], fill="black")
                d.text((x + 4, y + 16), p.bottom[i][j], fill="black")
        for j in range(cols):
            d.text((_MX + j * _CW + 4, y0 + head - 14), str(j), fill="black")
        y0 += head + rows * _CH + _GAP
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def render(layout, operand: str = "a", fmt: str = "svg", smem: dict | None = None):
    """Render ``operand`` of a layout record as ``fmt`` ("svg" | "text" -> str, "png" -> bytes); ``smem`` picks the
    shared-memory form of a wgmma operand (major, swizzle, lbo, sbo)."""
    makers = {"svg": _svg, "text": _text, "png": _png}
    if fmt not in makers:
        raise LayoutError(f"render format {fmt!r}: use svg, png or text")
    return makers[fmt](panels(layout, operand, smem))
