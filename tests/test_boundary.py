"""The typed Temporal boundary: handler names live in the tables of `api.contracts`, and nowhere else.

A running workflow is reached by its handlers' wire names, and its history records them, so a renamed handler
breaks every workflow in flight (docs/upgrades.md). Two checks keep the names in one place:

(a) each table's names are exactly the handlers of the workflow class it belongs to (temporalio's own view of
    the class), so a handler added, dropped or renamed without its table fails here;
(b) no source of the product or of the tests names a signal, query or update by a string literal: calls of the
    Temporal client and workflow APIs, the project's own signal helpers, and the handler decorators (which must
    take `name=` from a table). Each finding is reported as file:line.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path

import pytest
from temporalio.workflow import _Definition

from api import contracts as c
from workflows.registry import WORKFLOWS

ROOT = Path(__file__).resolve().parent.parent
SOURCES = (
    "api",
    "activities",
    "domain",
    "homelab_autoscaler",
    "kube",
    "provider",
    "watchers",
    "workflows",
    "sim/homelab_sim",
    "tests",
)
KINDS = ("signals", "updates", "queries")
TABLE_VALUES = {str(v) for tables in c.HANDLER_TABLES.values() for table in tables.values() for v in table}

# Temporal's calls that take a handler name first (or by these keywords).
TEMPORAL_CALLS = frozenset(
    {
        "signal",
        "query",
        "execute_update",
        "start_update",
        "execute_update_with_start_workflow",
        "start_update_with_start_workflow",
    }
)
NAME_KEYWORDS = frozenset({"signal", "query", "update", "start_signal"})
# The project's own senders (typed by the tables, which mypy enforces); a literal wire name passed to one is
# flagged too, for code mypy does not see or that gives up typing with a cast.
OWN_SENDERS = frozenset(
    {"send", "_signal", "signal_group", "signal_outcome", "claim", "release", "group", "update", "_query", "count"}
)
DECORATORS = frozenset({"signal", "query", "update"})
WIRE_NAMES = frozenset(str(name) for tables in c.HANDLER_TABLES.values() for table in tables.values() for name in table)


# --- (a) the tables are the handlers -------------------------------------------------------------------------
@pytest.mark.parametrize("cls", WORKFLOWS, ids=lambda cls: cls.__name__)
def test_every_table_name_is_a_handler_and_every_handler_is_in_a_table(cls: type) -> None:
    defn = _Definition.must_from_class(cls)
    assert defn.name in set(c.WorkflowName), f"{cls.__name__} is registered as {defn.name!r}, not from WorkflowName"
    tables = c.HANDLER_TABLES[c.WorkflowName(defn.name)]
    for kind in KINDS:
        declared = getattr(defn, kind)
        assert None not in declared, f"{cls.__name__} has a dynamic {kind[:-1]} handler: name it in a table"
        handlers = {str(n) for n in declared}
        table: type[StrEnum] | None = tables.get(kind)
        names = {str(n) for n in table} if table is not None else set()
        assert handlers == names, (
            f"{cls.__name__} {kind}: handlers without a table entry {sorted(handlers - names)}, "
            f"table entries without a handler {sorted(names - handlers)}"
        )


def test_every_registered_workflow_has_tables() -> None:
    registered = {_Definition.must_from_class(cls).name for cls in WORKFLOWS}
    assert registered == set(c.HANDLER_TABLES) == set(c.WorkflowName)


def test_wire_names_are_the_released_ones() -> None:
    """A value in a table is what running workflows and recorded histories know: it never changes. A new
    handler is added here and to its table; an existing line is never edited."""
    released = {
        "GroupWorkflow": {
            "claim_changed", "observe_slot", "refresh", "release_finished",
            "increase_size", "decrease_target_size", "delete_nodes", "wait_loaded",
            "target_size", "instances", "snapshot",
        },
        "NodeClaimWorkflow": {
            "observe", "job_finished", "mark_for_deletion", "superseded", "slot_deleted",
            "reset_shutdown_streak", "status", "digest",
            "status_edited",
        },
        "ReleaseWorkflow": {"observe", "job_finished", "abort", "reset_shutdown_streak"},
    }  # fmt: skip
    current = {str(wf): {str(n) for table in tables.values() for n in table} for wf, tables in c.HANDLER_TABLES.items()}
    assert current == released


# --- (b) no bare names ----------------------------------------------------------------------------------------
def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _is_handler_decorator(node: ast.AST) -> bool:
    """`@workflow.signal`, `@workflow.query(...)`, `@workflow.update(...)`."""
    target = node.func if isinstance(node, ast.Call) else node
    return (
        isinstance(target, ast.Attribute)
        and target.attr in DECORATORS
        and isinstance(target.value, ast.Name)
        and target.value.id == "workflow"
    )


def bare_handler_names(source: str, filename: str = "<snippet>") -> list[str]:
    """Every place in `source` that names a Temporal handler by a string instead of a table, as file:line."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for deco in node.decorator_list:
                if not _is_handler_decorator(deco):
                    continue
                name = (
                    next((k.value for k in deco.keywords if k.arg == "name"), None)
                    if isinstance(deco, ast.Call)
                    else None
                )
                # An async Update stays a bare decorator: the SDK types `update(name=...)` on an async method as
                # returning its coroutine, so callers would see the wrong type. Its wire name is then the method's
                # name, which test_every_table_name_is_a_handler... and the pinned wire names hold in place.
                async_update = (
                    isinstance(node, ast.AsyncFunctionDef)
                    and not isinstance(deco, ast.Call)
                    and (isinstance(deco, ast.Attribute) and deco.attr == "update" and node.name in TABLE_VALUES)
                )
                if async_update:
                    continue
                if name is None or _literal(name) is not None:
                    found.append(f"{filename}:{deco.lineno}: handler {node.name} takes no name= from a table")
        if not isinstance(node, ast.Call):
            continue
        callee = _callee(node)
        for kw in node.keywords:
            if kw.arg in NAME_KEYWORDS and (text := _literal(kw.value)) is not None:
                found.append(f"{filename}:{node.lineno}: {callee}({kw.arg}={text!r}) names a handler by a string")
        if callee in TEMPORAL_CALLS and node.args and (text := _literal(node.args[0])) is not None:
            found.append(f"{filename}:{node.lineno}: {callee}({text!r}) names a handler by a string")
        elif callee in OWN_SENDERS:
            for arg in node.args:
                if (text := _literal(arg)) in WIRE_NAMES:
                    found.append(f"{filename}:{node.lineno}: {callee}(..., {text!r}) names a handler by a string")
    return found


def _sources() -> Iterator[Path]:
    for top in SOURCES:
        yield from sorted((ROOT / top).rglob("*.py"))


def test_no_bare_handler_names_in_the_product_or_the_tests() -> None:
    files = list(_sources())
    assert len(files) > 50, "the scan found too few sources: has the layout changed?"
    found = [hit for path in files for hit in bare_handler_names(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, "handler names by string (use the tables in api/contracts.py):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "snippet",
    [
        'await handle.signal("refresh")',
        'await handle.signal("a_typo_no_table_has")',
        'await handle.execute_update("delete_nodes", ["s1"], result_type=int)',
        'await handle.start_update("increase_size", 1, wait_for_stage=ACCEPTED)',
        'await handle.query("status")',
        'await handle.query(query="digest")',
        'await workflow.get_external_workflow_handle(wid).signal("claim_changed", digest)',
        'await client.start_workflow("GroupWorkflow", id=wid, task_queue=q, start_signal="observe_slot")',
        'await client.execute_update_with_start_workflow("wait_loaded", 1.0, start_workflow_operation=op)',
        'await signals.group(ns, group, "refresh")',
        's.send(wid, "mark_for_deletion", request)',
        "class W:\n    @workflow.signal\n    def refresh(self) -> None: ...",
        'class W:\n    @workflow.query(name="status")\n    def status(self) -> dict: ...',
        "class W:\n    @workflow.update(dynamic=True)\n    async def any(self, name, args): ...",
    ],
)
def test_the_checker_finds_a_bare_name(snippet: str) -> None:
    (hit,) = bare_handler_names(snippet, "snippet.py")
    assert hit.startswith("snippet.py:")


@pytest.mark.parametrize(
    "snippet",
    [
        "await handle.signal(c.GroupSignal.REFRESH)",
        "await handle.execute_update(c.GroupUpdate.DELETE_NODES, ['s1'], result_type=int)",
        "await handle.query(GroupWorkflow.instances)",
        "await handle.query(METADATA_QUERY, result_type=WorkflowMetadata)",
        "signal.signal(signal.SIGTERM, stop)",
        'lab.group("g2")',
        'lab.record("superseded")',
        "class W:\n    @workflow.signal(name=c.GroupSignal.REFRESH)\n    def refresh(self) -> None: ...",
    ],
)
def test_the_checker_passes_table_names(snippet: str) -> None:
    assert bare_handler_names(snippet) == []
