"""A reply's Markdown as spans to format and markers to remove (core.workspace.markdown)."""

from __future__ import annotations

from loomlab.core.workspace.markdown import BOLD, CODE, CODE_BLOCK, HEADING, markup


def shown(text: str) -> tuple[str, list[tuple[str, str]]]:
    """The text left once the markers are removed, and each span's kind and text."""
    m = markup(text)
    kept = "".join(c for i, c in enumerate(text) if not any(a <= i < b for a, b in m.markers))
    return kept, [(s.kind, text[s.start:s.end]) for s in m.spans]


def test_headings_code_bold_and_a_fenced_block():
    text = "# Title\nSome **bold** and `x = 1` here.\n```python\nprint(1)\n```\nend"
    kept, spans = shown(text)
    assert kept == "Title\nSome bold and x = 1 here.\nprint(1)\nend"
    assert sorted(spans) == sorted([(HEADING, "Title"), (BOLD, "bold"), (CODE, "x = 1"),
                                    (CODE_BLOCK, "print(1)\n")])


def test_markers_inside_code_are_code_and_an_unclosed_fence_runs_to_the_end():
    kept, spans = shown("`a **b** c` then\n```\n**not bold** # nor heading")
    assert kept == "a **b** c then\n**not bold** # nor heading"
    assert spans == [(CODE, "a **b** c"), (CODE_BLOCK, "**not bold** # nor heading")]


def test_plain_text_is_left_alone():
    text = "2 * 3 = 6, a_b and 5 # items"
    assert shown(text) == (text, [])
