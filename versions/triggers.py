"""The database raises an area's version in every transaction that writes one of its tables.

The areas (``ORDER``, ``AREAS``, ``BY_MODEL``): the ``fleet`` (the catalog's GPU classes, nodes and
cards), the ``models`` (models, profiles, the engines' default releases), the ``placement`` (the
cards replicas hold), the ``replicas`` (their states), the
``operations`` (restarts, their steps, each agent's contact), the ``readings`` (telemetry's
readings and samples) and the ``audit`` log (its entries: the history panels). A cached answer is kept under the versions of the areas it
reads (``versions/cache.py``); a write to any of their tables, by the services or by raw SQL
behind the application's back, gives the next reader another key.

**Why the number can be trusted.** The counter is a row, raised in the writing transaction
itself, so it becomes visible at the same instant as the data: a reader that sees version V sees
every write that V counts. A reader reads the versions first and the data after (each statement
its own snapshot, READ COMMITTED, outside any transaction: ``cache.py`` refuses to keep or use an
answer inside one), so the data it reads is at least as new as V: perhaps newer, never older.
What it keeps under V is then what V's state gives or something newer, and once anything newer
commits, V is no longer what anyone reads. A PostgreSQL sequence would not do: ``nextval`` is
not transactional, so a reader could see the new number before the writer's data commits and
keep the old data under it.

**Where the counter row is locked, and what it costs.** Raising a row locks it until the
transaction ends. Raised at each write statement, the row would be a lock every writing
transaction takes at its first write and holds to its end; the services also take the audit
chain's advisory lock midway (at their first audit entry), and two locks taken in either order by
different transactions deadlock (T1 writes a catalog row then wants the chain's lock, T2 holds the
chain's lock and writes a catalog row). So on PostgreSQL each write statement only *notes* its
area (a statement-level trigger sets a transaction-local setting, and queues one row in
``versions_pending`` the first time); a deferred constraint trigger on that row raises the noted
counters, in a fixed order, when the transaction commits: after every other lock it takes, so
nothing waits while holding a counter, and no two transactions take counters in different
orders. What remains is that committing writers of one area queue on its row for the time of a
commit (an UPDATE of one row and the commit's WAL flush, well under a millisecond to a few
on a busy disk): at the telemetry sampler's rate (a thousand nodes every 15 s, eight at a time,
about 70 transactions a second) or a restart's heartbeats (one every 5 s a restart) that is a
small share of one row's time. Audit appends are serialised by the chain's own advisory lock
already, so their counter adds no queue of its own. The areas are separate counters for what they invalidate rather
than for the locks: the sampler writes readings all the time, and were it one counter, every
cached answer would be thrown away every few milliseconds while it runs; kept apart, only the
answers that show readings are.

On SQLite a row trigger on every table raises the counter at once: it has one writer at a time,
so there is no one to deadlock with, and the write and its counter commit together.

A tracked table made later needs these triggers in a migration of its own (``install`` is
idempotent: ``migrations.RunPython(triggers.install, migrations.RunPython.noop)``);
``tests/versions/test_versions.py`` fails for a table without them. A tracked table renamed keeps its
triggers on both databases; on SQLite their names, which say the table's, are made to follow by
``name_sqlite_triggers_after_their_tables`` (audit/migrations/0006, operations/migrations/0006).
On SQLite Django alters a table by making it anew, which drops its triggers; ``repair_sqlite``
puts them back after every migrate.
"""

from __future__ import annotations

from typing import Any, NamedTuple

# The areas, in the order counters are taken at commit (PostgreSQL), and which tables raise each.
# What changes often is kept apart from what changes rarely, so that a write throws away only the
# kept answers that show what it wrote:
#   fleet       the hardware: GPU classes, nodes, cards (an editor's edits; a node's state, its agent's
#               reachability and facts, which change when a node does)
#   models      what is served: models, profiles, the engines' default releases (an editor's edits,
#               a resize, a context change, an upgrade)
#   names       of those, only the models' and profiles' names and which model each profile is of,
#               and their rows made or deleted (column triggers: ``NAMED``): what the pages that
#               name models and show nothing else of them are kept under
#   placement   which cards each replica holds (shards: written when a replica starts, moves or ends)
#   replicas    replicas: their states (they change every few seconds in a restart)
#   operations  restarts, their steps, each agent's last contact (the reconciler's every pass)
#   readings    telemetry: node and card readings and samples (the sampler's every round)
#   audit       the log's entries (the history panels)
#   access      users, groups and their permissions (each signed-in user's permissions, kept)
FLEET, MODELS, REPLICAS, OPERATIONS, READINGS, AUDIT = (
    "fleet",
    "models",
    "replicas",
    "operations",
    "readings",
    "audit",
)
PLACEMENT, ACCESS, NAMES = "placement", "access", "names"
ORDER = (FLEET, MODELS, NAMES, PLACEMENT, REPLICAS, OPERATIONS, READINGS, AUDIT, ACCESS)
# A name for several areas at once, which a kept answer may give in their place: the catalog's
# ``structure`` is its fleet and its models (one area until the nodes pages and the dry runs needed
# a model's edit not to throw away what shows only the hardware, and the reverse).
ALIASES = {"structure": (FLEET, MODELS)}
# Each app whose tables count, and the area its tables raise unless ``BY_MODEL`` says otherwise.
AREAS = {
    "catalog": MODELS,
    "operations": OPERATIONS,
    "telemetry": READINGS,
    "audit": AUDIT,
    "auth": ACCESS,
}
BY_MODEL = {
    ("catalog", "gpuclass"): FLEET,
    ("catalog", "node"): FLEET,
    ("catalog", "card"): FLEET,
    ("catalog", "replica"): REPLICAS,
    ("catalog", "shard"): PLACEMENT,
}
# Of an app, only these models count (else all): of the audit app, the log, which the pages'
# history panels read; not the row changes, which the database writes beside every catalog write
# and no kept answer reads.
ONLY = {"audit": {"auditentry"}}


class ColumnTrigger(NamedTuple):
    """A trigger that raises ``area`` when some columns of a table are written (and, with ``rows``,
    when a row is made or deleted): for an area narrower than its table's."""

    # The trigger's name (PostgreSQL; SQLite adds the table, and the operation but UPDATE's). Not
    # TRIGGER's followed by a table and an operation: ``name_sqlite_triggers_after_their_tables``
    # would take it for a table's own and rename it.
    name: str
    model: tuple[str, str]
    fields: tuple[str, ...]
    area: str
    rows: bool = False


# A replica's columns that say who holds its cards (its name, its profile, its group's rendezvous port)
# raise the placement's version too, whoever writes them: the answers that show the cards' holders and
# not the replicas' states (the nodes' summary, the compact grid) are kept under the placement's, and
# a state's change, the runner's every few seconds (``save(update_fields=...)``), writes none of them.
HOLDER = ColumnTrigger(
    "versions_touch_holder", ("catalog", "replica"), ("name", "profile", "rendezvous_port"), PLACEMENT
)
HOLDER_TRIGGER = HOLDER.name
# A model's name, a profile's name and model, and their rows made or deleted raise the names' version
# (besides the models'): the answers that name models and profiles and show nothing else of them (the
# operations, the compact grid, the nodes' summary) are kept through a model's other edits.
NAMED = (
    ColumnTrigger("versions_names", ("catalog", "servedmodel"), ("name",), NAMES, rows=True),
    ColumnTrigger("versions_names", ("catalog", "profile"), ("name", "model"), NAMES, rows=True),
)
TRIGGER = "versions_touch"  # the trigger's name on each table (PostgreSQL; SQLite adds the table and op)

PG_FUNCTIONS = """
CREATE TABLE IF NOT EXISTS versions_pending (txid bigint NOT NULL);

CREATE OR REPLACE FUNCTION versions_touch() RETURNS trigger
SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    -- Note the area for this transaction (set_config's third argument: until it ends).
    PERFORM set_config('llmgw.versions_touched_' || TG_ARGV[0], '1', true);
    IF coalesce(current_setting('llmgw.versions_pending', true), '') = '' THEN
        INSERT INTO versions_pending (txid) VALUES (txid_current());
        PERFORM set_config('llmgw.versions_pending', '1', true);
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION versions_bump() RETURNS trigger
SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    a text;
BEGIN
    FOREACH a IN ARRAY ARRAY[{areas}] LOOP  -- always in this order
        IF coalesce(current_setting('llmgw.versions_touched_' || a, true), '') = '1' THEN
            INSERT INTO versions_version (area, n, born) VALUES (a, 1, (random() * 9e15)::bigint)
            ON CONFLICT (area) DO UPDATE SET n = versions_version.n + 1;
            PERFORM set_config('llmgw.versions_touched_' || a, '', true);
        END IF;
    END LOOP;
    DELETE FROM versions_pending WHERE txid = NEW.txid;
    PERFORM set_config('llmgw.versions_pending', '', true);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS versions_bump ON versions_pending;
CREATE CONSTRAINT TRIGGER versions_bump AFTER INSERT ON versions_pending
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION versions_bump();
"""

PG_DROP = """
DROP TRIGGER IF EXISTS versions_bump ON versions_pending;
DROP TABLE IF EXISTS versions_pending;
DROP FUNCTION IF EXISTS versions_bump();
DROP FUNCTION IF EXISTS versions_touch();
"""

# No conflict clause inside (INSERT OR IGNORE): SQLite lets the firing statement's own clause
# (an upsert's ON CONFLICT) override a trigger's, and the counter's insert then failed.
SQLITE_TRIGGER = """
CREATE TRIGGER {name} AFTER {op} ON {table} BEGIN
    INSERT INTO versions_version (area, n, born)
        SELECT '{area}', 0, random() WHERE NOT EXISTS (SELECT 1 FROM versions_version WHERE area = '{area}');
    UPDATE versions_version SET n = n + 1 WHERE area = '{area}';
END;
"""
SQLITE_OPS = ("INSERT", "UPDATE", "DELETE")


def tracked_tables(
    apps: Any, areas: dict[str, str] | None = None, by_model: dict[tuple[str, str], str] | None = None
) -> dict[str, str]:
    """Each table whose writes raise a version, and its area, from the apps' models."""
    areas = AREAS if areas is None else areas
    by_model = BY_MODEL if by_model is None else by_model
    out = {}
    for label, area in areas.items():
        if label not in apps.app_configs:
            continue
        # Many-to-many tables too (a user's groups, a group's permissions).
        for model in apps.get_app_config(label).get_models(include_auto_created=True):
            if label in ONLY and model._meta.model_name not in ONLY[label]:
                continue
            if not model._meta.proxy and model._meta.managed:
                out[model._meta.db_table] = by_model.get((label, model._meta.model_name), area)
    return dict(sorted(out.items()))


def sqlite_trigger_name(table: str, op: str) -> str:
    return f"{TRIGGER}_{table}_{op.lower()}"


def install(apps: Any, schema_editor: Any) -> None:
    """The triggers on every tracked table, and the areas' rows: idempotent."""
    install_areas(apps, schema_editor, AREAS, BY_MODEL, ORDER)
    for trigger in (HOLDER, *NAMED):
        install_column_trigger(trigger, apps, schema_editor)


def trigger_columns(trigger: ColumnTrigger, apps: Any) -> tuple[str, list[str]] | None:
    """The trigger's table and columns as this state of the models has them (an earlier migration's
    may lack some), or None before the table."""
    try:
        model = apps.get_model(*trigger.model)
    except LookupError:
        return None
    present = {f.name: f.column for f in model._meta.concrete_fields}
    return model._meta.db_table, [present[f] for f in trigger.fields if f in present]


def _sqlite_column_triggers(trigger: ColumnTrigger, table: str, columns: list[str]) -> dict[str, str]:
    """Each SQLite trigger's name and what it fires on."""
    out = {f"{trigger.name}_{table}": f"UPDATE OF {', '.join(columns)}"}
    if trigger.rows:
        out.update({f"{trigger.name}_{table}_{op.lower()}": op for op in ("INSERT", "DELETE")})
    return out


def install_column_trigger(trigger: ColumnTrigger, apps: Any, schema_editor: Any) -> None:
    """The trigger made anew (dropped first: idempotent)."""
    found = trigger_columns(trigger, apps)
    if found is None:
        return
    uninstall_column_trigger(trigger, apps, schema_editor)
    table, columns = found
    if schema_editor.connection.vendor == "postgresql":
        on = ("INSERT OR DELETE OR " if trigger.rows else "") + f"UPDATE OF {', '.join(columns)}"
        schema_editor.execute(
            f"CREATE TRIGGER {trigger.name} AFTER {on} ON {table} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION versions_touch('{trigger.area}');",
            params=None,
        )
    elif schema_editor.connection.vendor == "sqlite":
        for name, op in _sqlite_column_triggers(trigger, table, columns).items():
            schema_editor.execute(
                SQLITE_TRIGGER.format(name=name, op=op, table=table, area=trigger.area), params=None
            )


def uninstall_column_trigger(trigger: ColumnTrigger, apps: Any, schema_editor: Any) -> None:
    found = trigger_columns(trigger, apps)
    if found is None:
        return
    table, columns = found
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {trigger.name} ON {table};", params=None)
    elif schema_editor.connection.vendor == "sqlite":
        for name in _sqlite_column_triggers(trigger, table, columns):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}", params=None)


def install_holder(apps: Any, schema_editor: Any) -> None:
    """The trigger that raises the placement's version when a replica's holder columns are written."""
    install_column_trigger(HOLDER, apps, schema_editor)


def uninstall_holder(apps: Any, schema_editor: Any) -> None:
    uninstall_column_trigger(HOLDER, apps, schema_editor)


def uninstall_names(apps: Any, schema_editor: Any) -> None:
    for trigger in NAMED:
        uninstall_column_trigger(trigger, apps, schema_editor)


def install_areas(
    apps: Any, schema_editor: Any, app_areas: dict[str, str], by_model: dict[tuple[str, str], str], order: Any
) -> None:
    vendor = schema_editor.connection.vendor
    tables = tracked_tables(apps, app_areas, by_model)
    if vendor == "postgresql":
        areas = ", ".join(f"'{a}'" for a in order)
        schema_editor.execute(PG_FUNCTIONS.replace("{areas}", areas), params=None)
        for table, area in tables.items():
            schema_editor.execute(
                f"DROP TRIGGER IF EXISTS {TRIGGER} ON {table};"
                f"CREATE TRIGGER {TRIGGER} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table} "
                f"FOR EACH STATEMENT EXECUTE FUNCTION versions_touch('{area}');",
                params=None,
            )
        for area in order:
            schema_editor.execute(
                "INSERT INTO versions_version (area, n, born) VALUES (%s, 0, (random() * 9e15)::bigint) "
                "ON CONFLICT (area) DO NOTHING",
                params=[area],
            )
    elif vendor == "sqlite":
        for table, area in tables.items():
            for op in SQLITE_OPS:
                name = sqlite_trigger_name(table, op)
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}", params=None)
                schema_editor.execute(
                    SQLITE_TRIGGER.format(name=name, op=op, table=table, area=area), params=None
                )
        for area in order:
            schema_editor.execute(
                "INSERT OR IGNORE INTO versions_version (area, n, born) VALUES (%s, 0, random())",
                params=[area],
            )


def uninstall(apps: Any, schema_editor: Any) -> None:
    uninstall_holder(apps, schema_editor)
    uninstall_names(apps, schema_editor)
    vendor = schema_editor.connection.vendor
    tables = tracked_tables(apps)
    if vendor == "postgresql":
        for table in tables:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON {table};", params=None)
        schema_editor.execute(PG_DROP, params=None)
    elif vendor == "sqlite":
        for table in tables:
            for op in SQLITE_OPS:
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {sqlite_trigger_name(table, op)}", params=None)


def name_sqlite_triggers_after_their_tables(apps: Any, schema_editor: Any) -> None:
    """On SQLite, each version trigger named after the table it is on again, for a migration that renames
    a table to run after the rename (and, undone, after the name is given back). SQLite's ``ALTER TABLE
    ... RENAME`` moves a table's triggers to its new name but keeps the triggers' names, which name the
    old table; ``install`` and ``uninstall`` look for them by the table's name. On PostgreSQL every
    table's trigger is called ``TRIGGER``, named after no table: nothing to do."""
    if schema_editor.connection.vendor != "sqlite":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'trigger'")
        found = cursor.fetchall()
    for name, table, sql in found:
        for op in SQLITE_OPS:
            if not (name.startswith(f"{TRIGGER}_") and name.endswith(f"_{op.lower()}")):
                continue
            wanted = sqlite_trigger_name(table, op)
            if name != wanted:
                # The same trigger (SQLite has rewritten its table's name in it), under the right name.
                schema_editor.execute(f"DROP TRIGGER {name}", params=None)
                schema_editor.execute(sql.replace(name, wanted, 1), params=None)


def repair_sqlite(using: str = "default", **kwargs: Any) -> None:
    """After a migrate on SQLite: the triggers back on any table a migration made anew (post_migrate)."""
    from django.apps import apps
    from django.db import connections

    connection = connections[using]
    if connection.vendor != "sqlite" or "versions_version" not in connection.introspection.table_names():
        return
    present = set(connection.introspection.table_names())
    if not set(tracked_tables(apps)) <= present:
        return  # migrated only part of the way (a test of migrations): the last step installs them
    with connection.schema_editor() as editor:
        install(apps, editor)
