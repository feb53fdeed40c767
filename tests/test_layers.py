"""The package's layers import one way (docs/ARCHITECTURE.md):

    core  <-  config, metrics, hashing, token rules, Redis helpers
          <-  stages, backends, integrations
          <-  proxy (HTTP)
          <-  cli

Read from the source with ``ast``: every import, wherever it sits (module level,
inside a function, under ``if TYPE_CHECKING:``), goes to the same layer or a lower
one; the core imports nothing else from the package; and no ``TYPE_CHECKING``
import stands in for one that would close an import cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "vlm_gateway"

# first matching prefix wins
LAYERS = [
    ("vlm_gateway.core", 0),
    ("vlm_gateway.config", 1), ("vlm_gateway.config_values", 1), ("vlm_gateway.config_load", 1), ("vlm_gateway.metrics", 1),
    ("vlm_gateway.hashing", 1), ("vlm_gateway.vision_tokens", 1), ("vlm_gateway.video_tokens", 1),
    ("vlm_gateway.redis_keys", 1), ("vlm_gateway.redis_clients", 1), ("vlm_gateway.logs", 1),
    ("vlm_gateway.data_uri", 1), ("vlm_gateway.lru", 1), ("vlm_gateway.backoff", 1),
    ("vlm_gateway.tier", 1), ("vlm_gateway.offload", 1),
    ("vlm_gateway.stages", 2), ("vlm_gateway.backends", 2), ("vlm_gateway.integrations", 2),
    ("vlm_gateway.proxy", 3),
    # the facade (vlm_gateway/__init__.py: create_app, load_config, ...) sits on top
    ("vlm_gateway.cli", 4), ("vlm_gateway.docgen", 4), ("vlm_gateway.__main__", 4), ("vlm_gateway", 4),
]
NAMES = {0: "core", 1: "base", 2: "stages/backends", 3: "proxy", 4: "cli"}

def layer(mod: str) -> int:
    for prefix, n in LAYERS:
        if mod == prefix or mod.startswith(prefix + "."):
            return n
    raise AssertionError(f"{mod} has no layer")


def _modules():
    for f in sorted(PKG.rglob("*.py")):
        parts = f.relative_to(PKG.parent).with_suffix("").parts
        mod = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        pkg = mod if f.name == "__init__.py" else mod.rsplit(".", 1)[0]
        yield f, mod, pkg


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports():
    """(module, target, line, kind) for every import of the package's own modules;
    kind: "top" (module level), "lazy" (inside a function) or "typing" (TYPE_CHECKING)."""
    out = []
    for f, mod, pkg in _modules():
        tree = ast.parse(f.read_text(), str(f))

        def visit(node, kind):
            for child in ast.iter_child_nodes(node):
                k = kind
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    k = "lazy" if kind == "top" else kind
                if isinstance(child, ast.If) and _type_checking(child):
                    for sub in child.body:
                        visit_one(sub, "typing")
                    for sub in child.orelse:
                        visit_one(sub, kind)
                    continue
                visit_one(child, k)

        def visit_one(node, kind):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                subs = [f"{target}.{a.name}" for a in node.names]
                subs = [s for s in subs if (PKG.parent / (s.replace(".", "/") + ".py")).exists()
                        or (PKG.parent / s.replace(".", "/")).is_dir()]
                # `from .. import metrics` imports the module metrics (and runs the package's
                # __init__, which for vlm_gateway itself holds only the version)
                rest = [a.name for a in node.names if f"{target}.{a.name}" not in subs]
                if target == "vlm_gateway" and rest == ["__version__"]:
                    rest = []  # the version string: no code of the facade runs for it
                targets += ([target] if rest else []) + subs
            elif isinstance(node, ast.Import):
                targets += [a.name for a in node.names]
            for t in targets:
                if t.startswith("vlm_gateway"):
                    out.append((mod, t, node.lineno, kind))
            visit(node, kind)

        visit(tree, "top")
    return out


def _reach(kinds: tuple[str, ...], packages: bool):
    """reaches(src, dst): src imports dst, directly or through others, by imports of these
    kinds; with ``packages`` importing a submodule also runs its packages' __init__."""
    graph: dict[str, set[str]] = {}
    for m, t, _, k in imports():
        if k in kinds:
            graph.setdefault(m, set()).add(t)

    def reaches(src: str, dst: str) -> bool:
        seen, todo = set(), [src]
        while todo:
            m = todo.pop()
            if m == dst:
                return True
            if m in seen:
                continue
            seen.add(m)
            todo += graph.get(m, ())
            if packages:
                parts = m.split(".")
                todo += [".".join(parts[:i]) for i in range(2, len(parts))]
        return False
    return reaches


def test_no_import_goes_up_a_layer():
    bad = [f"{m} ({NAMES[layer(m)]}) imports {t} ({NAMES[layer(t)]}) at line {n} [{k}]"
           for m, t, n, k in imports() if layer(t) > layer(m)]
    assert not bad, "\n".join(bad)


def test_the_core_imports_nothing_else_from_the_package():
    bad = [f"{m} imports {t} at line {n}" for m, t, n, k in imports()
           if m.startswith("vlm_gateway.core") and not t.startswith("vlm_gateway.core")]
    assert not bad, "\n".join(bad)


def test_no_type_checking_import_hides_a_cycle():
    """A TYPE_CHECKING import A -> B is fine only where B does not import A back (at
    module level, directly or through others): then A could import B for real."""
    reaches = _reach(("top",), packages=True)
    bad = [f"{m} imports {t} under TYPE_CHECKING (line {n}), and {t} imports {m} back"
           for m, t, n, k in imports() if k == "typing" and reaches(t, m)]
    assert not bad, "\n".join(bad)


def test_no_import_inside_a_function_hides_a_cycle():
    """Likewise for an import inside a function: it may keep start-up light (an optional
    dependency, a heavy module), never stand in for a cycle the layers should not have."""
    reaches = _reach(("top", "lazy"), packages=False)
    bad = sorted({f"{m} imports {t} inside a function (line {n}), and {t} imports {m} back"
                  for m, t, n, k in imports() if k == "lazy" and t != m and reaches(t, m)})
    assert not bad, "\n".join(bad)
