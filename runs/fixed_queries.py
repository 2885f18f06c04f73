"""Queries of a fixed shape, compiled to SQL once per process.

Django builds and compiles a queryset anew on every call: for the worker's
claim and finish, whose queries lock rows and carry subqueries, that was most
of the CPU a run spends outside the graph. A FixedQuery keeps the queryset as
the one definition of the query (select_related, annotations, locks and all),
compiles it the first time, and afterwards only fills in its arguments and
builds the model instances from the rows, as Django's ModelIterable does.
save_fields does the same for `save(update_fields=...)`; update_statement and
insert_statement give a write to run in a statement of the caller's. None of
them skips a model's own save() or its pre_save/post_save receivers: where
there are any, Model.save writes the row.

Queries name their database alias (`using`); DATABASE_ROUTERS are not asked
(none is configured).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    IntegrityError,
    connections,
    transaction,
)
from django.db.models import Field, Model, QuerySet, sql
from django.db.models.constants import OnConflict
from django.db.models.query import get_related_populators
from django.db.models.signals import post_save, pre_save
from django.db.transaction import TransactionManagementError


@dataclass(frozen=True)
class _Compiled:
    sql: str
    params: tuple
    # For each argument, the positions of the parameters it fills.
    slots: tuple[tuple[int, ...], ...]
    compiler: Any
    converters: dict
    model: type[Model]
    init_list: list[str]
    model_columns: slice
    related_populators: list
    annotation_col_map: dict[str, int]
    locks: bool


class FixedQuery:
    """`build(*arguments)`: the queryset, of models, whose shape no argument
    changes. `samples`: one value per argument, of the type the compiled
    query's parameters hold (a UUID for a UUID key) and that no call passes:
    how the first compilation finds where each argument goes.

    One instance serves every thread of a process (the web tier's request
    threads too): what it keeps per alias is compiled once, under a lock,
    and only read after, and each call runs on its own thread's connection.
    The kept compiler holds the connection of the thread that compiled it
    and passes it to the result converters; that is safe while no
    converter uses it for anything but the vendor's features (none of
    Django's or ours does on Postgres), which a converter that queries
    would have to change. An argument goes in as given (a plain int where
    Django sends an int8): psycopg types it by its size, so a query may be
    prepared once per integer width."""

    def __init__(self, build: Callable[..., QuerySet], *samples: Any) -> None:
        self.build = build
        self.samples = samples
        # By alias and vendor: an alias whose settings change in-process (a
        # test's override) must not run SQL compiled for another database (a
        # lock compiled on SQLite has no FOR NO KEY UPDATE).
        self._compiled: dict[tuple[str, str], _Compiled] = {}
        self._lock = threading.Lock()

    def _compile(self, using: str) -> _Compiled:
        queryset = self.build(*self.samples).using(using)
        compiler = queryset.query.get_compiler(using=using)
        sql, params = compiler.as_sql()
        connection = connections[using]
        slots = tuple(
            tuple(
                i
                for i, param in enumerate(params)
                if param == _db_value(sample, connection)
            )
            for sample in self.samples
        )
        if not all(slots):
            raise ValueError("an argument of the query is not among its parameters")
        select, klass_info = compiler.select, compiler.klass_info
        first, last = klass_info["select_fields"][0], klass_info["select_fields"][-1]
        return _Compiled(
            sql=sql,
            params=tuple(params),
            slots=slots,
            compiler=compiler,
            converters=compiler.get_converters(
                [column[0] for column in select[0 : compiler.col_count]]
            ),
            model=klass_info["model"],
            init_list=[column[0].target.attname for column in select[first : last + 1]],
            model_columns=slice(first, last + 1),
            related_populators=get_related_populators(klass_info, select, using),
            annotation_col_map=dict(compiler.annotation_col_map or {}),
            locks=bool(queryset.query.select_for_update),
        )

    def _compiled_for(self, using: str) -> _Compiled:
        key = (using, connections[using].vendor)
        compiled = self._compiled.get(key)
        if compiled is None:
            with self._lock:
                compiled = self._compiled.get(key) or self._compile(using)
                self._compiled[key] = compiled
        return compiled

    def _params(self, compiled: _Compiled, arguments: tuple, connection) -> list:
        params = list(compiled.params)
        for slot, sample, argument in zip(
            compiled.slots, self.samples, arguments, strict=True
        ):
            if type(argument) is not type(sample):
                raise TypeError(
                    f"expected {type(sample).__name__}, got {type(argument).__name__}"
                )
            for position in slot:
                params[position] = _db_value(argument, connection)
        return params

    def statement(
        self, *arguments: Any, using: str = DEFAULT_DB_ALIAS
    ) -> tuple[str, list]:
        """The query's SQL and parameters, for a caller that runs it inside a
        statement of its own (a condition of a write)."""
        compiled = self._compiled_for(using)
        return compiled.sql, self._params(compiled, arguments, connections[using])

    def _checked_params(self, compiled: _Compiled, arguments: tuple, connection):
        params = self._params(compiled, arguments, connection)
        if compiled.locks and connection.get_autocommit():
            # What Django's compiler says of a lock outside a transaction.
            raise TransactionManagementError(
                "select_for_update cannot be used outside of a transaction."
            )
        return params

    def __call__(self, *arguments: Any, using: str = DEFAULT_DB_ALIAS) -> list:
        connection = connections[using]
        compiled = self._compiled_for(using)
        params = self._checked_params(compiled, arguments, connection)
        with connection.cursor() as cursor:
            cursor.execute(compiled.sql, params)
            rows = cursor.fetchall()
        return self._objects(compiled, rows, using)

    def objects(self, rows: list[tuple], *, using: str = DEFAULT_DB_ALIAS) -> list:
        """The objects of the rows `statement()` returned, run by the caller
        (with other statements: runs.checkpointer's latest_after), in text
        format as a Django cursor returns them: what calling the query answers."""
        return self._objects(self._compiled_for(using), rows, using)

    @staticmethod
    def _objects(compiled: _Compiled, rows: list[tuple], using: str) -> list:
        if compiled.converters:
            rows = compiled.compiler.apply_converters(rows, compiled.converters)
        objects = []
        for row in rows:
            obj = compiled.model.from_db(
                using, compiled.init_list, row[compiled.model_columns]
            )
            for populator in compiled.related_populators:
                populator.populate(row, obj)
            for name, position in compiled.annotation_col_map.items():
                setattr(obj, name, row[position])
            objects.append(obj)
        return objects


def together(
    *calls: tuple[FixedQuery, tuple], using: str = DEFAULT_DB_ALIAS
) -> list[list]:
    """What each call (a query and its arguments) answers, their statements
    run in order, each with its own snapshot, as one by one; on Postgres in
    one round trip (a pipeline: one Sync), through Django's cursors (logged,
    their errors raised as Django's). A statement after a lock runs once the
    lock is taken: it sees what the lock's previous holder committed."""
    connection = connections[using]
    compiled = [query._compiled_for(using) for query, _ in calls]
    params = [
        query._checked_params(each, arguments, connection)
        for (query, arguments), each in zip(calls, compiled, strict=True)
    ]
    if connection.vendor != "postgresql":
        return [query(*arguments, using=using) for query, arguments in calls]
    with connection.cursor() as first:
        pgconn = connection.connection
        cursors = [first, *(connection.cursor() for _ in calls[1:])]
        try:
            with connection.wrap_database_errors:
                with pgconn.pipeline():
                    for cursor, each, values in zip(cursors, compiled, params, strict=True):
                        cursor.execute(each.sql, values)
                rows = [cursor.fetchall() for cursor in cursors]
        finally:
            for cursor in cursors[1:]:
                cursor.close()
    return [
        FixedQuery._objects(each, answer, using)
        for each, answer in zip(compiled, rows, strict=True)
    ]


def _db_value(value: Any, connection) -> Any:
    """`value` as the compiler puts it among a query's parameters: Django
    sends a UUID as its hex string to a database without a uuid type
    (SQLite, the embedded mode)."""
    if isinstance(value, uuid.UUID) and not connection.features.has_native_uuid_field:
        return value.hex
    return value


def save_fields(
    obj: Model, fields: Sequence[str], *, using: str = DEFAULT_DB_ALIAS
) -> None:
    """`obj.save(update_fields=fields)`, its UPDATE built once per process for
    the model and the fields (Django builds, filters and compiles it on every
    save). The same statement and values as Model.save: each field's
    pre_save (auto_now), its prepared value, and the error of a row gone.
    Model.save itself whenever something listens to the model's pre_save or
    post_save, the model overrides save() (its own rules are never skipped),
    or a value is an expression."""
    statement = _prepared_update(obj, fields, using)
    if statement is None:
        obj.save(update_fields=fields, using=using)
        return
    sql, params = statement
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        if cursor.rowcount == 0:
            raise row_gone()


def row_gone() -> DatabaseError:
    """The error of a save that found no row, worded as Model.save's."""
    return DatabaseError("Save with update_fields did not affect any rows.")


def update_statement(
    obj: Model,
    fields: Sequence[str],
    *,
    where: tuple[str, Sequence[Any]] = ("", ()),
    using: str = DEFAULT_DB_ALIAS,
) -> tuple[str, list[Any]] | None:
    """The UPDATE (SQL and parameters) that save_fields runs, for a caller
    that runs it as part of a statement of its own (audit.services.
    record_with_write): `RETURNING 1`, so that the statement sees whether
    it found the row; `where`, a condition (SQL and its parameters) the
    row must meet as well. None where only Model.save may save the fields
    (see save_fields). Calls the fields' pre_save, as saving does."""
    statement = _prepared_update(obj, fields, using)
    if statement is None:
        return None
    sql, params = statement
    condition, condition_params = where
    if condition:
        return f"{sql} AND ({condition}) RETURNING 1", [*params, *condition_params]
    return f"{sql} RETURNING 1", params


def insert_statement(
    obj: Model, *, ignore_conflicts: bool = False, using: str = DEFAULT_DB_ALIAS
) -> tuple[str, list[Any]] | None:
    """The INSERT of the new row `obj`, `RETURNING` its primary key, for a
    caller that runs it as part of a statement of its own
    (audit.services.record_with_write). The fields' pre_save run, as saving
    does. None where only Model.save may insert the row (see save_fields):
    the caller then calls save_new. A primary key the database assigns (an
    auto field) is left out, as Model.save does; the caller sets it from the
    row returned.

    `ignore_conflicts`: `ON CONFLICT DO NOTHING`, so that no row returned
    means a row with the same unique key is there already, and nothing was
    written: one statement where catching the unique violation would cost a
    savepoint and its release. Like the plain insert, it waits for a
    concurrent transaction inserting the same key, and then sees its row."""
    model = type(obj)
    if _saved_by_model_save(model):
        return None
    connection = connections[using]
    meta = model._meta
    with_pk = obj.pk is not None
    fields = [
        field
        for field in meta.local_concrete_fields
        if with_pk or field is not meta.auto_field
    ]
    key = (model, with_pk, ignore_conflicts, connection.vendor)
    sql = _INSERTS.get(key)
    if sql and not _expressions(getattr(obj, field.attname) for field in fields):
        values = [field.pre_save(obj, True) for field in fields]
        if not _expressions(values):
            params = [
                field.get_db_prep_save(value, connection)
                for field, value in zip(fields, values, strict=True)
            ]
            return sql, params
    # Compiled by Django: an expression (a database default, say) is part of
    # the SQL. Kept for rows of the model to come if this row's values are
    # all plain parameters.
    plain = not _expressions(getattr(obj, field.attname) for field in fields)
    statement, params = _compiled_insert(obj, fields, ignore_conflicts, using)
    if sql is None and plain:
        fixed = all(_plain(field, connection) for field in fields)
        _INSERTS[key] = statement if fixed else ""
    return statement, params


# The INSERT of a model's row by (model, with its primary key, ignoring
# conflicts, vendor), compiled once: "" for one Django compiles for each row.
_INSERTS: dict[tuple, str] = {}


def _expressions(values) -> bool:
    return any(hasattr(value, "resolve_expression") for value in values)


def _compiled_insert(
    obj: Model, fields: list[Field], ignore_conflicts: bool, using: str
) -> tuple[str, list[Any]]:
    """The INSERT as Django's compiler writes it for `obj` (running the
    fields' pre_save)."""
    meta = type(obj)._meta
    query = sql.InsertQuery(
        type(obj), on_conflict=OnConflict.IGNORE if ignore_conflicts else None
    )
    query.insert_values(fields, [obj])
    compiler = query.get_compiler(using=using)
    compiler.returning_fields = [meta.pk]
    [(statement, params)] = compiler.as_sql()
    return statement, list(params)


def _plain(field: Field, connection) -> bool:
    """Whether the field's value goes in as one `%s` parameter (BinaryField
    asks the database's operations: "%s" on ours)."""
    placeholder = getattr(field, "get_placeholder", None)
    return placeholder is None or placeholder(None, None, connection) == "%s"


def inserted(obj: Model, *, using: str = DEFAULT_DB_ALIAS) -> None:
    """Mark `obj` saved, as Model.save does, once its insert_statement ran."""
    obj._state.adding, obj._state.db = False, using


def save_new(
    obj: Model, *, ignore_conflicts: bool = False, using: str = DEFAULT_DB_ALIAS
) -> bool:
    """Insert `obj` through Model.save (`force_insert`), where its
    insert_statement is None; the caller records the row's event after it,
    in the same transaction. `ignore_conflicts`: as the statement's
    `ON CONFLICT DO NOTHING`, False if a row with the same unique key is
    there already and nothing was written (the insert in a savepoint, rolled
    back, and no post_save); any other violation, another table's key broken
    by a post_save receiver's write, is raised (_key_taken)."""
    if not ignore_conflicts:
        obj.save(force_insert=True, using=using)
        return True
    try:
        with transaction.atomic(using=using):
            obj.save(force_insert=True, using=using)
    except IntegrityError as error:
        if not _key_taken(error, type(obj)):
            raise
        return False
    return True


def _key_taken(error: IntegrityError, model: type[Model]) -> bool:
    """The violation `ON CONFLICT DO NOTHING` would have ignored: a unique
    key's (a primary key's too) or an exclusion constraint's, on the model's
    own table (or a parent's, which its save inserts into too). One raised
    by another table's write in the same savepoint (a post_save receiver's)
    is not this row's key being there: the caller re-raises it."""
    tables = {m._meta.db_table for m in (model, *model._meta.get_parent_list())}
    cause = error.__cause__
    if getattr(cause, "sqlstate", None) in ("23505", "23P01"):
        return cause.diag.table_name in tables
    if getattr(cause, "sqlite_errorname", None) in (
        "SQLITE_CONSTRAINT_UNIQUE",
        "SQLITE_CONSTRAINT_PRIMARYKEY",
    ):
        return _sqlite_violation_on(str(cause), model, tables)
    return False


def _sqlite_violation_on(message: str, model: type[Model], tables: set[str]) -> bool:
    """Whether SQLite's unique violation is on `tables`. SQLite names no
    table apart from its message: "UNIQUE constraint failed: table.column,
    table.column" for a key of columns, "UNIQUE constraint failed: index
    'name'" for one of expressions, whose name is then one of the model's
    (or its parents') constraints. Anything else is not counted."""
    _, _, failed = message.partition("constraint failed: ")
    if failed.startswith("index '") and failed.endswith("'"):
        names = {
            constraint.name
            for m in (model, *model._meta.get_parent_list())
            for constraint in m._meta.constraints
        }
        return failed[len("index '") : -1] in names
    columns = [column.strip() for column in failed.split(",") if column.strip()]
    return bool(columns) and all(
        column.rpartition(".")[0] in tables for column in columns
    )


def _saved_by_model_save(model: type[Model]) -> bool:
    """Whether only Model.save may write the model's rows: the model
    overrides save() (its own rules, a guard or a validation added later,
    are never skipped) or something listens to its pre_save or post_save.
    The statements of this module then stand aside (save_fields,
    update_statement, insert_statement)."""
    return (
        model.save is not Model.save
        or pre_save.has_listeners(model)
        or post_save.has_listeners(model)
    )


def _prepared_update(
    obj: Model, fields: Sequence[str], using: str
) -> tuple[str, list[Any]] | None:
    model = type(obj)
    connection = connections[using]
    statement = _UPDATES.get((model, tuple(fields), connection.vendor))
    if statement is None:
        statement = _update_statement(model, tuple(fields), using)
    sql, targets = statement
    if not sql or obj._state.adding or _saved_by_model_save(model):
        return None
    values = [field.pre_save(obj, False) for field in targets]
    if any(hasattr(value, "resolve_expression") for value in values):
        return None
    params = [
        field.get_db_prep_save(value, connection)
        for field, value in zip(targets, values, strict=True)
    ]
    params.append(model._meta.pk.get_db_prep_value(obj.pk, connection))
    return sql, params


_UPDATES: dict[tuple, tuple[str, tuple[Field, ...]]] = {}


def _update_statement(
    model: type[Model], fields: tuple[str, ...], using: str
) -> tuple[str, tuple[Field, ...]]:
    """The UPDATE of `fields` by primary key; no SQL for a field Model.save
    treats otherwise (a relation, a placeholder of its own, not a column)."""
    connection = connections[using]
    meta = model._meta
    targets = tuple(meta.get_field(name) for name in fields)
    sql = ""
    if all(
        field.concrete
        and not field.primary_key
        and not field.is_relation
        and _plain(field, connection)
        for field in targets
    ):
        quote = connection.ops.quote_name
        assignments = ", ".join(f"{quote(field.column)} = %s" for field in targets)
        sql = (
            f"UPDATE {quote(meta.db_table)} SET {assignments} "
            f"WHERE {quote(meta.pk.column)} = %s"
        )
    _UPDATES[(model, fields, connection.vendor)] = (sql, targets)
    return sql, targets
