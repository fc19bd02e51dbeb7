"""Keyset cursors: where a page ended, as text (the sidebar's too), and the search's own cursor."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone as dt_timezone

MAX_INTEGER = 2**63 - 1  # the largest integer both databases store


class InvalidCursor(ValueError):
    pass


def micros(stamp: datetime) -> int:
    """A timestamp as whole microseconds since the epoch, as cursors carry it."""
    return int(stamp.timestamp()) * 1_000_000 + stamp.microsecond


def encode_cursor(*values: str | int | datetime) -> str:
    """Where a keyset page ended, as text: the values joined by dots, datetimes as `micros`."""
    return ".".join(str(micros(value)) if isinstance(value, datetime) else str(value) for value in values)


def parse_id(text: str) -> int | None:
    """`text` as a whole number a database column holds (ASCII digits, at most 2**63 - 1), else None."""
    if not (text.isascii() and text.isdigit()) or len(text) > 19 or int(text) > MAX_INTEGER:
        return None
    return int(text)


def decode_cursor(text: str, *kinds: type) -> tuple:
    """The values of an `encode_cursor` text, read as `kinds` (str, int or datetime, one per value);
    InvalidCursor when the text is not such a cursor."""
    parts = (text or "").split(".")
    if len(parts) != len(kinds):
        raise InvalidCursor(f"Not a cursor: {text[:40]!r}")
    values = []
    for part, kind in zip(parts, kinds):
        if kind is str:
            values.append(part)
            continue
        if parse_id(part) is None:
            raise InvalidCursor(f"Not a cursor: {text[:40]!r}")
        if kind is datetime:
            seconds, micro = divmod(int(part), 1_000_000)
            try:
                values.append(datetime.fromtimestamp(seconds, tz=dt_timezone.utc).replace(microsecond=micro))
            except (OverflowError, ValueError, OSError):
                raise InvalidCursor(f"Not a cursor: {text[:40]!r}") from None
        else:
            values.append(int(part))
    return tuple(values)


@dataclass(frozen=True)
class SearchCursor:
    """Where a search page ended. Titles: (rank, last_activity_at, session pk). Messages: (the session's
    last_activity_at, session pk, message seq); a bare "m" means the first message hit."""

    phase: str  # "t" (titles) or "m" (messages)
    rank: int = 0
    stamp: datetime | None = None
    pk: int | None = None
    seq: int = 0

    def encode(self) -> str:
        if self.phase == "m":
            return "m" if self.pk is None else encode_cursor("m", self.stamp, self.pk, self.seq)
        return encode_cursor("t", self.rank, self.stamp, self.pk)

    @classmethod
    def decode(cls, text: str) -> SearchCursor:
        phase = text.partition(".")[0]
        if text == "m":
            return cls("m")
        if phase == "m":
            _, stamp, pk, seq = decode_cursor(text, str, datetime, int, int)
            return cls("m", stamp=stamp, pk=pk, seq=seq)
        if phase == "t":
            _, rank, stamp, pk = decode_cursor(text, str, int, datetime, int)
            return cls("t", rank=rank, stamp=stamp, pk=pk)
        raise InvalidCursor(f"Not a search cursor: {text[:40]!r}")
