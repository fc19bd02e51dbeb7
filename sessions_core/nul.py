"""NUL characters, which PostgreSQL cannot store in text or jsonb, replaced where text enters the engine.

A user's message, the model's output, a tool's result and the session state may all hold U+0000 (a
crafted websocket frame, a model that emits it). SQLite would store it and PostgreSQL would refuse
the whole run's writes, so the engine replaces it with U+FFFD (the replacement character) as the
text comes in, on every database alike.
"""

import re

REPLACEMENT = "\ufffd"

# `\u0000` in JSON text, unless its backslash is itself escaped (`\\u0000` is the six characters).
_ESCAPED_NUL = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def replace_nul(text: str) -> str:
    return text.replace("\x00", REPLACEMENT) if "\x00" in text else text


def replace_nul_in_json(text: str) -> str:
    """JSON text whose strings hold no NUL. (JSON text itself cannot hold a raw NUL: it is escaped.)"""
    return _ESCAPED_NUL.sub(r"\1\\ufffd", text) if "\\u0000" in text else text
