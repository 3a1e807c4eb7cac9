#!/usr/bin/env python3
"""Import circles between the modules of each crate of the workspace.

Reads every crate's Rust sources (no build), turns each `use crate::...`,
`use super::...` and each `crate::a::b` path written in the code into an
edge from the file's module to the module the path names, and prints the
circles: groups of modules that reach each other through such edges
(strongly connected components of two or more modules), with one edge of
each pair that closes a circle.

A module and its own submodules are one room: the edges between a module
and its ancestors or descendants (a parent calling its child, a child using
its parent's types) are not counted, only those between modules neither of
which contains the other. Comments are skipped, and so is `#[cfg(test)]` code unless --with-tests
(a module's tests may use floors above it, as config's use log's capture).
Paths through a `pub use` re-export (`crate::Comm`) are followed to the
module that defines the item.

Usage: python3 tools/import_circles.py [--edges] [--with-tests] [--crate NAME]
Exit status 0 whatever it finds; the count is on the last line.
"""

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def crates():
    """(name, src dir, root files) of each workspace member with a src/."""
    text = open(os.path.join(ROOT, "Cargo.toml")).read()
    members = re.search(r"members\s*=\s*\[([^\]]*)\]", text).group(1)
    for m in re.findall(r'"([^"]+)"', members):
        src = os.path.join(ROOT, m, "src")
        roots = [f for f in ("lib.rs", "main.rs") if os.path.exists(os.path.join(src, f))]
        if roots:
            yield m, src, roots


def strip_comments(text):
    """Drops // and /* */ comments and the contents of string literals."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not re.match(r"\w", text[i - 1])):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            out.append('""')
            i = n if end < 0 else end + 1 + len(hashes)
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""')
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or text.startswith("'\\", i):
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\x[0-9a-fA-F]{2}|\\.|[^\\'])'", text[i:])
            if m:
                out.append("' '")
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_tests(code):
    """Drops each item under `#[cfg(test)]` (a test module, helper or
    use-line) and returns the code left and the names of file modules
    declared test-only (`#[cfg(test)] mod tests;`)."""
    out, test_mods, i = [], [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]", code):
        if m.start() < i:
            continue
        out.append(code[i : m.start()])
        j = m.end()
        while j < len(code) and code[j] not in ";{":
            j += 1
        head = code[m.end() : j]
        fm = re.search(r"\bmod\s+(" + IDENT + r")\s*$", head)
        if j < len(code) and code[j] == ";":
            if fm:
                test_mods.append(fm.group(1))
            i = j + 1
            continue
        depth = 0
        while j < len(code):
            depth += (code[j] == "{") - (code[j] == "}")
            j += 1
            if depth == 0:
                break
        i = j
    out.append(code[i:])
    return "".join(out), test_mods


def module_of(src, path):
    """The module path (tuple) of a source file under src."""
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("lib", "main", "mod"):
        rel = rel[:-1]
    return tuple(rel)


def expand_use(tree):
    """The paths of one use tree (whitespace removed, `x as y` written
    `x@y`): `a::{b, c::{d@e}}` -> [a::b, a::c::d@e]."""
    tree = re.sub(r"\s+", "", tree)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            depth += (ch == "{") - (ch == "}")
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        return parts

    def walk(prefix, s):
        brace = s.find("{")
        if brace >= 0 and s.endswith("}"):
            head = [p for p in s[:brace].split("::") if p]
            res = []
            for part in split_top(s[brace + 1 : -1]):
                res += walk(prefix + head, part)
            return res
        return [prefix + [p for p in s.split("::") if p]] if s else []

    return walk([], tree)


def parse_uses(code):
    """Each `use` statement's paths and bound names, and whether it is pub."""
    res = []
    for m in re.finditer(r"(\bpub(?:\([^)]*\))?\s+)?\buse\s+([^;]+);", code):
        tree = m.group(2)
        tree = re.sub(r"\s+as\s+(" + IDENT + ")", r"@\1", tree)
        for full in expand_use(tree):
            name = full[-1]
            if "@" in name:
                name_, alias = name.split("@")
                full = full[:-1] + [name_]
                name = alias
            res.append((full, name, bool(m.group(1))))
    return res


class Crate:
    def __init__(self, name, src, roots, tests):
        self.name = name
        self.files = {}
        for dirpath, _, names in os.walk(src):
            for f in names:
                if f.endswith(".rs"):
                    p = os.path.join(dirpath, f)
                    if os.path.dirname(p) == src and f == "main.rs" and "lib.rs" in roots:
                        continue  # the binary's root: the lib is the crate
                    self.files[module_of(src, p)] = strip_comments(open(p).read())
        # A file named by #[path = "f.rs"] mod m; is module m of the file naming it.
        for dirpath, _, names in os.walk(src):
            for f in names:
                if not f.endswith(".rs"):
                    continue
                p = os.path.join(dirpath, f)
                for pm in re.finditer(r'#\[path\s*=\s*"([^"]+)"\]\s*(?:pub\s+)?mod\s+(' + IDENT + ")", open(p).read()):
                    target = os.path.normpath(os.path.join(dirpath, pm.group(1)))
                    wrong = module_of(src, target)
                    if wrong in self.files:
                        self.files[module_of(src, p) + (pm.group(2),)] = self.files.pop(wrong)
        if not tests:
            dropped = set()
            for mod in list(self.files):
                self.files[mod], test_mods = strip_tests(self.files[mod])
                dropped |= {mod + (t,) for t in test_mods}
            for mod in list(self.files):
                if any(mod[: len(d)] == d for d in dropped):
                    del self.files[mod]
        self.modules = set(self.files)
        self.uses = {m: parse_uses(c) for m, c in self.files.items()}
        self.reexports = {
            m: {name: full for full, name, pub in u if pub} for m, u in self.uses.items()
        }

    def absolute(self, mod, segs):
        """segs (a path as written in module mod) made absolute, or None if
        it names another crate or a std item."""
        if not segs:
            return None
        if segs[0] == "crate":
            return list(segs[1:])
        if segs[0] == "self":
            return list(mod) + list(segs[1:])
        if segs[0] == "super":
            base = list(mod)
            i = 0
            while i < len(segs) and segs[i] == "super":
                base = base[:-1]
                i += 1
            return base + list(segs[i:])
        return None

    def resolve(self, path, seen=0):
        """The module a crate-absolute path names: its longest module prefix,
        followed through pub use re-exports."""
        for k in range(len(path), -1, -1):
            pre = tuple(path[:k])
            if pre in self.modules:
                rest = path[k:]
                if rest and seen < 8:
                    target = self.reexports.get(pre, {}).get(rest[0])
                    if target is not None:
                        t = self.absolute(pre, target)
                        if t is not None and t != list(path):
                            return self.resolve(t + list(rest[1:]), seen + 1)
                return pre
        return ()

    def edges(self):
        """{(from, to)} between modules, plus an example path for each."""
        out = {}
        for mod, code in self.files.items():
            bound = {}
            for full, name, _ in self.uses[mod]:
                a = self.absolute(mod, full)
                if a is None and full and full[0] in bound:
                    a = bound[full[0]] + full[1:]
                if a is None and full and (mod + (full[0],)) in self.modules:
                    a = list(mod) + full  # 2018 paths: a child module by name
                if a is None:
                    continue
                if name and name not in ("self", "*"):
                    bound[name] = a
                if full[-1] == "self":
                    bound[full[-2] if len(full) > 1 else name] = a[:-1]
                    a = a[:-1]
                if full[-1] == "*":
                    a = a[:-1]
                out.setdefault((mod, self.resolve(a)), "use " + "::".join(full))
            body = re.sub(r"\buse\s+[^;]+;", "", code)
            for m in re.finditer(r"\b(" + IDENT + r")((?:\s*::\s*" + IDENT + r")+)", body):
                first = m.group(1)
                segs = [first] + [s.strip() for s in m.group(2).split("::")[1:]]
                if first in ("crate", "self", "super"):
                    a = self.absolute(mod, segs)
                elif first in bound:
                    a = bound[first] + segs[1:]
                elif mod + (first,) in self.modules:
                    a = list(mod) + segs
                else:
                    continue
                out.setdefault((mod, self.resolve(a)), "::".join(segs))
        res = {}
        for (a, b), how in out.items():
            if a == b or a[: len(b)] == b or b[: len(a)] == a:
                continue  # same module, or one contains the other
            res[(a, b)] = how
        return res


def circles(nodes, edges):
    """Strongly connected components of two or more nodes (Tarjan)."""
    graph = {n: [] for n in nodes}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index, low, stack, on, comps = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
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
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(comps)


def name(mod):
    return "::".join(mod) if mod else "(root)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--edges", action="store_true", help="print every counted edge")
    ap.add_argument("--crate", help="only this member (its folder, e.g. core)")
    ap.add_argument(
        "--with-tests",
        action="store_true",
        help="count #[cfg(test)] code too (a test may use a floor above its module's)",
    )
    args = ap.parse_args()
    total = 0
    for member, src, roots in crates():
        if args.crate and member != args.crate:
            continue
        c = Crate(member, src, roots, args.with_tests)
        edges = c.edges()
        if args.edges:
            for (a, b), how in sorted(edges.items()):
                print(f"{member}: {name(a)} -> {name(b)}   ({how})")
        for comp in circles(c.modules, edges):
            total += 1
            inside = set(comp)
            print(f"{member}: circle of {len(comp)}: {', '.join(name(m) for m in comp)}")
            for (a, b), how in sorted(edges.items()):
                if a in inside and b in inside:
                    print(f"    {name(a)} -> {name(b)}   ({how})")
    print(f"import circles: {total}")


if __name__ == "__main__":
    main()
