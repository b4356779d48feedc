"""The capacity report's markup: a section as Markdown and HTML side by side, and the tables, paragraphs and
inline figures the section builders (`llmcap.report.capacity_sections`) compose them from."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Section:
    title: str
    markdown: str
    html: str


def fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


def esc(text: str) -> str:
    """HTML-escaped, with break opportunities after '/' and '+' so long configuration keys wrap."""
    return re.sub(r"([/+])", r"\1<wbr>", html.escape(text))


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return "\n".join([_md_row(head), _md_row(["---"] * len(head)), *(_md_row(r) for r in rows)])


def html_table(head: Sequence[str], rows: Sequence[Sequence[str]], highlight: int | None = None) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        ('<tr class="chosen">' if i == highlight else "<tr>") + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>"
        for i, r in enumerate(rows)
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def paragraphs(lines: Sequence[str]) -> str:
    return "".join(f"<p>{esc(s)}</p>" for s in lines)


def figure(png: bytes, alt: str, panels: int = 1) -> str:
    """An inline PNG; `data-panels`: how many side-by-side panels it holds (the rendering test inks each)."""
    src = base64.b64encode(png).decode("ascii")
    return f'<figure data-panels="{panels}"><img alt="{html.escape(alt)}" src="data:image/png;base64,{src}"></figure>'
