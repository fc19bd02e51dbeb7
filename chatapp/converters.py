"""URL converters."""


class SessionIdConverter:
    """A session id as it appears in URLs (and in the websocket path)."""

    regex = r"[A-Za-z0-9_.:-]{1,128}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value
