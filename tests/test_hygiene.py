"""Source-level rules, checked on the AST.

(a) ``workflows/`` stays deterministic: it imports no I/O, clock, randomness or Kubernetes/gRPC module, and
    never reads the wall clock (``datetime.now()``/``utcnow()``/``date.today()``).
(b) The slot history fields have one writer, ``domain/history.py``. Reading them is allowed (the provider
    may rank slots by recent activations); writing them anywhere else is a violation. The declarations in
    ``api/v2alpha1.py`` and the generated schemas of ``api/crds.py`` are exempt.

Scope of (b), because ``lastTransitionTime`` is also a field of every Condition:

* the five history-only names (``previous_phase``, ``recent_transitions``, ``recent_activations``,
  ``activations_total``, ``activations_last_24h`` and their camelCase spellings) are flagged wherever they
  are written: assignment/``del`` targets, in-place mutation (``.append`` …, item assignment), keyword
  arguments, ``setattr``, dict-literal keys, and JSON-patch paths ``/status/<name>``;
* ``last_transition_time``/``lastTransitionTime`` is flagged only at the top level of a slot status: an
  attribute write on a receiver named like a status (``status``, ``slot.status``, ``node_status`` — not
  ``condition``), a keyword to a ``*NodeStatus(...)`` constructor, a dict literal that is the value of a
  ``"status"`` key or that also carries a slot-status key (``phase``, ``powerState``, ``lastClaim`` or a
  history name), a ``model_copy(update=...)`` on a status-like receiver, and the path
  ``/status/lastTransitionTime``. Conditions (``condition.last_transition_time = ...``,
  ``{"type": "Ready", "lastTransitionTime": ...}``) are not flagged.
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# --- (a) imports ----------------------------------------------------------------------------------------

FORBIDDEN_IMPORTS = frozenset(
    {
        "kubernetes",
        "grpc",
        "os",
        "time",
        "random",
        "socket",
        "subprocess",
        "asyncio.subprocess",
        "urllib",
        "requests",
        "aiohttp",
    }
)
CLOCK_RECEIVERS = frozenset({"datetime", "date"})
CLOCK_METHODS = frozenset({"now", "utcnow", "today"})


def _forbidden(module: str) -> bool:
    """A module is forbidden when it, or any package it lives in, is on the list."""
    parts = module.split(".")
    return any(".".join(parts[:n]) in FORBIDDEN_IMPORTS for n in range(1, len(parts) + 1))


def determinism_violations(source: str, filename: str = "<string>") -> list[str]:
    """Forbidden imports and wall-clock reads in one module's source."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found += [f"{filename}:{node.lineno}: import {a.name}" for a in node.names if _forbidden(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _forbidden(node.module):
                found.append(f"{filename}:{node.lineno}: from {node.module} import ...")
            found += [
                f"{filename}:{node.lineno}: from {node.module} import {a.name}"
                for a in node.names
                if _forbidden(f"{node.module}.{a.name}")
            ]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            recv = node.func.value
            name = recv.id if isinstance(recv, ast.Name) else recv.attr if isinstance(recv, ast.Attribute) else ""
            if name in CLOCK_RECEIVERS and node.func.attr in CLOCK_METHODS:
                found.append(f"{filename}:{node.lineno}: wall clock {name}.{node.func.attr}()")
    return found + module_state_violations(source, filename)


# The workflows' helper modules pass through the sandbox (homelab_autoscaler.temporal.PASSTHROUGH): one copy serves
# every workflow, so no function may change a module-level name (a table, a counter) or rebind one.
STATE_MUTATORS = frozenset(
    {"append", "extend", "insert", "pop", "popitem", "clear", "remove", "sort", "reverse", "update", "add",
     "discard", "setdefault", "__setitem__", "__delitem__"}
)  # fmt: skip


def module_state_violations(source: str, filename: str = "<string>") -> list[str]:
    """Module-level names a function changes: `global`, mutating calls, item or attribute writes, `+=`."""
    tree = ast.parse(source, filename)
    names: set[str] = set()
    for stmt in tree.body:
        targets = (
            stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
        )
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    found: list[str] = []

    def root(expr: ast.expr) -> str:
        while isinstance(expr, ast.Attribute | ast.Subscript):
            expr = expr.value
        return expr.id if isinstance(expr, ast.Name) else ""

    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            where = f"{filename}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Global):
                found.append(f"{where}: global {', '.join(node.names)}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in STATE_MUTATORS and root(node.func.value) in names:
                    found.append(f"{where}: {root(node.func.value)}.{node.func.attr}() changes module state")
            elif isinstance(node, ast.Assign | ast.AugAssign | ast.Delete):
                targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Attribute | ast.Subscript) and root(t) in names:
                        found.append(f"{where}: writes into module-level {root(t)}")
    return found


def _py_files(*dirs: str) -> Iterator[Path]:
    for d in dirs:
        base = ROOT / d
        if base.is_dir():
            yield from sorted(p for p in base.rglob("*.py") if ".venv" not in p.parts)


def test_workflows_are_deterministic() -> None:
    files = list(_py_files("workflows"))
    assert files, "no workflows/ sources found"
    violations = [v for p in files for v in determinism_violations(p.read_text(), str(p.relative_to(ROOT)))]
    assert violations == []


def test_the_modules_passed_through_the_sandbox_keep_no_state() -> None:
    """api and domain pass through the sandbox as well: one copy for every workflow, so nothing in them changes."""
    files = list(_py_files("api", "domain"))
    assert files
    assert [v for p in files for v in module_state_violations(p.read_text(), str(p.relative_to(ROOT)))] == []


@pytest.mark.parametrize(
    "bad",
    [
        "import os",
        "import time as t",
        "import kubernetes.client",
        "from grpc import aio",
        "from asyncio import subprocess",
        "import asyncio.subprocess",
        "from urllib.request import urlopen",
        "import random",
        "from datetime import datetime\nx = datetime.now()",
        "import datetime\nx = datetime.datetime.utcnow()",
        "from datetime import date\nx = date.today()",
        "SEEN = []\ndef f(x):\n    SEEN.append(x)",
        "TABLE = {}\nasync def f(k):\n    TABLE[k] = 1",
        "COUNT = 0\ndef f():\n    global COUNT\n    COUNT += 1",
        "CACHE: dict[str, int] = {}\ndef f():\n    CACHE.setdefault('a', 1)",
        "BOOK = {'a': []}\ndef f():\n    BOOK['a'].append(1)",
    ],
)
def test_determinism_checker_catches(bad: str) -> None:
    assert determinism_violations(bad)


@pytest.mark.parametrize(
    "good",
    [
        "import asyncio",
        "from datetime import datetime, timedelta",
        "from temporalio import workflow\nx = workflow.now()",
        "from api.names import ClaimPhase",
        "import dataclasses",
        "TABLE = {'a': 1}\ndef f(k):\n    return TABLE[k]",
        "def f():\n    seen = []\n    seen.append(1)\n    return seen",
        "class A:\n    def f(self):\n        self.items.append(1)",
    ],
)
def test_determinism_checker_allows(good: str) -> None:
    assert determinism_violations(good) == []


# --- (b) one writer of the history fields ----------------------------------------------------------------

HISTORY_ONLY_SNAKE = frozenset(
    {
        "previous_phase",
        "recent_transitions",
        "recent_activations",
        "activations_total",
        "activations_last_24h",
    }
)
HISTORY_ONLY_CAMEL = frozenset(
    {"previousPhase", "recentTransitions", "recentActivations", "activationsTotal", "activationsLast24H"}
)
HISTORY_ONLY = HISTORY_ONLY_SNAKE | HISTORY_ONLY_CAMEL
LTT = frozenset({"last_transition_time", "lastTransitionTime"})
SLOT_STATUS_MARKERS = frozenset({"phase", "powerState", "power_state", "lastClaim", "last_claim"}) | HISTORY_ONLY
MUTATORS = frozenset({"append", "extend", "insert", "pop", "clear", "remove", "sort", "reverse", "__setitem__"})
PATCH_PATHS = frozenset(f"/status/{n}" for n in (*HISTORY_ONLY_CAMEL, "lastTransitionTime"))

WRITER = "domain/history.py"
EXEMPT = frozenset({WRITER, "api/v2alpha1.py", "api/crds.py"})
PACKAGES = ("api", "workflows", "activities", "watchers", "provider", "admission", "homelab_autoscaler", "kube")


def _terminal_name(expr: ast.expr) -> str:
    """The last name of an expression: ``status`` for ``slot.status``, ``f`` for ``g().f``."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if isinstance(expr, ast.Call):
        return _terminal_name(expr.func)
    return ""


def _status_like(expr: ast.expr) -> bool:
    """A receiver that is a slot status (by its name), not a condition."""
    name = _terminal_name(expr).lower()
    return "status" in name and "condition" not in name


def _const_str(expr: ast.expr | None) -> str | None:
    return expr.value if isinstance(expr, ast.Constant) and isinstance(expr.value, str) else None


class _HistoryWrites(ast.NodeVisitor):
    """Collects every write of a history field (see the module docstring for the scope)."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.found: list[str] = []

    def _flag(self, node: ast.AST, what: str) -> None:
        self.found.append(f"{self.filename}:{getattr(node, 'lineno', 0)}: writes {what}")

    # targets: x.f = ..., x.f += ..., x.f: T = ..., del x.f, x["f"] = ..., x.f[i] = ...
    def _target(self, target: ast.expr) -> None:
        if isinstance(target, ast.Attribute):
            if target.attr in HISTORY_ONLY or (target.attr in LTT and _status_like(target.value)):
                self._flag(target, target.attr)
        elif isinstance(target, ast.Subscript):
            key = _const_str(target.slice)
            if key in HISTORY_ONLY or (key in LTT and _status_like(target.value)):
                self._flag(target, str(key))
            inner = target.value
            if isinstance(inner, ast.Attribute | ast.Subscript):
                name = inner.attr if isinstance(inner, ast.Attribute) else _const_str(inner.slice)
                if name in HISTORY_ONLY:
                    self._flag(target, f"an item of {name}")
        elif isinstance(target, ast.Tuple | ast.List):
            for elt in target.elts:
                self._target(elt)
        elif isinstance(target, ast.Starred):
            self._target(target.value)

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._target(t)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._target(node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        # A bare annotation in a class body is a declaration, not a write.
        if node.value is not None:
            self._target(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            self._target(t)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        callee = _terminal_name(func)
        for kw in node.keywords:
            if kw.arg in HISTORY_ONLY or (kw.arg in LTT and callee.endswith("NodeStatus")):
                self._flag(node, f"{kw.arg}= in {callee}()")
        if callee in {"setattr", "__setattr__"} and len(node.args) >= 2:
            name = _const_str(node.args[1])
            if name in HISTORY_ONLY or (name in LTT and _status_like(node.args[0])):
                self._flag(node, f"{name} via {callee}")
        if isinstance(func, ast.Attribute) and func.attr in MUTATORS and _terminal_name(func.value) in HISTORY_ONLY:
            self._flag(node, f"{_terminal_name(func.value)}.{func.attr}()")
        if isinstance(func, ast.Attribute) and func.attr == "model_copy" and _status_like(func.value):
            for kw in node.keywords:
                if kw.arg == "update" and isinstance(kw.value, ast.Dict):
                    for key in map(_const_str, kw.value.keys):
                        if key in LTT:
                            self._flag(node, f"{key} in {_terminal_name(func.value)}.model_copy(update=...)")
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        keys = {k for k in map(_const_str, node.keys) if k is not None}
        for key in keys & HISTORY_ONLY:
            self._flag(node, f"dict key {key!r}")
        if keys & LTT and keys & SLOT_STATUS_MARKERS:
            self._flag(node, "lastTransitionTime next to slot-status keys")
        # {"status": {"lastTransitionTime": ...}}: the top level of a status
        for k, v in zip(node.keys, node.values, strict=True):
            if _const_str(k) == "status" and isinstance(v, ast.Dict):
                inner = {x for x in map(_const_str, v.keys) if x is not None}
                if inner & LTT:
                    self._flag(v, "status.lastTransitionTime")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and node.value.rstrip("/-0123456789") in PATCH_PATHS:
            self._flag(node, f"patch path {node.value!r}")


def history_writes(source: str, filename: str = "<string>") -> list[str]:
    """Every write of a slot history field in one module's source."""
    visitor = _HistoryWrites(filename)
    visitor.visit(ast.parse(source, filename))
    return visitor.found


def test_history_fields_have_one_writer() -> None:
    violations: list[str] = []
    for path in _py_files(*PACKAGES):
        rel = path.relative_to(ROOT).as_posix()
        if rel not in EXEMPT:
            violations += history_writes(path.read_text(), rel)
    assert violations == [], "history fields are written outside domain/history.py:\n" + "\n".join(violations)


def test_the_writer_is_scanned_by_the_checker() -> None:
    """The writer does write the fields, so the checker sees them: only the exemption lets it pass."""
    writer = ROOT / WRITER
    assert writer.is_file()
    assert history_writes(writer.read_text(), WRITER)


@pytest.mark.parametrize(
    "bad",
    [
        "status.previous_phase = 'off'",
        "slot.status.recent_transitions += [row]",
        "slot.status.activations_total: int = 3",
        "del status.recent_activations",
        "status.recent_activations.append(now)",
        "status.recent_transitions[0] = row",
        "status['activationsLast24H'] = 1",
        "status = status.model_copy(update={'activations_total': 1})",
        "status = status.model_copy(update={'last_transition_time': now})",
        "NodeStatus(phase='off', last_transition_time=now)",
        "v2alpha1.NodeStatus(previous_phase='off')",
        "setattr(status, 'previous_phase', 'off')",
        "slot.status.last_transition_time = now",
        "body = {'status': {'phase': 'off', 'lastTransitionTime': now}}",
        "body = {'status': {'lastTransitionTime': now}}",
        "body = {'status': {'recentTransitions': []}}",
        "patch = [{'op': 'add', 'path': '/status/recentActivations/-', 'value': now}]",
        "patch = [{'op': 'replace', 'path': '/status/lastTransitionTime', 'value': now}]",
    ],
)
def test_history_checker_catches(bad: str) -> None:
    assert history_writes(bad)


@pytest.mark.parametrize(
    "good",
    [
        "n = status.activations_last_24h",
        "rows = list(slot.status.recent_transitions)",
        "ranked = sorted(slots, key=lambda s: s.status.activations_last_24h)",
        "condition.last_transition_time = now",
        "status.conditions[0].last_transition_time = now",
        "c = Condition(type='Ready', status='True', last_transition_time=now)",
        "c = cond.model_copy(update={'last_transition_time': now})",
        "d = {'type': 'Ready', 'status': 'True', 'lastTransitionTime': now}",
        "status = history.record(status, 'off', now)",
        "class NodeStatus:\n    previous_phase: str | None = None\n",
    ],
)
def test_history_checker_allows(good: str) -> None:
    assert history_writes(good) == []


def test_make_help_lists_every_documented_target() -> None:
    """Every Makefile target with a `## ` description is in `make help` (its pattern once skipped names with a hyphen:
    e2e-real, e2e-pods, e2e-power, cluster-bins were missing)."""
    makefile = (ROOT / "Makefile").read_text()
    documented = re.findall(r"^([a-z0-9][a-z0-9-]*):[^\n]*## ", makefile, re.M)
    shown = subprocess.run(["make", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True,
                           timeout=60, check=True).stdout  # fmt: skip
    listed = re.findall(r"^  make (\S+)", shown, re.M)
    assert "e2e-pods" in documented and listed == documented, (documented, listed)
