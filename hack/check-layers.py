#!/usr/bin/env python3
"""Fails when a module of src/ uses one that comes after it in LAYERS, when the modules'
`crate::` references form a cycle, or when the files of one folder form a cycle
(docs/architecture.md § The dependency rule).

Between folders: LAYERS is the layer order (src/lib.rs declares the modules in the same order):
a module may use only the modules listed before it. Every `crate::<module>` path counts (in `use`
lines and inline), except in comments and in the `#[cfg(test)] mod tests` block at the end of a
file, which may use anything. A module declared in src/lib.rs but missing here fails the check:
place it.

Inside a folder: for every module with children (a `mod.rs`, or `x.rs` beside a folder `x/`) in
src/ and in loadtest/src/ (a crate of its own: its `lib.rs` is the parent of its top-level
files), the graph of its files must be acyclic. A node is one child (a file, or a child folder as
a whole) or the parent file itself. An edge is a path from one node into another: `super::x`,
`self::x`, `crate::<folder>::x`, a `use` tree (`use super::{a, b::C}`), or, in the parent, a child
named by its bare name (`child::f()`). Comments and the trailing test block do not count, nor do
children declared `#[cfg(test)]`. How the parent counts:
- declaring a child (`mod x;`) is no edge, nor is re-exporting a child's item (`pub use x::Item`)
  as the folder's interface; the parent naming the item in its own code is an edge to `x`;
- a child's path to an item the parent re-exports or imports from a sibling (`super::Item`) is an
  edge to that sibling; a path to an item the parent defines is an edge to the parent;
- the parent using a child (calls, types, a private `use`) is an edge to that child.
So a parent either wires its children together (uses them, defines nothing they use) or is the
base they share (defines what they use, uses none of them), never both: types the children share
live in a file of their own (e.g. `reconcile/context.rs`), not in the parent.

ALLOWED_CYCLES lists the cycles still open, each as the files of one strongly connected
component of a folder; a cycle not listed fails, and so does an entry that is no longer a cycle
(delete it).
"""
import os
import re
import sys

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
ROOT = os.path.join(HERE, "src")


LAYERS = [
    "api",
    "telemetry",
    "source",
    "render",
    "plan",
    "apply",
    "shard",
    "reconcile",
    "work",
    "admin",
    "cli",
    "runtime",
]

# The crates whose folders are checked, and whether their top level is left to LAYERS.
CRATES = [("src", True), ("loadtest/src", False)]

# Folder → the files of a cycle still open there (one strongly connected component each), e.g.
# `"src/x/": [{"mod.rs", "a", "b"}]`. None is open.
ALLOWED_CYCLES = {}


def declared():
    text = open(os.path.join(ROOT, "lib.rs")).read()
    return re.findall(r"^pub mod (\w+);", text, re.M)


def product_code(text):
    """The file without its trailing `#[cfg(test)] mod tests` and without comments."""
    cut = re.search(r"^#\[cfg\(test\)\]\s*\n(?:pub(?:\([^)]*\))? )?mod \w+ \{", text, re.M)
    if cut:
        text = text[: cut.start()]
    return "\n".join(line.split("//")[0] for line in text.split("\n"))


def uses(order):
    graph = {m: {} for m in order}
    for module in order:
        base = os.path.join(ROOT, module)
        files = [base + ".rs"] if os.path.isfile(base + ".rs") else []
        for folder, _, names in os.walk(base):
            files += [os.path.join(folder, n) for n in names if n.endswith(".rs")]
        for path in files:
            code = product_code(open(path).read())
            for number, line in enumerate(code.split("\n"), 1):
                for used in re.findall(r"\bcrate::(\w+)", line):
                    if used != module and used in graph:
                        where = f"{os.path.relpath(path, HERE)}:{number}"
                        graph[module].setdefault(used, where)
    return graph


def cycles(graph):
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [node])
    return found


def components(graph):
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in graph:
        if node not in index:
            visit(node)
    return found


def show(cycle, graph):
    """`a -> b (file:line) -> a (file:line)`: each edge with the line that makes it."""
    return cycle[0] + "".join(f" -> {b} ({graph[a][b]})" for a, b in zip(cycle, cycle[1:]))


# --- files inside a folder ------------------------------------------------------------------

USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
PATH = re.compile(r"(?<![\w:$])(\w+(?:::\w+)+)")
DEFINED = re.compile(r"\b(?:fn|struct|enum|type|const|static|trait|mod|union|macro_rules!)\s+(\w+)")


def use_tree(tree):
    """The paths a use tree imports, `a::{b, c::{d, e as f}}` → [(segments, name bound)]."""
    found = []

    def walk(prefix, text):
        depth, parts, part = 0, [], ""
        for ch in text:
            depth += (ch == "{") - (ch == "}")
            if ch == "," and depth == 0:
                parts.append(part)
                part = ""
            else:
                part += ch
        parts.append(part)
        for part in (p.strip() for p in parts):
            group = re.match(r"^((?:\w+\s*::\s*)*)\{(.*)\}$", part, re.S)
            if group:
                walk(prefix + re.findall(r"\w+", group.group(1)), group.group(2))
            elif part:
                path, _, alias = part.partition(" as ")
                segments = [s.strip() for s in path.split("::") if s.strip()]
                if segments and segments[-1] == "self":
                    segments = segments[:-1]
                full = prefix + segments
                found.append((full, alias.strip() or (full[-1] if full else None)))

    walk([], tree)
    return found


def modules(root):
    """{module path: (file, {child: declared #[cfg(test)]})}, following `mod x;` from lib.rs."""
    found = {}

    def visit(path, file):
        code = product_code(open(file).read())
        children = {
            m.group(2): bool(m.group(1))
            for m in re.finditer(
                r"^(#\[cfg\(test\)\]\s*\n)?\s*(?:pub(?:\([^)]*\))?\s+)?mod (\w+);", code, re.M
            )
        }
        found[path] = (file, children)
        name = os.path.basename(file)
        base = os.path.dirname(file) if name in ("lib.rs", "mod.rs") else file[:-3]
        for child in children:
            for candidate in (os.path.join(base, child + ".rs"), os.path.join(base, child, "mod.rs")):
                if os.path.isfile(candidate):
                    visit(path + (child,), candidate)

    visit((), os.path.join(root, "lib.rs"))
    return found


def resolve(segments, module, children):
    """The absolute module path `segments` names from `module`; `None`: outside the crate."""
    first = segments[0]
    if first == "crate":
        return tuple(segments[1:])
    if first == "super":
        up = 0
        while up < len(segments) and segments[up] == "super":
            up += 1
        return tuple(module[: len(module) - up]) + tuple(segments[up:])
    if first == "self":
        return tuple(module) + tuple(segments[1:])
    if first in children:
        return tuple(module) + tuple(segments)
    return None


def references(module, file, children):
    """The file's paths into its crate as (path, line, kind, name bound), kind `use`, `pub use`
    or `path`; and its code without `use` items (lines kept)."""
    code = re.sub(r"pub\(in [^)]*\)", "pub", product_code(open(file).read()))
    found = []
    for m in USE.finditer(code):
        line = code.count("\n", 0, m.start()) + 1
        kind = "pub use" if m.group(1) else "use"
        for segments, name in use_tree(m.group(2)):
            target = resolve(segments, module, children) if segments else None
            if target is not None:
                found.append((target, line, kind, name))
    rest = USE.sub(lambda m: "\n" * m.group(0).count("\n"), code)
    for number, text in enumerate(rest.split("\n"), 1):
        for path in PATH.findall(text):
            target = resolve(path.split("::"), module, children)
            if target is not None:
                found.append((target, number, "path", None))
    return found, rest


def folder_graphs(crate, skip_top):
    """[(folder, {node: {node: "file:line"}})] for every module of `crate` with children."""
    mods = modules(os.path.join(HERE, crate))
    refs = {m: references(m, f, children) for m, (f, children) in mods.items()}
    graphs = []
    for folder, (parent_file, children) in sorted(mods.items()):
        kids = {c for c, test in children.items() if not test and folder + (c,) in mods}
        if not kids or (skip_top and folder == ()):
            continue
        parent = os.path.basename(parent_file)
        parent_refs, parent_code = refs[folder]
        defined = set(DEFINED.findall(parent_code))
        imported, globbed = {}, []
        for target, _, kind, name in parent_refs:
            inside = target[: len(folder)] == folder and len(target) > len(folder)
            if kind != "path" and inside and target[len(folder)] in kids:
                if name == "*":
                    globbed.append(target[len(folder)])
                else:
                    imported[name] = target[len(folder)]

        def node(path):
            if path[: len(folder)] != folder:
                return None
            if len(path) == len(folder):
                return parent
            item = path[len(folder)]
            if item in children:
                return item if item in kids else None
            if item in imported:
                return imported[item]
            if item in defined or not globbed:
                return parent
            return globbed[0]

        graph = {n: {} for n in sorted(kids) + [parent]}
        for module, (file, _) in sorted(mods.items()):
            source = node(module)
            if source is None:
                continue
            for target, line, kind, name in refs[module][0]:
                if module == folder and kind == "pub use":
                    # The folder's interface: an edge only where the parent's code names it.
                    named = name and name != "*" and re.search(rf"\b{re.escape(name)}\b", parent_code)
                    if not named:
                        continue
                    line = parent_code.count("\n", 0, named.start()) + 1
                used = node(target)
                if used is not None and used != source:
                    graph[source].setdefault(used, f"{os.path.relpath(file, HERE)}:{line}")
        if parent in ("mod.rs", "lib.rs"):
            where = os.path.relpath(os.path.dirname(parent_file), HERE)
        else:
            where = os.path.relpath(parent_file[:-3], HERE)
        graphs.append((where + "/", graph))
    return graphs


def folder_problems():
    problems, allowed_seen = [], set()
    for crate, skip_top in CRATES:
        for folder, graph in folder_graphs(crate, skip_top):
            allowed = [set(c) for c in ALLOWED_CYCLES.get(folder, [])]
            for component in components(graph):
                if component in allowed:
                    allowed_seen.add((folder, frozenset(component)))
                    continue
                sub = {
                    n: {m: where for m, where in graph[n].items() if m in component}
                    for n in sorted(component)
                }
                for cycle in cycles(sub):
                    problems.append(f"cycle in {folder}: {show(cycle, graph)}")
    for folder, listed in ALLOWED_CYCLES.items():
        for component in listed:
            if (folder, frozenset(component)) not in allowed_seen:
                problems.append(
                    f"ALLOWED_CYCLES[{folder!r}] lists {sorted(component)}, no longer a cycle: "
                    "delete the entry"
                )
    return problems


def main():
    order = LAYERS
    problems = [
        f"src/lib.rs declares `{m}`, which has no place in LAYERS of hack/check-layers.py"
        for m in declared()
        if m not in order
    ]
    graph = uses(order)
    for cycle in cycles(graph):
        problems.append("cycle: " + show(cycle, graph))
    for module, used in graph.items():
        for other, where in used.items():
            if order.index(other) > order.index(module):
                problems.append(f"{where}: `{module}` uses `{other}`, a later layer")
    problems += folder_problems()
    if problems:
        print("\n".join(problems))
        print("module layers are broken: see docs/architecture.md § The dependency rule")
        sys.exit(1)
    still_open = sum(len(listed) for listed in ALLOWED_CYCLES.values())
    allowed = f" but the {still_open} of ALLOWED_CYCLES" if still_open else ""
    print("module layers ok: " + " → ".join(order) + f"; no cycle inside a folder{allowed}")


if __name__ == "__main__":
    main()
