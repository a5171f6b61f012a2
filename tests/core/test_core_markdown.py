"""A table cell of the generated reference pages: one line, pipes escaped, HTML escaped outside code spans."""

from tradewind.core.markdown import table_cell


def test_a_cell_is_one_line_with_pipes_and_html_escaped_outside_code_spans():
    text = "Dataset <id>\n  or `a|b <c>` & more | end"
    assert table_cell(text) == "Dataset &lt;id&gt; or `a\\|b <c>` &amp; more \\| end"
