"""No test waits for something by sleeping a fixed time (tests/waiting.py polls the
condition instead). Read from the source with ``ast``: a call of ``time.sleep`` or
``asyncio.sleep`` (or a bare imported ``sleep``) whose duration is a constant other than 0,
outside any loop of its function, is refused, unless its line says
``# behaviour: ...``: the pause is itself what the test exercises (a client that
stalls mid-body, a backend that never answers, a connection left idle).

Allowed without a word: a sleep inside a loop (the interval of a poll with a deadline, or
the pace of a trickle), a duration that is not a constant (a server's configured delay),
and ``sleep(0)`` (a yield to the event loop, not a wait).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SLEEPS = {("time", "sleep"), ("asyncio", "sleep")}
MARK = "# behaviour:"


def _is_sleep(call: ast.Call, bare: set[str]) -> bool:
    f = call.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        return (f.value.id, f.attr) in SLEEPS
    return isinstance(f, ast.Name) and f.id in bare


def _constant_seconds(call: ast.Call) -> float | None:
    """The duration when it is a literal (``0.2``, ``-1``, ``2 * 0.5``), else None."""
    arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg in ("secs", "delay")), None)
    if arg is None:
        return None
    return _number(arg)


def _number(e: ast.expr) -> float | None:
    if isinstance(e, ast.Constant) and isinstance(e.value, (int, float)):
        return float(e.value)
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
        v = _number(e.operand)
        return None if v is None else (-v if isinstance(e.op, ast.USub) else v)
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        a, b = _number(e.left), _number(e.right)
        if a is None or b is None or (isinstance(e.op, ast.Div) and b == 0):
            return None
        return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}.get(type(e.op), a / b if b else 0.0)
    return None  # a name, an attribute, a call: not a constant


def fixed_sleeps(path: Path) -> list[str]:
    src = path.read_text()
    lines = src.splitlines()
    tree = ast.parse(src, str(path))
    bare = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
            and n.module in ("time", "asyncio") for a in n.names if a.name == "sleep"}
    out: list[str] = []

    def visit(node: ast.AST, in_loop: bool) -> None:
        for child in ast.iter_child_nodes(node):
            loop = in_loop
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                loop = False        # a function's body runs once per call, whatever encloses it
            elif isinstance(child, (ast.For, ast.AsyncFor, ast.While)):
                loop = True
            elif isinstance(child, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
                loop = True
            if isinstance(child, ast.Call) and _is_sleep(child, bare) and not in_loop:
                secs = _constant_seconds(child)
                said = any(MARK in ln for ln in lines[child.lineno - 1:(child.end_lineno or child.lineno)])
                if secs is not None and secs != 0 and not said:
                    out.append(f"{path.name}:{child.lineno}: {lines[child.lineno - 1].strip()}")
            visit(child, loop)

    visit(tree, False)
    return out


def test_no_fixed_sleep_stands_in_for_a_condition():
    bad = [b for f in sorted(TESTS.rglob("*.py")) for b in fixed_sleeps(f)]
    assert not bad, ("sleeps of a fixed time outside a loop: wait on the condition (tests/waiting.py), "
                     f"or say '{MARK} ...' on the line when the pause is what is tested:\n" + "\n".join(bad))


def test_the_rule_reads_what_it_should(tmp_path):
    f = tmp_path / "sample.py"
    f.write_text(
        "import asyncio, time\n"
        "from time import sleep as nap\n"
        "async def t(delay):\n"
        "    await asyncio.sleep(0.4)\n"                      # 4: refused
        "    time.sleep(2 * 0.5)\n"                           # 5: refused (a constant expression)
        "    nap(1)\n"                                        # 6: refused (the bare import)
        "    await asyncio.sleep(0)\n"                        # a yield
        "    await asyncio.sleep(delay)\n"                    # not a constant
        "    time.sleep(0.3)  # behaviour: the client stalls\n"
        "    while True:\n"
        "        time.sleep(0.05)\n"                          # a poll's interval
        "        def handler():\n"
        "            time.sleep(3)\n"                         # 13: refused (runs once per call)
        "    x = [time.sleep(0.1) for _ in range(2)]\n")
    assert [b.split(":")[1] for b in fixed_sleeps(f)] == ["4", "5", "6", "13"]
