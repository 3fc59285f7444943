"""The page's status and alert marks: a word, and a symbol that every text font on a bare machine draws.

Debian's chromium ships no emoji font, so an emoji badge (🟢, ✅, 🔔, ⚠️) draws as an empty box there and the
badge says nothing. Each mark here is a plain geometric or dingbat character (DejaVu and Liberation carry them,
none is an emoji by default) followed by words, so it reads on any machine."""

SYMBOLS = {"running": "●", "scheduling": "◌", "completed": "✓", "failed": "✗", "stopped": "■", "unknown": "○",
           "warning": "▲", "retried": "↻", "waiting": "◌"}


def mark(kind: str, words: str) -> str:
    """'▲ Alert', '✓ completed': the symbol of `kind` (a SYMBOLS key) and the words that say it."""
    return f"{SYMBOLS[kind]} {words}"
