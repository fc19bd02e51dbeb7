"""Storage for sessions: one row per session, run, message and state change.

Nothing grows per run except new rows. History is read from earlier Message rows (never copied),
and the state as of any version is rebuilt from StateChange rows, so no row is rewritten with a
growing JSON blob on every turn.
"""

import uuid

import jsonpatch
from django.conf import settings
from django.db import models
from django.db.models import Case, Count, F, Q, Sum, When
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce
from django.utils import timezone

from .state import check_patch, diff, to_json


def new_id() -> str:
    return str(uuid.uuid4())


class SessionKind(models.TextChoices):
    AGENT = "agent"
    TEAM = "team"
    WORKFLOW = "workflow"


class NameSource(models.TextChoices):
    NONE = "", "none"
    FALLBACK = "fallback"
    AUTO = "auto"
    USER = "user"


class ChatSessionQuerySet(models.QuerySet):
    def for_user(self, user):
        """The one owner-scoped entry point: sessions of `user`, a User or a user's pk (None: ownerless sessions)."""
        if user is None:
            return self.filter(owner__isnull=True)
        if isinstance(user, int):
            return self.filter(owner_id=user)
        if not user.is_authenticated:
            return self.none()
        return self.filter(owner=user)

    def alive(self):
        return self.filter(deleted_at__isnull=True)

    def leased(self, now=None):
        """Sessions whose run lease is held and has not expired: a run is in flight (in some process)."""
        return self.filter(lease_expires_at__gt=now or timezone.now())

    def new(self, *, owner, component_id: str = "", kind: str = "agent", metadata=None, session_id=None,
            now=None, **fields) -> "ChatSession":
        """The one place a session is created (a run's first turn, the web's new chat, an import)."""
        session = self.build(owner=owner, component_id=component_id, kind=kind, metadata=metadata,
                             session_id=session_id, now=now, **fields)
        session.save(force_insert=True, using=self.db)
        return session

    def build(self, *, owner, component_id: str = "", kind: str = "agent", metadata=None, session_id=None,
              now=None, **fields) -> "ChatSession":
        """The unsaved session `new` would create (the engine inserts a new session and its first run
        before saving it)."""
        now = now or timezone.now()
        if session_id:
            fields["session_id"] = session_id
        fields.setdefault("created_at", now)
        fields.setdefault("last_activity_at", now)
        return self.model(owner=owner, component_id=component_id, kind=kind, metadata=dict(metadata or {}), **fields)

    def trashed(self):
        return self.filter(deleted_at__isnull=False)

    def for_sidebar(self):
        """Only what a list row needs: never the state, summary or messages; `is_waiting`: a run of it
        waits for the user (paused; one look each on the runs' (session, status) index)."""
        waiting = Run.objects.waiting().filter(session_id=models.OuterRef("pk"))
        return self.only(
            "id", "session_id", "owner_id", "kind", "component_id", "name", "name_source",
            "created_at", "last_activity_at", "pinned_at", "deleted_at", "lease_expires_at",
        ).annotate(is_waiting=models.Exists(waiting)).order_by("-last_activity_at", "-id")


class ChatSession(models.Model):
    session_id = models.CharField(max_length=128, unique=True, default=new_id)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="chat_sessions"
    )
    kind = models.CharField(max_length=16, choices=SessionKind.choices, default=SessionKind.AGENT)
    component_id = models.CharField(max_length=128, blank=True, help_text="Which agent, team or workflow.")
    name = models.CharField(max_length=200, blank=True)
    name_source = models.CharField(max_length=16, choices=NameSource.choices, blank=True, default=NameSource.NONE)
    session_state = models.JSONField(default=dict, blank=True)
    state_version = models.PositiveIntegerField(default=0)
    summary = models.JSONField(null=True, blank=True, help_text="Session summary: text, topics, updated_at.")
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_activity_at = models.DateTimeField(default=timezone.now)
    pinned_at = models.DateTimeField(null=True, blank=True)
    archived_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)
    # The run lease: runs on one session take turns. A lease that is not renewed expires, so a dead
    # process never blocks its session.
    lease_token = models.CharField(max_length=64, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    last_seq = models.BigIntegerField(default=0, help_text="Highest Message.seq in this session.")
    # No constraint or index: SQLite then adds and drops the column in place instead of rebuilding the
    # table, which would drop the search triggers on it (migration 0002). Django still sets it NULL when
    # the run is deleted.
    current_leaf = models.ForeignKey(
        "Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_constraint=False,
        db_index=False, help_text="The last top-level run of the branch the session is on: the next run follows it.")

    objects = ChatSessionQuerySet.as_manager()

    class Meta:
        indexes = [
            # Partial indexes: the sidebar reads live sessions newest first, pinned ones apart, and a
            # planner walks these in order (an IS NULL test on a leading column would stop it doing so).
            models.Index(
                fields=["owner", "-last_activity_at", "-id"], condition=Q(deleted_at__isnull=True),
                name="session_sidebar_idx",
            ),
            models.Index(
                fields=["owner", "-last_activity_at", "-id"],
                condition=Q(deleted_at__isnull=True, pinned_at__isnull=False), name="session_pinned_idx",
            ),
            models.Index(fields=["owner", "component_id", "-last_activity_at"], name="session_component_idx"),
        ]

    def __str__(self) -> str:
        return self.name or self.session_id

    @property
    def is_running(self) -> bool:
        return bool(self.lease_expires_at and self.lease_expires_at > timezone.now())

    def apply_state_change(self, new_state: dict, source: str, run=None, now=None) -> dict:
        """Store `new_state` on this (locked) row as one recorded, versioned change; the stored state."""
        new_state = to_json(new_state)  # StateLimitError over CHAT_MAX_STATE_BYTES
        if new_state != self.session_state:
            patch, inverse = diff(self.session_state, new_state)
            check_patch(patch)  # StateLimitError deeper than CHAT_MAX_JSON_DEPTH
            self.state_version += 1
            StateChange.objects.using(self._state.db).create(
                session=self, run=run, version=self.state_version, patch=patch, inverse=inverse, source=source,
                created_at=now or timezone.now(),
            )
            self.session_state = new_state
            self.save(update_fields=["session_state", "state_version"])
        return self.session_state

    def restore_state(self, version: int, source: str, now=None) -> dict:
        """Set this (locked) row's state back to what it was at `version`, recorded as one change that names
        that version instead of holding a diff: a switch back and forth between two branches writes a small
        row each time, however large the state. The stored state."""
        state = self.state_at(version)
        if state != self.session_state:
            # A change that itself restored a version names that one: a chain of switches stays one step deep.
            restores = self.state_changes.filter(version=version).values_list("restores", flat=True).first()
            self.state_version += 1
            StateChange.objects.using(self._state.db).create(
                session=self, version=self.state_version, patch=[], inverse=[], source=source,
                restores=version if restores is None else restores, created_at=now or timezone.now())
            self.session_state = state
            self.save(update_fields=["session_state", "state_version"])
        return self.session_state

    def state_at(self, version: int) -> dict:
        """The state as it was at `version`: rebuilt by undoing later changes, or, past a change that restored
        an earlier version (it holds no diff to undo), built up to `version` from below."""
        if not 0 <= version <= self.state_version:
            raise ValueError(f"Version {version} does not exist (latest is {self.state_version}).")
        state = self.session_state
        changes = self.state_changes.filter(version__gt=version).order_by("-version")
        for change in changes.only("inverse", "restores"):
            if change.restores is not None:
                return self._state_built_up_to(version)
            state = jsonpatch.apply_patch(state, change.inverse)
        return state

    def _state_built_up_to(self, version: int) -> dict:
        """The state at `version` from the newest change at or before it that restored a version (the state of
        that version) or else from the empty state of version 0, with the patches of the changes after it."""
        changes = self.state_changes.filter(version__lte=version)
        base = changes.filter(restores__isnull=False).order_by("-version").only("version", "restores").first()
        state, start = (self.state_at(base.restores), base.version) if base else ({}, 0)
        for change in changes.filter(version__gt=start).order_by("version").only("patch"):
            state = jsonpatch.apply_patch(state, change.patch)
        return state


class RunKind(models.TextChoices):
    AGENT = "agent"
    TEAM = "team"
    WORKFLOW = "workflow"
    FUNCTION = "function", "function step"


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    PAUSED = "paused"
    COMPLETED = "completed"
    ERROR = "error"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


INTERRUPTED_ERROR = "The process running this run stopped before it finished."
# A run that has not ended: it holds the session's lease (running), waits for it (queued) or for a person (paused).
OPEN_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.PAUSED)


class RunQuerySet(models.QuerySet):
    def begun(self):
        """Runs that have started (a queued run waits for its turn: it is no part of the conversation yet)."""
        return self.exclude(status=RunStatus.QUEUED)

    def waiting(self):
        """Top-level runs that wait for the user (paused): the mark of their session's sidebar row."""
        return self.filter(status=RunStatus.PAUSED, parent_run__isnull=True)

    def abandoned(self, now=None):
        """Runs still marked running whose session holds no live lease: the process running them has
        stopped (a run renews its session's lease every few seconds until it is stored as finished)."""
        now = now or timezone.now()
        return self.filter(Q(session__lease_expires_at__isnull=True) | Q(session__lease_expires_at__lte=now),
                           status=RunStatus.RUNNING)

    def usage(self) -> dict:
        """{"runs", "input_tokens", "output_tokens", "unknown_usage"} of these runs, summed in the database from
        their metrics; `unknown_usage` counts the runs whose tokens were never reported (stopped, failed), which
        the sums leave out rather than count as 0."""
        return self.aggregate(runs=Count("pk"), **USAGE_SUMS)


def _metric(key: str):
    """A run's metrics[key] as a number, for sums: NULL where a run has none, or has anything but a whole
    number of at most 12 digits (the engine's own counts; an import allows no more), so a sum neither
    overflows nor fails on a value stored by other means."""
    counted = Q(**{f"metrics__{key}__regex": r"^[0-9]{1,12}$"})
    return Case(When(counted, then=Cast(KT(f"metrics__{key}"), models.BigIntegerField())), default=None)


USAGE_SUMS = {**{key: Coalesce(Sum(_metric(key)), 0) for key in ("input_tokens", "output_tokens")},
              "unknown_usage": Count("pk", filter=~Q(metrics__has_key="input_tokens"))}


class Run(models.Model):
    run_id = models.CharField(max_length=64, unique=True, default=new_id)
    # No index of its own: run_history_idx starts with it (every insert would update both).
    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="runs", db_index=False)
    parent_run = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="children",
                                   help_text="The workflow or team run this step or member run belongs to.")
    kind = models.CharField(max_length=16, choices=RunKind.choices, default=RunKind.AGENT)
    follows = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="followers",
        help_text="The top-level run this one came after (none for the first): runs form a tree of branches.")
    abandoned = models.BooleanField(
        default=False, help_text="On a branch the session has left (regenerated, edited, switched away): kept.")
    step_name = models.CharField(max_length=200, blank=True, help_text="The workflow step or team member it ran as.")
    component_id = models.CharField(max_length=128, blank=True)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.RUNNING)
    input = models.TextField(blank=True)
    content = models.TextField(blank=True, help_text="The reply; while running, the text so far.")
    content_type = models.CharField(max_length=64, default="str")
    error = models.TextField(blank=True)
    model_id = models.CharField(max_length=128, blank=True)
    metrics = models.JSONField(default=dict, blank=True)
    state_version = models.PositiveIntegerField(null=True, blank=True, help_text="State version at the end.")
    history_seqs = models.JSONField(
        null=True, blank=True, help_text="Seqs of earlier messages sent as history (store_history_messages)."
    )
    requirements = models.JSONField(
        null=True, blank=True,
        help_text="A run that waited for a person: each tool call it waited on, what was asked, and the answer "
                  "(confirmed or rejected, the note, the input, the result; when and by whom).")
    cancel_requested = models.BooleanField(default=False)
    claimed_until = models.DateTimeField(
        null=True, blank=True,
        help_text="A queued run: until when the process waiting to start it is known to be alive (renewed while "
                  "it waits); past it, any process may take the run over.")
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["session", "status", "-id"], name="run_history_idx")]

    def __str__(self) -> str:
        return f"{self.run_id} ({self.status})"


class Role(models.TextChoices):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class Message(models.Model):
    # Neither has an index of its own: the (session, seq) and (run, seq) indexes start with them.
    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="messages", db_index=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="messages", db_index=False)
    seq = models.BigIntegerField()
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    tool_calls = models.JSONField(null=True, blank=True, help_text="Assistant: [{id, name, arguments}].")
    tool_call_id = models.CharField(max_length=128, blank=True)
    tool_name = models.CharField(max_length=128, blank=True)
    tool_error = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["session", "seq"], name="message_session_seq_uniq")]
        indexes = [
            models.Index(fields=["run", "seq"], name="message_run_idx"),
            # A session's first system message at once (get_session_messages), however long the session;
            # one entry per run.
            models.Index(fields=["session", "seq"], condition=Q(role="system"), name="message_system_idx"),
        ]
        ordering = ["seq"]

    def __str__(self) -> str:
        return f"{self.role} #{self.seq}"


class StateChangeQuerySet(models.QuerySet):
    def on_current_branch(self):
        """The changes the session's current branch is made of: not those of abandoned runs (or of their steps
        and members), nor the resets that began a regenerate or an edit (they undo an abandoned run's changes,
        which are not listed). A switch between branches stays: it is what moved the state."""
        return (self.exclude(source__in=("branch:regenerate", "branch:edit"))
                .exclude(run__abandoned=True).exclude(run__parent_run__abandoned=True)
                .exclude(run__parent_run__parent_run__abandoned=True))


class StateChange(models.Model):
    # No index of its own: the (session, version) unique constraint starts with it.
    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="state_changes", db_index=False)
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="state_changes")
    version = models.PositiveIntegerField()
    patch = models.JSONField(help_text="RFC 6902 JSON Patch from the previous version to this one.")
    inverse = models.JSONField(help_text="RFC 6902 JSON Patch back to the previous version.")
    source = models.CharField(max_length=128, help_text="tool:<name>, agentic, run_input, defaults, manual, admin.")
    restores = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="A change back to an earlier version's state (a branch switch): that version. Its patch and "
                  "inverse are then empty.")
    created_at = models.DateTimeField(default=timezone.now)

    objects = StateChangeQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["session", "version"], name="statechange_session_version_uniq"),
            models.CheckConstraint(condition=~Q(version=0), name="statechange_version_positive"),
            models.CheckConstraint(condition=Q(restores__isnull=True) | Q(restores__lt=F("version")),
                                   name="statechange_restores_earlier"),
        ]
        ordering = ["version"]

    def __str__(self) -> str:
        return f"v{self.version} by {self.source}"


class AdminAccess(models.Model):
    """Someone looked at a user's conversation in Django admin: who, which session, what, when.

    Written by the admin pages that show a conversation's content or state (sessions_core/admin.py);
    kept when the admin account or the session goes (their names are copied)."""

    viewer = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    viewer_name = models.CharField(max_length=150)
    session = models.ForeignKey(ChatSession, null=True, on_delete=models.SET_NULL, related_name="+")
    session_label = models.CharField(max_length=128, help_text="The session's id, kept if it is deleted.")
    view = models.CharField(max_length=100, help_text='What was shown: "transcript, page 2", "run …".')
    at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "admin accesses"

    def __str__(self) -> str:
        return f"{self.viewer_name} read {self.view} of {self.session_label}"


class UserMemoryQuerySet(models.QuerySet):
    def for_user(self, user):
        """The one owner-scoped entry point of memories: those of `user`, a saved User or a user's pk.
        No user (or an unsaved one) has none: memories are never shared."""
        if isinstance(user, int):
            return self.filter(user_id=user)
        if user is None or user.pk is None:
            return self.none()
        return self.filter(user_id=user.pk)


class UserMemoryRecord(models.Model):
    """One fact about a user that outlives sessions (the public form is `user_memories.UserMemory`)."""

    memory_id = models.CharField(max_length=64, unique=True, default=new_id)
    # No index of its own: usermemory_user_idx starts with it.
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False)
    memory = models.TextField()
    topics = models.JSONField(default=list, blank=True)
    input = models.TextField(blank=True, help_text="The user message (or agentic task) it was made from.")
    agent_id = models.CharField(max_length=128, blank=True)
    team_id = models.CharField(max_length=128, blank=True)
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                            help_text="The run that made or last changed it (none: the user's own edit).")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = UserMemoryQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["user", "created_at", "id"], name="usermemory_user_idx")]
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return self.memory[:80]


class MemoryAction(models.TextChoices):
    ADDED = "added"
    UPDATED = "updated"
    DELETED = "deleted"


class UserMemoryChange(models.Model):
    """One change of a user's memory, kept after the memory is deleted: its history."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False)
    memory_id = models.CharField(max_length=64)
    action = models.CharField(max_length=16, choices=MemoryAction.choices)
    memory = models.TextField(blank=True, help_text="The text after the change (deleted: the text it had).")
    previous = models.TextField(blank=True, help_text="The text before an update.")
    topics = models.JSONField(default=list, blank=True)
    previous_topics = models.JSONField(default=list, blank=True)
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    source = models.CharField(max_length=32, help_text="run, agentic, user, undo, import.")
    created_at = models.DateTimeField(default=timezone.now)
    undone_at = models.DateTimeField(null=True, blank=True, help_text="A run's change its user undid (then).")

    objects = UserMemoryQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["user", "memory_id", "id"], name="memorychange_memory_idx")]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.action} {self.memory_id} by {self.source}"


class UserMemoryOptOut(models.Model):
    """A user who turned memories off: nothing is learnt about them and none is shown to a model."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
