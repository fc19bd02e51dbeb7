"""Text that every database stores as it is: U+FFFD in place of what PostgreSQL refuses.

A user's message, the model's output, a tool's result and the session state may hold a NUL
character (U+0000), which PostgreSQL cannot store in text or jsonb, or a lone surrogate (half of a
UTF-16 pair, from a JSON escape such as "\\ud800"), which is not Unicode and cannot be encoded as
UTF-8 at all. SQLite would store the first and refuse the second; PostgreSQL refuses both, and the
run's writes with them. So the engine replaces each with U+FFFD (the replacement character) where
text comes in, on every database alike. Surrogates that do form a pair are joined into their character.
"""

import re

REPLACEMENT = "\ufffd"

# `\u0000` in JSON text, unless its backslash is itself escaped (`\\u0000` is the six characters).
_ESCAPED_NUL = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def _has_surrogate(text: str) -> bool:
    if text.isascii():  # a flag CPython keeps: no scan
        return False
    try:
        text.encode("utf-8")  # in C; fails on a surrogate only
    except UnicodeEncodeError:
        return True
    return False


def is_storable(text: str) -> bool:
    return "\x00" not in text and not _has_surrogate(text)


def replace_unstorable(text: str) -> str:
    """`text` with each NUL and each lone surrogate replaced by U+FFFD (itself when there are none)."""
    if "\x00" in text:
        text = text.replace("\x00", REPLACEMENT)
    if _has_surrogate(text):
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def replace_unstorable_json(text: str) -> str:
    """JSON text whose strings went through `replace_unstorable`: an escaped NUL, and a raw surrogate, become U+FFFD.

    JSON text cannot hold a raw NUL (it is escaped). A surrogate escape (`\\ud800`) is left alone:
    the encoders here write characters raw (orjson; the json module with ensure_ascii=False), and a
    parsed value that holds one goes through `replace_unstorable` where it is stored.
    """
    return replace_unstorable(without_escaped_nul(text))


def without_escaped_nul(text: str) -> str:
    """JSON text with each escaped NUL (`\u0000`) written as `\ufffd`."""
    return _ESCAPED_NUL.sub(r"\1\\ufffd", text) if "\\u0000" in text else text


def replace_unstorable_tree(value):
    """A parsed JSON value with every string (and key) through `replace_unstorable`."""
    if isinstance(value, str):
        return replace_unstorable(value)
    if isinstance(value, list):
        return [replace_unstorable_tree(item) for item in value]
    if isinstance(value, dict):
        return {replace_unstorable(key): replace_unstorable_tree(item) for key, item in value.items()}
    return value
