#!/usr/bin/env python3
"""Fails when a module of src/ uses one that comes after it in LAYERS, or when the modules'
`crate::` references form a cycle (docs/architecture.md § The dependency rule).

LAYERS is the layer order (src/lib.rs declares the modules in the same order): a module may use
only the modules listed before it. Every `crate::<module>` path counts (in `use` lines and
inline), except in comments and in the `#[cfg(test)] mod tests` block at the end of a file, which
may use anything. A module declared in src/lib.rs but missing here fails the check: place it.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


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


def declared():
    text = open(os.path.join(ROOT, "lib.rs")).read()
    return re.findall(r"^pub mod (\w+);", text, re.M)


def product_code(text):
    """The file without its trailing `#[cfg(test)] mod tests` and without comments."""
    cut = re.search(r"^#\[cfg\(test\)\]\s*\nmod \w+ \{", text, re.M)
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
                        where = f"{os.path.relpath(path, os.path.join(ROOT, '..'))}:{number}"
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


def main():
    order = LAYERS
    problems = [
        f"src/lib.rs declares `{m}`, which has no place in LAYERS of hack/check-layers.py"
        for m in declared()
        if m not in order
    ]
    graph = uses(order)
    for cycle in cycles(graph):
        problems.append("cycle: " + " -> ".join(cycle))
    for module, used in graph.items():
        for other, where in used.items():
            if order.index(other) > order.index(module):
                problems.append(f"{where}: `{module}` uses `{other}`, a later layer")
    if problems:
        print("\n".join(problems))
        print("module layers are broken: see docs/architecture.md § The dependency rule")
        sys.exit(1)
    print("module layers ok: " + " → ".join(order))


if __name__ == "__main__":
    main()
