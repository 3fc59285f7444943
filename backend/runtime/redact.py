"""Keep tokens out of everything a person can see: logs, previews, the UI, the bucket.

Two nets, both always applied:
- every token *shape* the Hub issues: user and org access tokens (`hf_...`), OAuth access tokens
  (`hf_oauth_...`), legacy API tokens (`api_...`, `api-...`) and legacy org API tokens (`api_org_...`,
  `api-org-...`), matched without word boundaries, so a token glued to a variable name (`MYVAR_hf_...`) or
  followed by `_x` is caught too, and values after `Authorization: Bearer` or `HF_TOKEN=`;
- every token value this process has been told about (`remember_secret`): the panel registers each visitor's
  token as it sees it, a job registers the token in its environment, so even a token of an unusual shape is
  masked wherever it appears.

This module runs in jobs too (it is uploaded with the runtime), so it imports nothing but the standard library.
"""

import os
import re
import threading

REDACTED = "hf_***"
# The token body: 8+ letters and digits with a digit or a capital among them, or 20+ of any kind; identifiers
# such as `hf_transfer` or `hf_datasets` in a log stay readable while a random token body never escapes.
_BODY = r"(?:(?=[a-z]*[A-Z0-9])[A-Za-z0-9]{8,}|[A-Za-z0-9]{20,})"
# Every prefix the Hub has issued tokens under (the legacy `api` ones with `_` or `-`).
_PREFIXES = r"(?:hf_oauth_|hf_|api[_-]org[_-]|api[_-])"
_SHAPES = re.compile(rf"{_PREFIXES}{_BODY}")
# Each with a word it cannot match without (lower case): a long text without it skips that scan (a 1 GB log
# download masks a chunk at a time).
_LABELLED = [
    ("bearer", re.compile(r"(?i)(authorization:\s*bearer\s+)[A-Za-z0-9._\-]{8,}")),
    ("_token", re.compile(r"(?i)((?:hf|hugging_face_hub|huggingface)_token\s*[=:]\s*)['\"]?[^\s'\"]{8,}")),
]
# Environment variables that carry a token into a job (or into the panel itself).
TOKEN_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN")
MIN_SECRET_LEN = 8
# Variable names that hold a secret: no process the panel starts inherits them (OAuth client secret, webhook key,
# panel password, tokens). TOKENIZERS_PARALLELISM is a setting, not a token.
_SECRET_ENV = re.compile(r"TOKEN(?!IZERS_)|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL|^OAUTH_|"
                         r"^GRPO_PANEL_AUTH$|^GRPO_CHECK_NONCE$", re.IGNORECASE)

_known: set[str] = set()
_known_lock = threading.Lock()


def remember_secret(value: str | None) -> None:
    """Mask `value` wherever `redact_tokens` meets it from now on, in this process."""
    if value and len(value) >= MIN_SECRET_LEN:
        with _known_lock:
            _known.add(value)


def remember_env_secrets(environ=os.environ) -> None:
    """Register the tokens this process was given through its environment."""
    for name in TOKEN_ENV_VARS:
        remember_secret(environ.get(name))


def is_secret_env_name(name: str) -> bool:
    """Whether an environment variable of this name holds a secret that a started process must not inherit."""
    return bool(_SECRET_ENV.search(name))


# A whole token, for refusing one typed into the form (or pasted into reward code): a user or org access token is
# `hf_` and 34 letters, OAuth and legacy org tokens are as long. Masking (above) takes shorter bodies too, so a cut
# token never shows; refusing them would refuse code that names `hf_Tokenizer2`.
_WHOLE = re.compile(r"(?:hf_oauth_|api[_-]org[_-]|api[_-](?!org[_-]))[A-Za-z0-9]{20,}|hf_(?!oauth_)[A-Za-z0-9]{30,}")


def looks_like_token(text: str) -> bool:
    """Whether `text` holds a whole Hub token (for refusing one typed into a form field or written into code)."""
    return bool(_WHOLE.search(text or ""))


def redact_tokens(text: str, known: tuple[str, ...] | list[str] = ()) -> str:
    """Replace anything token-shaped in `text`, every remembered secret and each of `known`, with a mask."""
    if not text:
        return text
    with _known_lock:
        secrets = [*_known, *known]
    # Longest first: one secret may contain another.
    for value in sorted((v for v in secrets if v and len(v) >= MIN_SECRET_LEN), key=len, reverse=True):
        text = text.replace(value, REDACTED)
    if "hf_" in text or "api_" in text or "api-" in text:
        text = _SHAPES.sub(REDACTED, text)
    lower = text.lower()
    for word, pattern in _LABELLED:
        if word in lower:
            text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    return text


def redact_record(value):
    """A JSON-like value (dict, list, str, number) with every string in it redacted, a dict's keys included (a
    metric or column named after a token is shown too)."""
    if isinstance(value, str):
        return redact_tokens(value)
    if isinstance(value, dict):
        return {redact_record(k): redact_record(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_record(v) for v in value]
    return value
