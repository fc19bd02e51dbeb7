"""Who may touch a session: user ids, session ids, and the one owner check every engine path uses.

A user id names the Django user with that username (a `User` is taken as it is); no user means the
ownerless sessions of scripts. A session may be touched only by its owner, an ownerless one only
without a user: another user's session id is refused with `SessionOwnershipError` before anything
is read or written, and an ownerless session is never claimed by a later caller with a user.

`may_touch` is the decision; `owned_session`, the one lookup of a session by its id (accessors, history,
summaries, export, the run's start), asks it. `sessions_of` lists what a user may see.
A user's memories are scoped the same way: `memory_owner` names whose they are, and every read and
write of them goes through `UserMemoryRecord.objects.for_user` (user_memories/store.py).
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import connections
from django.contrib.auth.hashers import make_password

from .errors import SessionIdNotSetError, SessionNotFoundError, SessionOwnershipError
from .models import ChatSession

SESSION_ID_MAX = 128


def resolve_user(user_id, alias: str, create: bool = True):
    """A user id string names the Django user with that username, created on first use by a run.

    Readers pass create=False: an unknown name gets an unsaved user that owns nothing.
    """
    if user_id is None or user_id == "":
        return None
    if _is_user(user_id):
        return user_id if user_id.is_authenticated else None
    User = get_user_model()
    lookup = {User.USERNAME_FIELD: _valid_user_name(user_id)}
    if not create:
        return User.objects.db_manager(alias).filter(**lookup).first() or User(**lookup)
    user, _ = User.objects.db_manager(alias).get_or_create(**lookup, defaults={"password": make_password(None)})
    return user


def owner_known(user_ref) -> bool:
    """Whether `resolve_user` answers without the database: no user, or a User (saved, or anonymous)."""
    if user_ref is None or user_ref == "":
        return True
    return _is_user(user_ref) and (user_ref.pk is not None or not user_ref.is_authenticated)


def _valid_user_name(user_id) -> str:
    User = get_user_model()
    name, longest = str(user_id), User._meta.get_field(User.USERNAME_FIELD).max_length
    if len(name) > longest or not name.isprintable():  # else SQLite stores it and PostgreSQL refuses it
        raise ValueError(f"A user id must be 1 to {longest} printable characters.")
    return name


def user_label(user) -> str | None:
    """The user id a run reports: the username for a User, the string itself otherwise."""
    if user is None or user == "":
        return None
    return user.get_username() if _is_user(user) else str(user)


def validate_session_id(session_id) -> str:
    session_id = str(session_id)
    if not session_id or len(session_id) > SESSION_ID_MAX or not session_id.isprintable():
        raise ValueError(f"A session id must be 1 to {SESSION_ID_MAX} printable characters.")
    return session_id


def required_session_id(session_id, default=None) -> str:
    """The session an accessor works on: the one given, else the component's own; a clear error if neither."""
    session_id = session_id or default
    if not session_id:
        raise SessionIdNotSetError()
    return validate_session_id(session_id)


def may_touch(owner_id: int | None, owner_name: str | None, user_ref) -> bool:
    """Whether `user_ref` (a username, a User or None) may read or write a session of this owner."""
    if _is_user(user_ref) and not user_ref.is_authenticated:
        user_ref = None
    if user_ref is None or user_ref == "":
        return owner_id is None
    if owner_id is None:
        return False
    if _is_user(user_ref):
        return owner_id == user_ref.pk
    return owner_name == str(user_ref)


def check_owner(session_id: str, owner_id: int | None, owner_name: str | None, user_ref) -> None:
    if not may_touch(owner_id, owner_name, user_ref):
        raise SessionOwnershipError(session_id, user_label(user_ref))


def owned_session(session_id: str, user_ref, alias: str, *, lock: bool = False, must_exist: bool = True,
                  only: tuple[str, ...] = ()) -> ChatSession | None:
    """The session, if `user_ref` may touch it; SessionOwnershipError if it is someone else's.

    A session that does not exist raises SessionNotFoundError (or is None with must_exist=False).
    Blocking: call it in a database thread. `lock` takes the row lock (inside a transaction); `only`
    loads just those fields now (the others on first use, as `QuerySet.only`). Checked against a User
    of the same database, its `owner` is that User."""
    by_name = user_ref not in (None, "") and not _is_user(user_ref)
    if by_name:
        _valid_user_name(user_ref)
    sql = _session_sql(alias, only, by_name, lock)
    session = next(iter(ChatSession.objects.db_manager(alias).raw(sql, [session_id])), None)
    if session is None:
        if must_exist:
            raise SessionNotFoundError(session_id)
        return None
    check_owner(session_id, session.owner_id, session.owner_username if by_name else None, user_ref)
    if _is_user(user_ref) and session.owner_id is not None and user_ref._state.db == alias:
        session.owner = user_ref  # the owner just checked (a row of the same database): no query for it
    return session


def session_owner(session: ChatSession, user_ref):
    """The owner of a session `user_ref` was checked against (`check_owner`), as a User, with no query:
    the User given, or, for a username, a User with the session's owner id and that name."""
    if session.owner_id is None:
        return None
    if _is_user(user_ref):
        return user_ref
    return get_user_model()(pk=session.owner_id, **{get_user_model().USERNAME_FIELD: str(user_ref)})


def _session_sql(alias: str, only: tuple[str, ...], by_name: bool, lock: bool) -> str:
    """The one statement `owned_session` reads with: the session's row by its `session_id` (the fields
    `only` names, else all), with its owner's username as `owner_username` when the check compares
    names, locked FOR UPDATE on a database that has row locks (SQLite locks the whole database for
    the transaction instead). Written out, as Manager.raw() takes it: every run starts with it, and
    the ORM's building of it would cost more than the read."""
    connection, meta = connections[alias], ChatSession._meta
    quote, table = connection.ops.quote_name, connection.ops.quote_name(meta.db_table)
    fields = [meta.pk, *(meta.get_field(name) for name in ("owner_id", *only))] if only else meta.concrete_fields
    columns = [f"{table}.{quote(field.column)}" for field in fields]
    joins = ""
    if by_name:
        User = get_user_model()
        users = quote(User._meta.db_table)
        columns.append(f"{users}.{quote(User._meta.get_field(User.USERNAME_FIELD).column)} AS owner_username")
        joins = f" LEFT JOIN {users} ON {users}.{quote(User._meta.pk.column)} = {table}.{quote('owner_id')}"
    sql = f"SELECT {', '.join(columns)} FROM {table}{joins} WHERE {table}.{quote('session_id')} = %s"
    if lock and connection.features.has_select_for_update:
        sql += " " + connection.ops.for_update_sql(of=(table,))
    return sql


def memory_owner(user_ref, alias: str, create: bool = False):
    """Whose memories `user_ref` (a username, a User or None) reads and changes: the saved user, or None
    (no user, or a name no user has yet) whose memories are none. A run creates its user (`create`)."""
    user = resolve_user(user_ref, alias, create=create)
    return user if user is not None and user.pk is not None else None


def sessions_of(user_ref, alias: str):
    """The live sessions `user_ref` may list (a username, a User or None: the ownerless ones)."""
    user = resolve_user(user_ref, alias, create=False)
    if user is not None and user.pk is None:
        return ChatSession.objects.none()
    return ChatSession.objects.using(alias).for_user(user).alive()


def _is_user(value) -> bool:
    return hasattr(value, "pk") and hasattr(value, "get_username")
