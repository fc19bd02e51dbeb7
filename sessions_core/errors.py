class SessionError(Exception):
    """Base class for errors about a session as a whole."""


class SessionIdNotSetError(SessionError):
    def __init__(self):
        super().__init__("Session ID is not set")


class SessionNotFoundError(SessionError):
    def __init__(self, session_id: str):
        self.session_id = session_id
        super().__init__(f"Session not found: {session_id}")


class SessionOwnershipError(SessionError):
    """The session belongs to someone else (or to no one, or the caller is anonymous and it has an owner)."""

    def __init__(self, session_id: str, user_id: str | None):
        self.session_id = session_id
        self.user_id = user_id
        who = f"user {user_id!r}" if user_id else "an anonymous caller"
        super().__init__(f"Session {session_id!r} does not belong to {who}; nothing was read or written.")


class QueuedRunTakenError(SessionError, ValueError):
    """`arun(None, run_id=...)` of a run that is not a queued run of that session whose process stopped
    (another process took it over first, it started, or it is still awaited)."""

    def __init__(self, run_id: str, session_id: str):
        self.run_id, self.session_id = run_id, session_id
        super().__init__(f"Run {run_id} is not a queued run of session {session_id!r} whose process has stopped.")


class Cancelled(Exception):
    """A run was asked to stop (raised inside it, at the next point where it looks)."""


class RunFailed(Exception):
    """A run failed for the reason its message gives (a workflow step, a function step's own failure)."""
