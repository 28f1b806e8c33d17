"""The import structure of mxcore and mxcore.backends (no GPU; reads the sources with ``ast``).

The graph has one edge per ``import`` / ``from ... import`` statement anywhere in a module (module level, inside
functions and classes, under conditions), relative imports resolved, from the importing module to the module it
names: ``from .backends import codec`` is an edge to ``mxcore.backends.codec``, ``from .dtypes import bits`` an
edge to ``mxcore.dtypes``.  Loading by name at run time (the backend registry's ``importlib`` calls,
``mxcore.__getattr__``) is the seam between the layers, not an edge.

The rules (docs/design.md, "Layers"):

* no import cycles, except the ones listed in :data:`ALLOWED_CYCLES` with what removing each needs; the list
  only shrinks: a cycle that is gone must leave the list, a new one fails;
* the core (``mxcore`` except ``mxcore.tools``, ``mxcore.torch``, ``mxcore.nn``) imports no backend module but
  the registry, ``mxcore.backends``;
* no module imports an underscore-private name (a module, or a name of a module) of another package, or reaches
  one through a module it imported;
* nothing outside ``mxcore.tools`` imports ``mxcore.tools`` (``mxcore.__main__``, which ``python -m mxcore`` runs,
  is the command line's entry point and counts as a tool).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# source folder -> the package it is installed as (pyproject's [tool.setuptools.package-dir])
SOURCES = {"mxcore": "mxcore", "backends": "mxcore.backends"}
REGISTRY = {"mxcore.backends"}  # the backend modules the core may import
# the layers above the core; a module belongs to the longest one that contains it, else to the core ("mxcore")
LAYERS = ("mxcore.backends", "mxcore.tools", "mxcore.torch", "mxcore.nn")
TOOLS = ("mxcore.tools", "mxcore.__main__")
MAX_SHOWN = 8  # new cycles listed in a failure message

#: each remaining cycle (rotated to start at its smallest module) -> what removing it needs; none remain (the driver
#: module, backends/cuda/driver.py, and the operand module, backends/cuda/operand.py, broke the last ones)
ALLOWED_CYCLES: dict = {}


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module
    name: str | None  # the imported name when it is not a module (``from target import name``)
    where: str  # path:line
    verb: str = "imports"  # or "reaches" (``alias._name`` through an imported module)

    def __str__(self) -> str:
        what = f"{self.target}.{self.name}" if self.name else self.target
        return f"{self.where}: {self.source} {self.verb} {what}"


def _modules(root: Path = ROOT) -> dict:
    """module name -> (path, is a package __init__)."""
    out = {}
    for folder, package in SOURCES.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            out[".".join([package, *(parts[:-1] if is_pkg else parts)])] = (path, is_pkg)
    return out


def _existing(name: str, modules) -> str:
    """The deepest module that ``name`` (a dotted path, maybe ending in attributes) names."""
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name


def _imports(modules, root: Path = ROOT) -> tuple[list, dict]:
    """Every import of an mxcore module, and per module the local names bound to imported mxcore modules (for
    attribute access through them)."""
    edges, bound = [], {}
    for name, (path, is_pkg) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        package = name if is_pkg else name.rpartition(".")[0]
        rel = path.relative_to(root).as_posix()
        aliases = bound.setdefault(name, {})
        for node in ast.walk(tree):
            where = f"{rel}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "mxcore":
                        target = _existing(alias.name, modules)
                        edges.append(Import(name, target, None, where))
                        if alias.asname:
                            aliases[alias.asname] = target
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                if mod.split(".")[0] != "mxcore":
                    continue
                for alias in node.names:
                    if f"{mod}.{alias.name}" in modules:
                        edges.append(Import(name, f"{mod}.{alias.name}", None, where))
                        aliases[alias.asname or alias.name] = f"{mod}.{alias.name}"
                    else:
                        edges.append(Import(name, _existing(mod, modules), alias.name, where))
    return edges, bound


def _private_reaches(modules, bound, root: Path = ROOT) -> list:
    """``alias._name`` where ``alias`` is an imported mxcore module: as if ``_name`` were imported from it."""
    out = []
    for name, (path, _) in modules.items():
        aliases = bound.get(name, {})
        if not aliases:
            continue
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and _is_private(node.attr)):
                out.append(Import(name, aliases[node.value.id], node.attr, f"{rel}:{node.lineno}", "reaches"))
    return out


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _layer(module: str) -> str:
    inside = [p for p in LAYERS if module == p or module.startswith(p + ".")]
    return max(inside, key=len) if inside else "mxcore"


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _is_tool(module: str) -> bool:
    return any(_inside(module, t) for t in TOOLS)


def _private_owner(imp: Import, modules) -> str | None:
    """The package that owns the first underscore-private part of what ``imp`` imports, or None."""
    parts = imp.target.split(".")
    for i, part in enumerate(parts):
        if _is_private(part):
            return ".".join(parts[:i])
    if imp.name is not None and _is_private(imp.name):
        return imp.target if modules[imp.target][1] else imp.target.rpartition(".")[0]
    return None


def _graph(edges) -> dict:
    graph: dict = {}
    for e in edges:
        if e.source != e.target:
            graph.setdefault(e.source, set()).add(e.target)
            graph.setdefault(e.target, set())
    return graph


def _components(graph) -> list:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(comp)
    return out


def _cycles(graph) -> set:
    """Every elementary cycle, as a tuple rotated to start at its smallest module."""
    out = set()
    for comp in _components(graph):
        nodes = sorted(comp)
        for i, start in enumerate(nodes):
            allowed = set(nodes[i:])
            path, stack = [start], [iter(sorted(graph[start] & allowed))]
            while stack:
                for w in stack[-1]:
                    if w == start:
                        out.add(tuple(path))
                    elif w not in path:
                        path.append(w)
                        stack.append(iter(sorted(graph[w] & allowed)))
                        break
                else:
                    stack.pop()
                    path.pop()
    return out


@pytest.fixture(scope="module")
def scanned():
    modules = _modules()
    edges, bound = _imports(modules)
    return modules, edges, bound


def _lines(imports) -> str:
    return "\n  ".join(sorted(str(i) for i in imports))


def test_the_scan_sees_every_kind_of_import(scanned):
    """Module-level, function-level, relative (one and two dots) and absolute imports all become edges."""
    modules, edges, _ = scanned
    assert {"mxcore.api", "mxcore.tools.cli", "mxcore.backends.cuda.plan", "mxcore.backends.probes"} <= set(modules)
    found = {(e.source, e.target, e.name) for e in edges}
    assert ("mxcore.api", "mxcore.operands", "check_real_input") in found  # module level, relative
    assert ("mxcore.formats", "mxcore.backends", "device_codec") in found  # inside a function
    assert ("mxcore.backends.reference", "mxcore.reference", "reference_from_operands") in found  # two dots
    assert ("mxcore.backends.cuda.tp", "mxcore.dist_comm", "wait") in found  # absolute
    assert ("mxcore.tools.selftest", "mxcore.backends.probes", None) in found  # a module by ``from X import mod``
    assert ("mxcore.backends.cuda.plan", "mxcore.backends.cuda.diag", "launch_diagnostic") in found  # in a method


def test_cycle_finder_on_a_small_graph():
    graph = {"a": {"b"}, "b": {"c", "a"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == {("a", "b"), ("a", "b", "c")}
    assert _cycles({"a": {"b"}, "b": set()}) == set()


def test_no_import_cycles_beyond_the_allowed_ones(scanned):
    _, edges, _ = scanned
    found = _cycles(_graph(edges))
    new = sorted(found - set(ALLOWED_CYCLES))
    gone = sorted(set(ALLOWED_CYCLES) - found)
    lines = []
    for cycle in sorted(new, key=len)[:MAX_SHOWN]:
        ring = list(zip(cycle, cycle[1:] + cycle[:1]))
        lines.append(" -> ".join(cycle + cycle[:1]) + ":\n    "
                     + "\n    ".join(str(e) for a, b in ring for e in edges if (e.source, e.target) == (a, b)))
    if len(new) > MAX_SHOWN:
        lines.append(f"... and {len(new) - MAX_SHOWN} more (the shortest are shown)")
    assert not new, (f"{len(new)} new import cycle(s) (break one import of each; see docs/design.md, Layers):\n"
                     + "\n".join(lines))
    assert not gone, ("these cycles are gone; remove them from ALLOWED_CYCLES in tests/test_layering.py:\n"
                      + "\n".join(" -> ".join(c) for c in gone))


def test_allowed_cycles_say_why():
    assert all(isinstance(why, str) and len(why) > 40 for why in ALLOWED_CYCLES.values())
    assert all(c[0] == min(c) for c in ALLOWED_CYCLES)  # rotated as _cycles reports them


def test_the_core_imports_only_the_backend_registry(scanned):
    _, edges, _ = scanned
    bad = [e for e in edges if _layer(e.source) == "mxcore" and _inside(e.target, "mxcore.backends")
           and e.target not in REGISTRY]
    assert not bad, (f"the core imports backend modules other than the registry ({', '.join(sorted(REGISTRY))}); "
                     "register the backend's part with the registry instead:\n  " + _lines(bad))


def test_no_private_name_crosses_a_package(scanned):
    modules, edges, bound = scanned
    bad = []
    for imp in edges + _private_reaches(modules, bound):
        owner = _private_owner(imp, modules)
        if owner is not None and not (_inside(imp.source, owner) and _layer(imp.source) == _layer(owner)):
            bad.append(imp)
    assert not bad, ("underscore-private names used outside their package; give the shared helper a public name "
                     "in a module both sides may import:\n  " + _lines(bad))


def test_only_the_tools_import_the_tools(scanned):
    _, edges, _ = scanned
    bad = [e for e in edges if _is_tool(e.target) and not _is_tool(e.source)]
    assert not bad, "the library imports mxcore.tools:\n  " + _lines(bad)


def test_using_the_library_loads_no_tool():
    """The library's own lazy names (mxcore.__getattr__) and a call on the reference backend load no tool."""
    code = ("import sys, numpy as np, mxcore\n"
            "mxcore.matmul(np.ones((4, 32), np.float32), np.ones((32, 4), np.float32), 'mxfp4', backend='reference')\n"
            "[getattr(mxcore, n) for n in mxcore.__all__]\n"
            "print(sorted(m for m in sys.modules if m.startswith('mxcore.tools')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_registry_finds_what_the_core_asks_for():
    """What the core reaches through the registry: the device codecs, a backend's column-parallel program, the
    backends loaded so far (read-only)."""
    from mxcore import backends

    assert backends.device_codec().__name__ == "mxcore.backends.codec"
    tp = backends.tensor_parallel("nvidia")
    assert tp.__name__ == "mxcore.backends.cuda.tp" and callable(tp.lookup) and callable(tp.keep)
    assert backends.tensor_parallel("reference") is None and backends.tensor_parallel("hip") is None
    ref = backends.get("reference")
    assert backends.loaded()["reference"] is ref
    with pytest.raises(TypeError):
        backends.loaded()["reference"] = None
