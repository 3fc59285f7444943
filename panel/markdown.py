"""Text shown as itself inside the Markdown the panel renders. One place for it: everything that came from a visitor
or a job (dataset column names, reward names, printed output, error text, a job's status message, file names in a
bucket) goes through one of these before it joins a Markdown message.

Markdown would read such text as markup: `**kwargs` as emphasis, `<img src=...>` as HTML, `![x](https://...)` as an
image loaded from an outside host, `[Sign in again](https://...)` as a link, a line break followed by `# ...` as a
heading, a line of three backticks inside printed output as the end of its code block, and `$$x$$` as a math block
(Gradio renders LaTeX between `$$` in every Markdown component by default: a backslash before each `$` stops it, seen in
chromium, and `no_latex` also turns LaTeX off for the whole page, for text that reaches a component unescaped). So:

- `plain(text)`: inline text, escaped so that it renders character for character (line breaks become spaces, a
  bare URL is not turned into a link);
- `masked(text)`: the same for text that could hold a token (masked first, `backend.runtime.redact`);
- `code_span(text)`: inline code that holds any text, backticks included;
- `fenced(text, lang)`: a code block whose fence is longer than any run of backticks inside, so nothing closes it.
"""

import re

from backend.runtime.redact import redact_tokens

# Markdown's inline punctuation (`$` opens math where a renderer reads it in the source), an underscore that could
# open or close emphasis (not one inside a word such as reward_code, which CommonMark leaves alone), and what makes a
# list item or a setext heading at the start of a line (the text may start one: `- x`, `+ x`, `1. x`, `= x`).
_SPECIAL = re.compile(r"[\\`*<>\[\]~|!#&$]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|^[-+=]")
_ORDERED_ITEM = re.compile(r"^(\d{1,9})([.)])")
_LINE_BREAKS = re.compile(r"[\r\n\u2028\u2029\x0b\x0c]+")
# What GitHub-flavoured Markdown turns into a link by itself: `scheme://...` and `www.`.
_AUTOLINK = re.compile(r"(?i)(://|\bwww\.)")
_BACKTICKS = re.compile(r"`+")


def plain(text) -> str:
    """`text` escaped so that Markdown renders it character for character, on one line."""
    text = _LINE_BREAKS.sub(" ", str(text))
    text = _ORDERED_ITEM.sub(r"\1\\\2", _SPECIAL.sub(lambda m: "\\" + m.group(0), text))
    return _AUTOLINK.sub(lambda m: m.group(0).replace("/", "\\/").replace(".", "\\."), text)


def masked(text) -> str:
    """Text that came from a visitor or a job, with any token masked, escaped as `plain` does."""
    return plain(redact_tokens(str(text)))


def _longest_backticks(text: str) -> int:
    return max((len(run) for run in _BACKTICKS.findall(text)), default=0)


def code_span(text) -> str:
    """`text` as inline code, on one line, whatever backticks it holds (the delimiters are longer than any run
    inside; a space pads text that starts or ends with a backtick, as CommonMark strips one each side)."""
    text = _LINE_BREAKS.sub(" ", str(text))
    ticks = "`" * (_longest_backticks(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def fenced(text, lang: str = "text") -> str:
    """`text` as a fenced code block that nothing inside can close: the fence is a run of backticks longer than
    any inside it (at least three). `lang` is the panel's own (a word such as text, bash, python)."""
    text = str(text)
    fence = "`" * max(3, _longest_backticks(text) + 1)
    return f"{fence}{lang}\n{text}\n{fence}"


def no_latex(blocks) -> None:
    """Turn LaTeX off in every component of `blocks` (a built page) that would render it (Markdown, tables): the
    panel writes no math, and a visitor's `$$x$$` (a run's name in its header or the runs list, a column name) must
    read as itself. A second layer beside `plain`'s escaped `$`: it also holds for text shown without escaping (a
    table's cells) and for a renderer that reads the text after Markdown has dropped the escapes."""
    for block in blocks.blocks.values():
        if getattr(block, "latex_delimiters", None):
            block.latex_delimiters = []
