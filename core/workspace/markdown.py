"""The Markdown of a chat reply as spans to format in place: the transcript keeps each token as
the model wrote it (a link to its alternatives) and formats the finished reply over them, removing
only the markers. Fenced code blocks, inline code, bold and headings; the rest reads as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CODE_BLOCK, CODE, BOLD, HEADING = "code block", "code", "bold", "heading"
_FENCE = re.compile(r"^[ \t]*```[^\n]*(?:\n|$)", re.MULTILINE)
_HEADING = re.compile(r"^(#{1,6}[ \t]+)([^\n]*)", re.MULTILINE)
_CODE = re.compile(r"(`)([^`\n]+)(`)")
_BOLD = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")


@dataclass(frozen=True)
class Span:
    """``text[start:end]`` is shown as ``kind``."""

    start: int
    end: int
    kind: str


@dataclass(frozen=True)
class Markup:
    """What to format (``spans``) and which ``(start, end)`` marker ranges to remove, in offsets
    of the original text; markers do not overlap."""

    spans: list[Span]
    markers: list[tuple[int, int]]


def markup(text: str) -> Markup:
    """The formatting of ``text`` (a reply, possibly cut short: an unclosed fence runs to the end)."""
    spans: list[Span] = []
    markers: list[tuple[int, int]] = []
    prose_from = 0
    fences = list(_FENCE.finditer(text))
    for opening, closing in zip(fences[::2], [*fences[1::2], None], strict=False):
        _prose(text, prose_from, opening.start(), spans, markers)
        end = closing.start() if closing is not None else len(text)
        spans.append(Span(opening.end(), end, CODE_BLOCK))
        markers.append((opening.start(), opening.end()))
        if closing is not None:
            markers.append((closing.start(), closing.end()))
        prose_from = closing.end() if closing is not None else len(text)
    _prose(text, prose_from, len(text), spans, markers)
    return Markup(spans, sorted(markers))


def _prose(text: str, start: int, end: int, spans: list[Span], markers: list[tuple[int, int]]) -> None:
    """Headings, inline code and bold in ``text[start:end]`` (bold never inside code)."""
    part = text[start:end]
    for m in _HEADING.finditer(part):
        markers.append((start + m.start(1), start + m.end(1)))
        spans.append(Span(start + m.start(2), start + m.end(2), HEADING))
    code = []
    for m in _CODE.finditer(part):
        code.append((m.start(), m.end()))
        markers += [(start + m.start(1), start + m.end(1)), (start + m.start(3), start + m.end(3))]
        spans.append(Span(start + m.start(2), start + m.end(2), CODE))
    for m in _BOLD.finditer(part):
        if any(a < m.end() and m.start() < b for a, b in code):
            continue
        markers += [(start + m.start(1), start + m.end(1)), (start + m.end(2), start + m.end())]
        spans.append(Span(start + m.start(2), start + m.end(2), BOLD))
