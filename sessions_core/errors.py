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


class RunNotContinuableError(SessionError, ValueError):
    """`continue_run` of a run that is not paused (it completed, was cancelled, or another continuation
    took it first), or that is not this component's; nothing was changed."""

    def __init__(self, run_id: str, reason: str):
        self.run_id, self.reason = run_id, reason
        super().__init__(f"Cannot continue run {run_id}: {reason}; nothing was changed.")


class UnresolvedRequirementsError(SessionError, ValueError):
    """`continue_run` with a requirement left unanswered; nothing was changed."""

    def __init__(self, run_id: str, tool_names: list[str]):
        self.run_id, self.tool_names = run_id, tool_names
        super().__init__(f"Cannot continue run {run_id}: unresolved requirements: {tool_names}; answer each "
                         "(confirm, reject, provide_user_input or set_external_execution_result). Nothing was changed.")


class Paused(Exception):
    """A run stops to wait for a person (raised by its model loop; the run is stored paused)."""


class ChildPaused(Paused):
    """A run inside this one (a team's member, a workflow's agent or team step) paused: this one waits too."""

    def __init__(self, child):
        super().__init__()
        self.child = child  # the paused run (run.child.ChildRun)


class Cancelled(Exception):
    """A run was asked to stop (raised inside it, at the next point where it looks)."""


class RunFailed(Exception):
    """A run failed for the reason its message gives (a workflow step, a function step's own failure)."""


class UserMemoryNotFoundError(LookupError):
    """No memory of this user has that id (another user's memory id is not found either)."""

    def __init__(self, memory_id: str):
        self.memory_id = memory_id
        super().__init__(f"Memory not found: {memory_id}")
