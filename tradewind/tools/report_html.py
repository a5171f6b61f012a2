"""A report's markdown as one self-contained HTML file: the images inlined as base64 data URIs, the style in
the page, nothing fetched from anywhere.

It converts the markdown reports write, not markdown at large: `#`/`##` headings, pipe tables, `- ` lists,
``` fenced blocks, `![alt](file.png)` image lines and paragraphs, with `**bold**` and `code` inline.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}"
    "th{background:#f4f4f4}pre{background:#f6f6f6;padding:.8em;white-space:pre-wrap}img{max-width:100%}"
    "code{background:#f3f3f3;padding:0 .2em}"
)
_IMAGE = re.compile(r"^!\[([^\]]*)\]\(([^)]+)\)$")


def _inline(text: str) -> str:
    escaped = html.escape(text, quote=False)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def markdown_to_html(markdown: str, folder: Path, title: str) -> str:
    """The HTML page of `markdown`, whose images are files in `folder` (inlined; a missing one is named)."""
    out: list[str] = []
    lines = markdown.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("```"):
            end = next((i for i in range(index + 1, len(lines)) if lines[i].startswith("```")), len(lines))
            out.append("<pre>" + html.escape("\n".join(lines[index + 1 : end])) + "</pre>")
            index = end + 1
            continue
        if line.startswith("|"):
            block = []
            while index < len(lines) and lines[index].startswith("|"):
                block.append(lines[index])
                index += 1
            rows = [_cells(row) for row in block if not re.fullmatch(r"\|[-|: ]+\|", row.strip())]
            head, body = rows[0], rows[1:]
            out.append("<table><tr>" + "".join(f"<th>{_inline(cell)}</th>" for cell in head) + "</tr>")
            out += ["<tr>" + "".join(f"<td>{_inline(cell)}</td>" for cell in row) + "</tr>" for row in body]
            out.append("</table>")
            continue
        if line.startswith("- "):
            out.append("<ul>")
            while index < len(lines) and lines[index].startswith("- "):
                out.append(f"<li>{_inline(lines[index][2:])}</li>")
                index += 1
            out.append("</ul>")
            continue
        if heading := re.match(r"^(#{1,3}) (.*)$", line):
            level = len(heading.group(1))
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
        elif image := _IMAGE.match(line):
            out.append(_image(folder / image.group(2), image.group(1)))
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        index += 1
    body = "\n".join(out)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body>\n{body}\n</body></html>\n"
    )


def _image(path: Path, alt: str) -> str:
    if not path.is_file():
        return f"<p>(missing image {html.escape(path.name)})</p>"
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def write_report(folder: Path, name: str, markdown: str, title: str) -> tuple[Path, Path]:
    """Write `<name>.md` and its self-contained `<name>.html` into `folder`; return their paths."""
    from tradewind.core import atomic_write_text

    markdown_path, html_path = folder / f"{name}.md", folder / f"{name}.html"
    atomic_write_text(markdown_path, markdown)
    atomic_write_text(html_path, markdown_to_html(markdown, folder, title))
    return markdown_path, html_path
