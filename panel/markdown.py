"""Text shown as itself inside the Markdown the panel renders: a field's label or a message may hold `**kwargs`,
`<name>` or backticks, which Markdown would read as emphasis, an HTML tag or code."""

import re

# Markdown's inline punctuation, and an underscore that could open or close emphasis (not one inside a word such
# as reward_code, which CommonMark leaves alone).
_SPECIAL = re.compile(r"[\\`*<>\[\]~|]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def plain(text: str) -> str:
    """`text` escaped so that Markdown renders it character for character."""
    return _SPECIAL.sub(lambda m: "\\" + m.group(0), str(text))
