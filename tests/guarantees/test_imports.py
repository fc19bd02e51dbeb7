"""The import contract: the engine stands alone, the run loop serves every component, and no module
imports another that imports it back (imports inside functions count)."""

import ast
import functools
import gc
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENGINE = ROOT / "sessions_core"
WEB_ONLY = ("chatapp", "channels", "django_htmx")
PUBLIC_CLASSES = ("sessions_core.agent", "sessions_core.team", "sessions_core.workflow")
RUN_LOOP = (*(f"sessions_core.run.{name}" for name in ("base", "child", "lifecycle", "model_loop", "registry",
                                                       "root", "store")),
            "sessions_core.prompt", "sessions_core.config", "sessions_core.summary", "sessions_core.history")


def parse(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def imports_of(path: pathlib.Path, module: str) -> set[str]:
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@functools.cache
def engine_graph() -> dict[str, frozenset[str]]:
    """Each engine module's imports of the engine and of the web layer. Built once, with the garbage
    collector paused: CPython 3.11 fails a parse with "SystemError: AST constructor recursion depth
    mismatch" when a collection in the middle of it runs finalizers (seen after the socket tests, whose
    event loops leave tasks behind for the collector); one collection first, not one per file (each
    walks the whole heap of a long test session: that made these tests 13 s each)."""
    modules = {path: ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
               for path in ENGINE.rglob("*.py") if "migrations" not in path.parts}
    names = set(modules.values())
    gc.collect()
    gc.disable()
    try:
        imported = {module: imports_of(path, module) for path, module in modules.items()}
    finally:
        gc.enable()
    return {module: frozenset({name for name in found if name in names and name not in (module, "sessions_core")}
                              | {name for name in found if name.split(".")[0] in WEB_ONLY})
            for module, found in imported.items()}


def test_the_engine_never_imports_the_web_layer():
    offenders = {module: sorted(name for name in deps if name.split(".")[0] in WEB_ONLY)
                 for module, deps in engine_graph().items()}
    assert {module: names for module, names in offenders.items() if names} == {}


def test_the_run_loop_never_imports_the_public_classes():
    graph = engine_graph()
    assert {module: sorted(graph[module] & set(PUBLIC_CLASSES)) for module in RUN_LOOP
            if graph.get(module, set()) & set(PUBLIC_CLASSES)} == {}


def test_the_engine_has_no_import_circle():
    graph = engine_graph()
    cycles, state = [], {}

    def visit(module, stack):
        state[module] = "open"
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == "open":
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_importing_the_engine_does_no_work():
    code = ("import sys, sessions_core; from django.apps import apps; "
            "print(apps.ready, 'django.db.migrations.executor' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert (result.returncode, result.stdout.strip()) == (0, "False False"), result.stderr


def test_a_script_outside_the_project_works_with_the_project_on_pythonpath(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(
        "from sessions_core import Agent, RunContext\n"
        "from sessions_core.llm import OfflineModel\n"
        "def add_item(run_context: RunContext, item: str) -> str:\n"
        "    run_context.session_state['shopping_list'].append(item)\n"
        "    return f'Added {item}'\n"
        "agent = Agent(model=OfflineModel(), tools=[add_item], session_state={'shopping_list': []})\n"
        "agent.run('add milk', session_id='outside', user_id='me')\n"
        "print(agent.get_session_state(session_id='outside', user_id='me'))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}"}
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, env=env,
                            timeout=120)
    assert (result.returncode, result.stdout.strip()) == (0, "{'shopping_list': ['milk']}"), result.stderr


def test_a_script_outside_any_project_gets_a_clear_error(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "sessions_core").symlink_to(ENGINE)  # the engine alone, without a project
    script = tmp_path / "script.py"
    script.write_text("import sessions_core\nsessions_core.Agent\n")
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "lib")}, timeout=60)
    assert result.returncode == 1
    assert "ImproperlyConfigured: sessions_core needs Django settings and found none" in result.stderr
