"""What the Python rules know about the candidate module before judging it: import aliases (followed through
plain assignments), its trusted ``load_inline`` calls, ``ModelNew`` and its methods, the extension objects
(what ``load_inline`` returned, however it was stored), and what ``forward`` reaches."""
from __future__ import annotations

import ast

from kevin_exp.bench.ast_names import (
    import_aliases,
    is_load_inline,
    load_inline_names,
    parent_map,
    qualname,
)


class CandidateModule:
    """The facts the Python rules share, gathered once per candidate (see the module docstring)."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.nodes = list(ast.walk(tree))
        self.parents = parent_map(tree)
        self.aliases = import_aliases(tree)
        trusted = load_inline_names(tree, dict(self.aliases))
        self._propagate_aliases()
        self.li_calls = {n for n in self.nodes if is_load_inline(n, trusted)}
        models = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"]
        self.model = models[-1] if models else None
        self.methods = {f.name: f for f in (self.model.body if self.model else [])
                        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.ext_names, self.ext_attrs = self._extension_refs()

    def _propagate_aliases(self) -> None:
        assigns = [n for n in self.nodes if isinstance(n, ast.Assign) and len(n.targets) == 1
                   and isinstance(n.targets[0], ast.Name)]
        for _ in range(3):  # `mm = torch.matmul` / `F2 = F`: later uses resolve through the alias
            changed = False
            for node in assigns:
                q = qualname(node.value, self.aliases)
                if q and node.targets[0].id not in self.aliases:  # type: ignore[attr-defined]
                    self.aliases[node.targets[0].id] = q  # type: ignore[attr-defined]
                    changed = True
            if not changed:
                break

    def _extension_refs(self) -> tuple[set[str], set[str]]:
        builders = set()
        for call in self.li_calls:  # functions that contain a load_inline call
            node: ast.AST | None = call
            while node is not None:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    builders.add(node.name)
                node = self.parents.get(node)
        names: set[str] = set()
        attrs: set[str] = set()

        def is_ext(e: ast.AST) -> bool:
            # the extension object itself or one of its attributes, never the result of calling it
            if e in self.li_calls:
                return True
            if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id in builders:
                return True
            if isinstance(e, ast.Name):
                return e.id in names
            if isinstance(e, ast.Attribute):
                return self._self_attr(e, attrs) or is_ext(e.value)
            if isinstance(e, ast.IfExp):
                return is_ext(e.body) or is_ext(e.orelse)
            return isinstance(e, ast.BoolOp) and any(is_ext(v) for v in e.values)

        bindings = [n for n in self.nodes if isinstance(n, (ast.Assign, ast.AnnAssign, ast.NamedExpr))
                    and n.value is not None]
        for _ in range(3):
            for node in bindings:
                if not is_ext(node.value):  # type: ignore[attr-defined]
                    continue
                for t in getattr(node, "targets", None) or [node.target]:
                    if isinstance(t, ast.Name):
                        names.add(t.id)
                        if self.model is not None and self.parents.get(node) is self.model:
                            attrs.add(t.id)  # class attribute: used as self.<name>
                    elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        attrs.add(t.attr)
        return names, attrs

    @staticmethod
    def _self_attr(node: ast.AST, attrs: set[str]) -> bool:
        return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                and node.attr in attrs)

    def is_ext_receiver(self, node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id in self.ext_names) or self._self_attr(node, self.ext_attrs)

    def _reachable(self, forward: ast.AST) -> list[ast.AST]:
        """forward, the ModelNew methods it uses and the module-level functions/classes it names."""
        module_defs = {n.name: n for n in self.tree.body
                       if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        todo, seen = [forward], {}
        while todo:
            fn = todo.pop()
            if id(fn) in seen:
                continue
            seen[id(fn)] = fn
            for n in ast.walk(fn):
                if isinstance(n, ast.Name) and n.id in module_defs:
                    todo.append(module_defs[n.id])
                elif self._self_attr(n, set(self.methods)):
                    todo.append(self.methods[n.attr])  # type: ignore[attr-defined]
        for cls in [f for f in seen.values() if isinstance(f, ast.ClassDef)]:
            seen.update({id(m): m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))})
        return list(seen.values())

    def _forward_uses_extension(self, forward: ast.AST) -> bool:
        return any(n in self.li_calls or self.is_ext_receiver(n)
                   for fn in self._reachable(forward) for n in ast.walk(fn))

