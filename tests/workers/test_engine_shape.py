"""The run engine's shape: modules that import in one direction, and a driver that owns its run.

A circle of imports (the driver importing the live view, which imported the driver back) means two
modules are one concept split in two; a record assigned from outside the driver means the driver
no longer knows what its next write carries. Both are read from the source, like tests/test_layout.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every first-party module by its dotted name (whichever top-level packages hold them)."""
    return {module_name(p): p for package in FIRST_PARTY for p in sorted((ROOT / package).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The first-party modules `name` imports, anywhere in it (under TYPE_CHECKING, in a function)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from workers import live`
    return {m for m in found if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph`: its strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            component.append(node)
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def test_the_run_engine_modules_import_in_one_direction() -> None:
    graph = import_graph()
    engine = {m for m in graph if m.startswith("workers")}
    assert engine, "no workers modules found"
    assert [c for c in cycles(graph) if engine.intersection(c)] == []


def test_the_live_view_knows_nothing_of_the_driver() -> None:
    graph = import_graph()
    assert "workers.live" in graph["workers.driver"]
    assert not {"workers.driver", "workers.jobs"} & graph["workers.live"]


def test_the_cycle_finder_finds_a_circle_and_only_it() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def record_writes(path: Path) -> list[int]:
    """Lines of `path` that assign (or augment) an attribute named `record` of anything."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        lines += [t.lineno for t in targets if isinstance(t, ast.Attribute) and t.attr == "record"]
    return lines


def test_only_the_driver_changes_the_record_it_drives() -> None:
    engine = {name: path for name, path in modules().items() if name.startswith("workers")}
    written = {name: record_writes(path) for name, path in engine.items() if name != "workers.driver"}
    assert {name: lines for name, lines in written.items() if lines} == {}
    assert record_writes(engine["workers.jobs"]) == []


def test_the_record_is_read_only_outside_the_driver() -> None:
    from workers.driver import Driver

    assert isinstance(Driver.record, property) and Driver.record.fset is None


# --- a run's life: one loop over phases (workers/life.py) ------------------------------------------


def functions_of(path: Path) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def called(node: ast.AST) -> set[str]:
    """Names called in `node`: `f(…)` by name, `x.f(…)` by attribute."""
    names = set()
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            if isinstance(call.func, ast.Name):
                names.add(call.func.id)
            elif isinstance(call.func, ast.Attribute):
                names.add(call.func.attr)
    return names


def test_no_phase_of_a_run_calls_another_phase() -> None:
    """What a phase leads to is returned to the loop (`life`), never called: the life reads top
    to bottom, and no function of it recurses into another."""
    functions = functions_of(ROOT / "workers" / "life.py")
    phases = called(functions["_next"]) & set(functions)
    assert {"_arrive", "_advance", "_park", "_parked", "_end", "_finish"} <= phases
    for phase in phases:
        seen, todo = set(), [phase]
        while todo:  # what the phase reaches through the module's own helpers
            for name in called(functions[todo.pop()]) & set(functions):
                if name not in seen and name not in phases:
                    seen.add(name)
                    todo.append(name)
        reached = (called(functions[phase]) | {c for h in seen for c in called(functions[h])}) & phases
        assert reached == set(), f"{phase} calls {reached}"
    callers = {name for name, fn in functions.items() if "_next" in called(fn)}
    assert callers == {"life"}


def test_only_finish_learns_the_run_a_thread_starts_next() -> None:
    functions = functions_of(ROOT / "workers" / "life.py")
    finishing = {name for name, fn in functions.items() if called(fn) & {"finish", "finish_failed"}}
    assert finishing == {"_finish"}


class _Store:
    """Just what a job reads before it takes the lease, counting `job_started`."""

    def __init__(self, record: Any) -> None:
        self.record = record
        self.started = 0
        self.runs = SimpleNamespace(job_started=self._job_started, load=lambda run_id: self.record)
        self.parks = SimpleNamespace(decisions=self._decisions)

    def _job_started(self, run_id: str) -> None:
        self.started += 1

    def _decisions(self, run_id: str, park_id: int) -> dict[str, Any]:
        from harness.state import Decision, Verdict

        return {"toolu_1": Decision(Verdict.APPROVED, by="UAPP")}


class _NoLease:
    """A driver whose lease someone else holds: the job does nothing more."""

    def __init__(self, svc: Any, run_id: str) -> None:
        pass

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.mark.parametrize("job", ["apply_decisions", "drive", "start_run", "recover_run"])
def test_a_job_marks_itself_started_once(job: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`job_started` once per job: the last decision of a park resumes the run in the same job."""
    from harness.state import new_run
    from store import RunRecord, RunStatus
    from workers import jobs

    record = RunRecord(
        "r1",
        "T1",
        "C1",
        "1.000001",
        "UA",
        "hi",
        status=RunStatus.AWAITING_APPROVAL,
        state=new_run("hi").to_json(),
    )
    store = _Store(record)
    monkeypatch.setattr(jobs, "services", lambda: SimpleNamespace(store=store))
    monkeypatch.setattr(jobs, "Driver", _NoLease)
    getattr(jobs, job)("r1")
    assert store.started == 1
