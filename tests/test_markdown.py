"""Text a visitor or a job wrote, shown inside the panel's Markdown as itself (`panel/markdown.py`): every character
Markdown (or Gradio's LaTeX) would read as markup is escaped, and no component of the page renders `$$...$$` as math."""

import pytest

from panel import run_header
from panel.markdown import masked, plain

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text, shown", [
    ("$$x$$", r"\$\$x\$\$"),                       # a math block in Gradio's Markdown
    ("$x$ costs $5", r"\$x\$ costs \$5"),
    ("**bold** _it_ `code` ~~s~~", r"\*\*bold\*\* \_it\_ \`code\` \~\~s\~\~"),
    ("<img src=x onerror=alert(1)>", r"\<img src=x onerror=alert(1)\>"),
    ("![x](https://evil.example/a.png)", r"\!\[x\](https:\/\/evil.example/a.png)"),
    ("# heading", r"\# heading"),
    ("- item", r"\- item"),
    ("+ item", r"\+ item"),
    ("= setext", r"\= setext"),
    ("12. ordered", r"12\. ordered"),
    ("3) ordered", r"3\) ordered"),
    ("a | b", r"a \| b"),
    ("&amp;", r"\&amp;"),
    ("line\n# two", r"line \# two"),
    ("reward_code 3.5 a-b x=1", "reward_code 3.5 a-b x=1"),      # nothing active: left as it is
])
def test_markdown_active_characters_are_escaped(text, shown):
    assert plain(text) == shown


def test_a_run_named_as_a_math_block_heads_its_header_as_text():
    header = run_header.titled("### Run `20260101-000000-abcdef` — **RUNNING**", "$$x$$")
    assert header.startswith(r"### \$\$x\$\$ · Run ")
    assert masked("$$\\frac{1}{2}$$") == r"\$\$\\frac{1}{2}\$\$"


def test_no_component_of_the_page_renders_latex(panel):
    """Gradio renders `$$...$$` as math in Markdown and tables by default, after Markdown has dropped the escapes:
    the page turns it off everywhere."""
    from panel.ui import build_ui

    config = build_ui(panel).get_config_file()
    props = [c["props"] for c in config["components"] if "latex_delimiters" in c.get("props", {})]
    assert props, "no component that could render LaTeX was found: the check would prove nothing"
    assert [p.get("elem_id") for p in props if p["latex_delimiters"]] == []
