"""Structure checks that the compiler does not make: no import cycle between the shim's modules,
and no hand-written module over the size the ARCHITECTURE allows.

A module's edges are the other modules it names: `crate::a::b` paths (to the deepest module
that exists) and `super::x` paths, in code and in macro bodies alike. Declaring a child module
(`mod x;`) is not an edge, and neither is a child naming its ancestor (`super::Ctx` in a file
that holds part of its parent's `impl`): a module split into children stays one unit.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+|::\{[^}]*\})")


def modules(src: Path) -> dict[tuple[str, ...], Path]:
    """Module path → file, for every `.rs` file under `src` (lib.rs is the root `()`)."""
    out: dict[tuple[str, ...], Path] = {}
    for f in src.rglob("*.rs"):
        parts = list(f.relative_to(src).with_suffix("").parts)
        if parts[-1] in ("mod", "lib", "main"):
            parts.pop()
        if "bin" in parts[:1]:
            continue
        out[tuple(parts)] = f
    return out


def strip_comments(text: str) -> str:
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def edges(src: Path) -> dict[tuple[str, ...], set[tuple[str, ...]]]:
    mods = modules(src)
    graph: dict[tuple[str, ...], set[tuple[str, ...]]] = {m: set() for m in mods}
    for m, f in mods.items():
        text = strip_comments(f.read_text())
        # `mod tests { .. }` blocks are the module itself.
        for kind, rest in PATH.findall(text):
            base = () if kind == "crate" else m[:-1]
            if rest.startswith("::{"):
                names = [n.strip().split("::")[0] for n in rest[3:-1].split(",") if n.strip()]
                targets = [(*base, n) for n in names if n not in ("self", "*")] or [base]
            else:
                targets = [base + tuple(rest.strip(":").split("::"))]
            for t in targets:
                # The deepest existing module on the path (the rest names an item).
                while t and t not in mods:
                    t = t[:-1]
                if t and t != m and not m[: len(t)] == t:
                    graph[m].add(t)
    return graph


def cycles(graph: dict[tuple[str, ...], set[tuple[str, ...]]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[tuple[str, ...], int] = {}
    low: dict[tuple[str, ...], int] = {}
    stack: list[tuple[str, ...]] = []
    on: set[tuple[str, ...]] = set()
    out: list[list[str]] = []

    def visit(v: tuple[str, ...]) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append("::".join(w))
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def check_cycles(src: Path, expect: list[list[str]]) -> None:
    assert cycles(edges(src)) == expect


def test_the_checker_sees_a_cycle(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "hooks").mkdir(parents=True)
    (src / "lib.rs").write_text("pub mod a;\npub mod b;\npub mod hooks;\n")
    (src / "a.rs").write_text("use crate::b::thing;\n")
    (src / "b.rs").write_text(
        "// crate::a::ignored in a comment\nfn f() { crate::hooks::x::y(); }\n"
    )
    (src / "hooks" / "mod.rs").write_text("pub mod x;\n")
    (src / "hooks" / "x.rs").write_text("use super::super::a;\nuse crate::{a, b};\n")
    # hooks::x → a?  `super::super` is not followed; `crate::{a, b}` is.
    assert edges(src)[("hooks", "x")] == {("a",), ("b",)}
    check_cycles(src, [["a", "b", "hooks::x"]])
    (src / "a.rs").write_text("")
    check_cycles(src, [["b", "hooks::x"]])
    (src / "hooks" / "x.rs").write_text("use crate::a;\n")
    check_cycles(src, [])


def test_no_import_cycle_in_the_shim() -> None:
    check_cycles(ROOT / "shim" / "src", [])


@pytest.mark.parametrize(
    "crate", ["trace", "shim", "simulator", "estimators", "cli/memsim", "cli/memest", "python"]
)
def test_no_module_over_600_lines(crate: str) -> None:
    long = {}
    for f in (ROOT / crate / "src").rglob("*.rs"):
        rel = f.relative_to(ROOT).as_posix()
        n = len(f.read_text().splitlines())
        if n > 600:
            long[rel] = n
    assert long == {}
