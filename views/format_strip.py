"""A recipe of GGUF formats drawn as a strip: one row per transformer block (with a row above for
the embedding and one below for the head), one column per kind of tensor (attn_q ... ffn_down),
each cell coloured by the format its tensor gets, with a legend; hovering a cell names its tensor
and format.

:func:`format_grid` computes the grid from a recipe's tensor names and formats without Qt (the
tests compare it with the recipe); :class:`FormatStrip` paints it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from PySide6.QtCore import QEvent, QPoint, QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QLabel, QSizePolicy, QToolTip, QVBoxLayout, QWidget

from loomlab.core.evolve.llm.format_space import DEFAULT_FORMATS

#: a colour per format, fewest bits (red) to most (violet): ColorBrewer's Spectral, 11 classes
SPECTRAL = ("#9e0142", "#d53e4f", "#f46d43", "#fdae61", "#fee08b", "#ffffbf", "#e6f598", "#abdda4",
            "#66c2a5", "#3288bd", "#5e4fa2")
FORMAT_COLOURS = {**dict(zip(DEFAULT_FORMATS, SPECTRAL, strict=True)), "BF16": "#7a7a7a", "F32": "#404040"}
UNKNOWN_COLOUR = "#bdbdbd"
#: the columns' order for the kinds llama.cpp names (others follow in the recipe's order)
KIND_ORDER = ("token_embd", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
              "output")
#: column headers: a cell is narrow
SHORT_KINDS = {"token_embd": "embd", "attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o",
               "ffn_gate": "gate", "ffn_up": "up", "ffn_down": "down", "output": "head"}
EMBEDDING, HEAD = "embedding", "head"
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")
CELL_GAP = 1  # pixels between cells
MIN_ROW_LABEL_GAP = 2  # pixels between two row labels drawn


def format_colour(fmt: str | None) -> str:
    return FORMAT_COLOURS.get(fmt or "", UNKNOWN_COLOUR)


def tensor_kind(name: str) -> tuple[int | None, str]:
    """``(block, kind)`` of a GGUF tensor: ``blk.3.attn_v.weight`` -> ``(3, "attn_v")``,
    ``token_embd.weight`` -> ``(None, "token_embd")``."""
    stem = name.removesuffix(".weight")
    m = _BLOCK.fullmatch(stem)
    return (int(m.group(1)), m.group(2)) if m else (None, stem)


@dataclass(frozen=True)
class FormatGrid:
    """A recipe as a table: ``formats[r][c]`` and ``tensors[r][c]`` are the format and the tensor
    of row ``rows[r]`` and column ``columns[c]`` (None where the model has no such tensor)."""

    rows: tuple[str, ...]  # "embedding", "blk.0" ... "blk.N", "head" (those the recipe has)
    columns: tuple[str, ...]  # tensor kinds: attn_q, ffn_down, token_embd ...
    formats: tuple[tuple[str | None, ...], ...]
    tensors: tuple[tuple[str | None, ...], ...]

    def cell(self, tensor: str) -> tuple[int, int]:
        """The (row, column) of ``tensor``."""
        for r, names in enumerate(self.tensors):
            if tensor in names:
                return r, names.index(tensor)
        raise KeyError(tensor)

    def used(self) -> list[str]:
        """The formats in the grid, in :data:`FORMAT_COLOURS` order (fewest bits first)."""
        found = {f for row in self.formats for f in row if f is not None}
        order = list(FORMAT_COLOURS)
        return sorted(found, key=lambda f: (order.index(f) if f in order else len(order), f))


def format_grid(names: Sequence[str], genes: Sequence[str]) -> FormatGrid:
    """The grid of a recipe: ``genes[i]`` is the format of tensor ``names[i]`` (a recipe's order:
    the embedding's tensors, each block's, the head's). A tensor outside the blocks goes to the
    embedding row when it comes before the first block's tensors, else to the head row."""
    if len(names) != len(genes):
        raise ValueError(f"a recipe has one format per tensor: {len(names)} names, {len(genes)} formats")
    placed: list[tuple[str, str, str, str]] = []  # (row, kind, tensor, format)
    blocks: set[int] = set()
    for name, fmt in zip(names, genes, strict=True):
        block, kind = tensor_kind(name)
        if block is not None:
            blocks.add(block)
            placed.append((f"blk.{block}", kind, name, fmt))
        else:
            placed.append((EMBEDDING if not blocks else HEAD, kind, name, fmt))
    rows = ([EMBEDDING] if any(p[0] == EMBEDDING for p in placed) else []) + \
        [f"blk.{b}" for b in sorted(blocks)] + ([HEAD] if any(p[0] == HEAD for p in placed) else [])
    kinds = list(dict.fromkeys(p[1] for p in placed))
    columns = [k for k in KIND_ORDER if k in kinds] + [k for k in kinds if k not in KIND_ORDER]
    formats = [[None] * len(columns) for _ in rows]
    tensors = [[None] * len(columns) for _ in rows]
    row_of, column_of = {r: i for i, r in enumerate(rows)}, {c: i for i, c in enumerate(columns)}
    for row, kind, name, fmt in placed:
        r, c = row_of[row], column_of[kind]
        if tensors[r][c] is not None:
            raise ValueError(f"{name} and {tensors[r][c]} fall in one cell ({row}, {kind})")
        formats[r][c], tensors[r][c] = fmt, name
    return FormatGrid(tuple(rows), tuple(columns), tuple(map(tuple, formats)), tuple(map(tuple, tensors)))


def legend_html(formats: Sequence[str]) -> str:
    """A legend of coloured squares and format names, for a word-wrapped rich-text label."""
    return "&nbsp; ".join(f'<span style="color:{format_colour(f)}">■</span>&nbsp;{f}' for f in formats)


class _Canvas(QWidget):
    """The grid itself: cells as big as the widget allows, row and column labels beside them."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.grid: FormatGrid | None = None
        self.setMouseTracking(True)
        self.setMinimumSize(120, 60)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)

    def _geometry(self) -> tuple[float, float, float, float]:
        """(left, top, cell width, cell height) of the cells."""
        fm = self.fontMetrics()
        grid = self.grid
        left = max((fm.horizontalAdvance(_row_label(r)) for r in grid.rows), default=0) + 6
        width = max(1.0, (self.width() - left - 1) / max(1, len(grid.columns)))
        top = self._header_height(width)
        height = max(1.0, (self.height() - top - 1) / max(1, len(grid.rows)))
        return left, top, width, height

    def _headers(self) -> list[str]:
        return [SHORT_KINDS.get(kind, kind) for kind in self.grid.columns]

    def _header_height(self, width: float) -> int:
        """One line of column headers, or (when one is wider than a column) headers written
        upwards, as tall as the longest."""
        fm = self.fontMetrics()
        widest = max((fm.horizontalAdvance(h) for h in self._headers()), default=0)
        if widest + 2 <= width:
            return fm.height() + 2
        return min(widest + 6, max(fm.height() + 2, self.height() // 3))

    def cell_rect(self, r: int, c: int) -> QRectF:
        """Where cell (row ``r``, column ``c``) is drawn."""
        left, top, w, h = self._geometry()
        return QRectF(left + c * w, top + r * h, w, h)

    def cell_at(self, pos: QPoint) -> tuple[int, int] | None:
        """The (row, column) under ``pos``, or None."""
        if self.grid is None or not self.grid.rows:
            return None
        left, top, w, h = self._geometry()
        c, r = math.floor((pos.x() - left) / w), math.floor((pos.y() - top) / h)
        if 0 <= r < len(self.grid.rows) and 0 <= c < len(self.grid.columns):
            return r, c
        return None

    def text_at(self, pos: QPoint) -> str:
        """What hovering ``pos`` shows: ``blk.3.attn_v.weight: Q6_K`` ("" off the cells)."""
        cell = self.cell_at(pos)
        if cell is None:
            return ""
        r, c = cell
        tensor = self.grid.tensors[r][c]
        return "" if tensor is None else f"{tensor}: {self.grid.formats[r][c]}"

    def event(self, event) -> bool:
        if event.type() == QEvent.Type.ToolTip:
            text = self.text_at(event.pos())
            if text:
                QToolTip.showText(event.globalPos(), text, self)
            else:
                QToolTip.hideText()
                event.ignore()
            return True
        return super().event(event)

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt's name
        grid = self.grid
        if grid is None or not grid.rows:
            return
        painter = QPainter(self)
        try:
            fm = self.fontMetrics()
            left, top, w, h = self._geometry()
            text_pen = QPen(self.palette().windowText().color())
            painter.setPen(text_pen)
            upright = top <= fm.height() + 2
            for c, header in enumerate(self._headers()):
                if upright:
                    painter.drawText(QRectF(left + c * w, 0, w, top), Qt.AlignmentFlag.AlignCenter, header)
                    continue
                label = fm.elidedText(header, Qt.TextElideMode.ElideRight, top - 4)
                painter.save()  # written upwards, its baseline along the column's middle
                painter.translate(left + c * w + w / 2, top - 2)
                painter.rotate(-90)
                painter.drawText(QRectF(0, -fm.height() / 2, top - 2, fm.height()),
                                 Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, label)
                painter.restore()
            every = max(1, math.ceil((fm.height() + MIN_ROW_LABEL_GAP) / h))  # labels that fit, apart
            for r, row in enumerate(grid.rows):
                if r % every == 0 or row in (EMBEDDING, HEAD):
                    painter.drawText(QRectF(0, top + r * h, left - 4, h), Qt.AlignmentFlag.AlignRight
                                     | Qt.AlignmentFlag.AlignVCenter, _row_label(row))
            painter.setPen(Qt.PenStyle.NoPen)
            gap = CELL_GAP if min(w, h) > 4 * CELL_GAP else 0
            for r, formats in enumerate(grid.formats):
                for c, fmt in enumerate(formats):
                    if grid.tensors[r][c] is None:
                        continue
                    painter.setBrush(QColor(format_colour(fmt)))
                    painter.drawRect(QRectF(left + c * w, top + r * h, w - gap, h - gap))
        finally:
            painter.end()


def _row_label(row: str) -> str:
    return {EMBEDDING: "embd", HEAD: "head"}.get(row, row.replace("blk.", "blk "))


class FormatStrip(QWidget):
    """A recipe's formats per block and tensor kind (see the module docstring), and a legend of
    the formats it uses."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.canvas = _Canvas()
        self.legend = QLabel("")
        self.legend.setWordWrap(True)
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.canvas, 1)
        layout.addWidget(self.legend)

    @property
    def grid(self) -> FormatGrid | None:
        return self.canvas.grid

    def set_recipe(self, names: Sequence[str], genes: Sequence[str]) -> None:
        """Show the recipe giving tensor ``names[i]`` the format ``genes[i]``."""
        grid = format_grid(names, genes)
        self.canvas.grid = grid
        self.legend.setText(legend_html(grid.used()))
        self.canvas.update()

    def clear(self) -> None:
        self.canvas.grid = None
        self.legend.setText("")
        self.canvas.update()

    def text_at(self, pos: QPoint) -> str:
        """The hover text at ``pos`` in the grid's coordinates."""
        return self.canvas.text_at(pos)


__all__ = ["FORMAT_COLOURS", "FormatGrid", "FormatStrip", "format_grid", "legend_html", "tensor_kind"]
