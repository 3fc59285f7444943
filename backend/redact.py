"""Keep tokens out of everything a person can see: logs, previews, the UI, the bucket."""

import re

REDACTED = "hf_***"
_TOKEN_PATTERNS = [
    re.compile(r"\bhf_[A-Za-z0-9]{8,}\b"),                       # Hugging Face user/org tokens
    re.compile(r"(?i)(authorization:\s*bearer\s+)[A-Za-z0-9._\-]{8,}"),
    re.compile(r"(?i)\b((?:hf|hugging_face_hub|huggingface)_token\s*[=:]\s*)['\"]?[^\s'\"]{8,}"),
]


def redact_tokens(text: str, known: tuple[str, ...] | list[str] = ()) -> str:
    """Replace anything token-shaped in `text`, and any of the `known` secret values, with a mask."""
    for value in known:
        if value and len(value) >= 8:
            text = text.replace(value, REDACTED)
    text = _TOKEN_PATTERNS[0].sub(REDACTED, text)
    for pattern in _TOKEN_PATTERNS[1:]:
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    return text
