"""The run path's inserts and updates, each one statement through Django's cursor.

A run's start and finish write a handful of rows (the run, its messages, its state changes, the
session's lease) and move statuses with conditional UPDATEs. The ORM would build each of those
statements anew on every run, and on this path building them costs several times what running them
does (bench/README.md has the figures). So these two functions write the statement themselves,
from the model's own metadata: the table and column names from `_meta`, every value prepared by its
field (`get_db_prep_save`, as `save()` and `bulk_create()` prepare it), `%s` placeholders. The
statements are plain SQL both databases run (`RETURNING` included); they run inside the caller's
`transaction.atomic()` on Django's cursor, so query logging and `CaptureQueriesContext` see them.
Reads, and every write off the run path, use the ORM.
"""

from __future__ import annotations

from django.db import connections
from django.db.models import Model


def insert(objs: list[Model], alias: str, *, returning_pk: bool = False) -> None:
    """INSERT unsaved instances of one model in one statement; with `returning_pk`, set their pks."""
    if not objs:
        return
    model, connection = type(objs[0]), connections[alias]
    meta, quote = model._meta, connection.ops.quote_name
    fields = [field for field in meta.local_concrete_fields if not field.primary_key]
    params = []
    for obj in objs:
        params.extend(field.get_db_prep_save(field.pre_save(obj, True), connection) for field in fields)
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    sql = (f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(field.column) for field in fields)}) "
           f"VALUES {', '.join([row] * len(objs))}")
    with connection.cursor() as cursor:
        if not returning_pk:
            cursor.execute(sql, params)
            return
        cursor.execute(f"{sql} RETURNING {quote(meta.pk.column)}", params)
        for obj, (pk,) in zip(objs, cursor.fetchall(), strict=True):
            obj.pk = pk
            obj._state.adding, obj._state.db = False, alias


def update(model: type[Model], alias: str, where: dict, **values) -> int:
    """UPDATE the rows of `model` matching `where` ({field name: value, or a tuple of values for IN});
    how many rows it changed."""
    connection = connections[alias]
    meta, quote = model._meta, connection.ops.quote_name
    assignments, params = [], []
    for name, value in values.items():
        field = meta.get_field(name)
        if value is None:  # as the ORM writes it
            assignments.append(f"{quote(field.column)} = NULL")
            continue
        assignments.append(f"{quote(field.column)} = %s")
        params.append(field.get_db_prep_save(value, connection))
    conditions = []
    for name, value in where.items():
        field = meta.pk if name == "pk" else meta.get_field(name)
        column = quote(field.column)
        if value is None:
            conditions.append(f"{column} IS NULL")
        elif isinstance(value, tuple):
            if not value:  # IN () matches nothing (and is not SQL)
                return 0
            conditions.append(f"{column} IN ({', '.join(['%s'] * len(value))})")
            params.extend(field.get_db_prep_value(item, connection) for item in value)
        else:
            conditions.append(f"{column} = %s")
            params.append(field.get_db_prep_value(value, connection))
    sql = f"UPDATE {quote(meta.db_table)} SET {', '.join(assignments)} WHERE {' AND '.join(conditions)}"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount
