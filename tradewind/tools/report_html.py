"""A report's markdown as one self-contained HTML file: the images inlined as base64 data URIs, the style in
the page, nothing fetched from anywhere.

It converts the markdown reports write, not markdown at large: `#`/`##` headings, pipe tables, `- ` lists,
``` fenced blocks, `![alt](file.png)` image lines and paragraphs, with `**bold**` and `code` inline.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping
from pathlib import Path

from tradewind.core import Workspace

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


def markdown_to_html(markdown: str, images: Mapping[str, bytes], title: str) -> str:
    """The HTML page of `markdown`, whose image lines name PNGs in `images` by file name (inlined; a missing one
    is named)."""
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
            out.append(_image(images, image.group(2), image.group(1)))
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        index += 1
    body = "\n".join(out)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body>\n{body}\n</body></html>\n"
    )


def _image(images: Mapping[str, bytes], name: str, alt: str) -> str:
    if name not in images:
        return f"<p>(missing image {html.escape(name)})</p>"
    data = base64.b64encode(images[name]).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def write_report(
    workspace: Workspace, name: str, markdown: str, title: str, images: Mapping[str, bytes], *, argument: str
) -> tuple[Path, Path, list[Path]]:
    """Write the PNG `images` (by file name), `<name>.md` and its self-contained `<name>.html` into the workspace's
    `reports/`, each through the confined atomic write: a symlink there that leads out is refused, naming
    `argument`. Returns the report's paths and the images'."""
    folder = workspace.reports_dir
    plots = [workspace.write_atomic(folder / file, png, argument=argument) for file, png in images.items()]
    markdown_path = workspace.write_atomic(folder / f"{name}.md", markdown, argument=argument)
    page = markdown_to_html(markdown, images, title)
    html_path = workspace.write_atomic(folder / f"{name}.html", page, argument=argument)
    return markdown_path, html_path, plots
