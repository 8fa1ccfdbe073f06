"""The packages are layered: imports point down only, and no module imports itself back through others."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("testbed", "agents", "netem", "dashboards")
# The floors are folders: lower numbers are lower floors, and a module may import its own floor or any below.
# A module's floor is its folder's (testbed's own files, api, cli, node, are the top); a new folder under
# testbed/ must take a floor here (test_every_folder_has_a_floor). A decode mode is one folder,
# agents/modes/<mode>/, whose files sit on their roles' floors: its card (__init__), facts and settings on the ground
# floor with the registry (agents.modes), its runner with the agents, its summary and metrics with the run.
FLOORS = (
    (0, ("testbed/core", "agents/modes")),
    (1, ("agents", "netem", "agents/modes/*/runner")),
    (2, ("testbed/deploy", "testbed/scenario")),  # the catalogues; a scenario, its sections' rules, the built-ins
    (3, ("testbed/launch", "agents/modes/*/summary", "agents/modes/*/metrics")),  # one run: launcher, run log, summary
    (4, ("dashboards",)),
    (5, ("testbed/studies",)),  # a folder per study, and their registry
    (6, ("testbed/report",)),  # reads every study's report part
    (7, ("testbed/hosts", "testbed")),  # the top: api, cli, node and the several-host run
)
# a mode's modules with a floor of their own (testbed.core.decode.ROLES); every other module of its folder (facts,
# settings, and what they use: the serve mode's requests, workload, slo, queueing, endpoint) is on the ground floor
RAISED_ROLES = ("runner", "summary", "metrics")
SIDEWAYS_FORBIDDEN = {("agents", "netem"), ("netem", "agents")}  # the two halves of floor 1 do not know each other


def folder_of(module: str) -> str:
    """The folder that sets a module's floor: testbed/<sub> for testbed's subfolders, a decode mode's role
    (agents/modes/*/<role>; its card and facts: agents/modes), else the package."""
    parts = module.split(".")
    if parts[:2] == ["agents", "modes"]:
        role = parts[3] if len(parts) > 3 else "facts"
        return f"agents/modes/*/{role}" if role in RAISED_ROLES else "agents/modes"
    if parts[0] == "testbed" and len(parts) > 1 and (ROOT / "testbed" / parts[1]).is_dir():
        return f"testbed/{parts[1]}"
    return parts[0]


def layer_of(module: str) -> int:
    folder = folder_of(module)
    level = next((level for level, folders in FLOORS if folder in folders), None)
    assert level is not None, f"{module}: its folder {folder} has no floor in FLOORS"
    return level


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every project module `path` imports, at the top or inside a function (resolved to the longest known name)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name.split(".")[0] in PACKAGES:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    graph = {}
    for name, path in modules.items():
        # a package's __init__ is imported implicitly with every submodule: those edges are not layering
        graph[name] = {m for m in imports_of(path, modules) if m != name and not name.startswith(m + ".")}
    return graph


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    upward = []
    for module, targets in graph.items():
        for target in targets:
            if target == "testbed" and module.startswith("testbed."):
                continue
            if layer_of(target) > layer_of(module):
                upward.append(f"{module} (floor {layer_of(module)}, {folder_of(module)}) imports {target} "
                              f"(floor {layer_of(target)}, {folder_of(target)})")
            if (module.split(".")[0], target.split(".")[0]) in SIDEWAYS_FORBIDDEN:
                upward.append(f"{module} imports {target} across floor 1")
    return sorted(upward)


def test_imports_point_down_only():
    upward = upward_imports(import_graph())
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    assert not cycles, cycles


def test_the_ground_floor_imports_nothing_heavy():
    code = ("import sys, testbed.core, testbed.core.errors, testbed.core.clock, testbed.core.physics, "
            "testbed.core.records, testbed.core.channel, testbed.core.decode, testbed.core.summary, "
            "testbed.core.lapstats, agents.modes; "
            "print(sorted(m for m in sys.modules if m in ('testbed.launch', 'testbed.cli', 'torch', 'rich', 'netem', "
            "'numpy', 'agents.process.ring') or m.startswith('agents.modes.') and m.endswith(('.runner', '.summary', '.metrics'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_real_time_launcher_imports_no_torch():
    """Its agents compute, forked from the fork server; the launcher only starts them and reads their laps (torch
    costs ~1 s and ~200 MB here, ~20 s inside user-mode-linux). The virtual backend imports it where it runs."""
    code = ("import sys, testbed.cli, testbed.launch.launcher, testbed.launch.summarize, netem.select, dashboards.render; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_every_folder_has_a_floor():
    folders = {folder_of(name) for name in project_modules()}
    floored = {folder for _, names in FLOORS for folder in names}
    assert folders <= floored, f"folders without a floor in FLOORS: {sorted(folders - floored)}"
    assert floored <= folders, f"floors name folders that hold no module: {sorted(floored - folders)}"
    assert layer_of("testbed.cli") == layer_of("testbed.node") == layer_of("testbed.hosts.node") == 7


def test_a_decode_mode_is_a_folder_of_known_roles():
    """Every mode of the registry is a folder agents/modes/<name>/ with its card; its files of the roles ModeInfo.part
    knows sit on their floors, and every other file (facts, settings, a module they use) on the ground floor."""
    from agents.modes import MODES
    from testbed.core.decode import ROLES

    roles = {folder.rpartition("/")[2] for _, names in FLOORS for folder in names if folder.startswith("agents/modes/*/")}
    assert roles == set(ROLES)
    for name, info in MODES.items():
        assert info.package == f"agents.modes.{name}" and (ROOT / "agents" / "modes" / name / "__init__.py").is_file()
        assert importlib.util.find_spec(f"{info.package}.runner") is not None, f"{name} has no runner"
        has_summary = importlib.util.find_spec(f"{info.package}.summary") is not None  # its part needs a JSON field
        assert has_summary == (info.summary_field is not None), f"{name}: summary.py needs card.summary"
    assert layer_of("agents.modes.tree") == layer_of("agents.modes.tree.facts") == 0
    assert (layer_of("agents.modes.tree.runner"), layer_of("agents.modes.tree.summary")) == (1, 3)
    assert folder_of("agents.modes.serve.workload") == folder_of("agents.modes.tree.helpers") == "agents/modes"


def test_the_layer_check_catches_an_upward_import(tmp_path):
    assert layer_of("testbed.core.records") < layer_of("agents.process.ring") < layer_of("testbed.scenario.config") \
        < layer_of("testbed.launch.launcher") < layer_of("dashboards.live") < layer_of("testbed.studies.faults.measure") \
        < layer_of("testbed.report.build") < layer_of("testbed.cli")
    fake = tmp_path / "m.py"
    fake.write_text("def f():\n    from testbed.launch.launcher import Launcher\n")
    planted = imports_of(fake, project_modules())
    assert planted == {"testbed.launch.launcher"}
    graph = import_graph() | {"testbed.scenario.planted": planted}  # a scenario module reaching up into run/
    assert upward_imports(graph) == ["testbed.scenario.planted (floor 2, testbed/scenario) imports "
                                     "testbed.launch.launcher (floor 3, testbed/launch)"]
    graph = import_graph() | {"agents.modes.tree.facts": {"agents.modes.tree.runner"}}  # a card reaching its runner
    assert upward_imports(graph) == ["agents.modes.tree.facts (floor 0, agents/modes) imports "
                                     "agents.modes.tree.runner (floor 1, agents/modes/*/runner)"]


def test_every_module_says_what_it_is_for_and_stays_small():
    too_long, undocumented = [], []
    for name, path in project_modules().items():
        tree = ast.parse(path.read_text())
        if not ast.get_docstring(tree):
            undocumented.append(name)
        lines = len(path.read_text().splitlines())
        if lines > 400 and name != "agents.zoo.model":  # the model reads best as one file (nanoGPT style)
            too_long.append(f"{name}: {lines} lines")
    assert not undocumented, undocumented
    assert not too_long, too_long


MAX_FUNCTION_LINES = 60


def test_no_function_over_60_lines():
    """A function does one thing a reader can hold: split one that grows past MAX_FUNCTION_LINES."""
    long = [f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
            for name, path in project_modules().items() for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, long


# The scenario's `parallel` key holds "pp" or "tp": a parallelism, spelled like the tp mode it selects (ModeInfo.tp_as)
NOT_MODE_NAMES = {"parallel"}


def mode_name_comparisons(path: Path, names: set[str]) -> list[str]:
    """Each ==, !=, in or not in of a registered mode's name as a literal in `path`, as "path:line: expression"."""
    def literals(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return [value for item in node.elts for value in literals(item)]
        return []

    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare) or not any(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn)
                                                        for op in node.ops):
            continue
        operands = [node.left, *node.comparators]
        if any(isinstance(o, ast.Name) and o.id in NOT_MODE_NAMES for o in operands):
            continue
        if any(value in names for o in operands for value in literals(o)):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.get_source_segment(source, node)}")
    return found


def outside_the_modes_folders() -> list[Path]:
    return [path for path in project_modules().values()
            if not (path.relative_to(ROOT).parts[:2] == ("agents", "modes") and len(path.relative_to(ROOT).parts) > 3)]


def test_no_mode_name_is_compared_outside_its_folder():
    """A decision that depends on the mode is its card's flag (ModeInfo), read where it is needed: a string
    comparison of a mode's name outside agents/modes/<mode>/ is a decision the mode does not own."""
    from agents.modes import MODES

    found = [hit for path in outside_the_modes_folders() for hit in mode_name_comparisons(path, set(MODES))]
    assert not found, "\n".join(found)


def test_the_mode_name_check_catches_a_planted_comparison(tmp_path):
    planted = ROOT / "testbed" / "scenario" / "planted_for_test.py"  # inside the packages, as a real module would be
    planted.write_text('"""planted"""\n\n\ndef f(decode, kinds):\n    return decode.mode != "plain" or "tree" in kinds'
                       ' or decode.mode in ("dsd", "other") or parallel == "tp"\n')
    try:
        assert planted in outside_the_modes_folders()
        assert mode_name_comparisons(planted, {"plain", "tree", "dsd", "tp"}) == [
            'testbed/scenario/planted_for_test.py:5: decode.mode != "plain"',
            'testbed/scenario/planted_for_test.py:5: "tree" in kinds',
            'testbed/scenario/planted_for_test.py:5: decode.mode in ("dsd", "other")']
    finally:
        planted.unlink()
