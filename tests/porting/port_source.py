"""The Neural Forge variant of a torch program, made by rewriting its import lines only, and the
count of the lines in which the two variants differ.

A program is written once, in torch. Its import statements are rewritten by module name
(``torch`` -> ``neural_arch``, ``horovod.torch`` -> ``neural_arch.horovod``) keeping every name
they bind, so the rest of the program reads the same module objects under the same names:

    import torch                      ->  import neural_arch as torch
    import torch.nn.functional as F   ->  import neural_arch.nn.functional as F
    import torch, time                ->  import neural_arch as torch, time
    import torch.utils.data.distributed  ->  import neural_arch as torch, neural_arch.utils.data.distributed
    from torch.optim import SGD       ->  from neural_arch.optim import SGD
    import horovod.torch as hvd       ->  import neural_arch.horovod as hvd

A line that needs more than that to run here says so in place, with the code it needs here
after ``# port:``; it is counted as an "other" line. A line marked ``# CPU:`` is an edit of the
original program that any CPU run needs, under torch too (a device or backend name); both
variants share it, and it is counted apart.
"""
from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass

MODULE_MAP = (("horovod.torch", "neural_arch.horovod"), ("torch", "neural_arch"))
PORT_MARK = re.compile(r"#\s*port:\s*(?P<code>.+?)\s*$")
CPU_MARK = re.compile(r"#\s*CPU:")
FROM_MODULE = re.compile(r"^(?P<head>\s*from\s+)(?P<module>[\w.]+)(?P<tail>\s+import\b)")


@dataclass(frozen=True)
class LineCounts:
    """Lines of the torch program that differ in the ported one, by kind, and its CPU edits."""
    imports: int
    cpu: int
    other: int
    other_lines: tuple = ()  # (line number, torch's line) for each "other" line


def ported_module(name: str) -> str | None:
    """Our module for one of torch's (or Horovod's), None for a module that is not torch's."""
    for theirs, ours in MODULE_MAP:
        if name == theirs or name.startswith(theirs + "."):
            return ours + name[len(theirs):]
    return None


def _ported_import(node: ast.Import) -> str:
    names = []
    for alias in node.names:
        ours = ported_module(alias.name)
        if ours is None:
            names.append(alias.name + (f" as {alias.asname}" if alias.asname else ""))
        elif alias.asname:
            names.append(f"{ours} as {alias.asname}")
        else:
            # `import torch.a.b` binds `torch`; ours binds `neural_arch`, so bind `torch` too
            top = alias.name.split(".")[0]
            names.append(f"{ported_module(top)} as {top}")
            if "." in alias.name:
                names.append(ours)
    return "import " + ", ".join(names)


def _ported_statement(lines: list, node) -> list:
    """The lines of one import statement as they read in our variant."""
    first, last = node.lineno - 1, node.end_lineno - 1
    indent = lines[first][:len(lines[first]) - len(lines[first].lstrip())]
    if isinstance(node, ast.Import):
        if not any(ported_module(a.name) for a in node.names):
            return lines[first:last + 1]
        if first != last:
            raise ValueError(f"line {node.lineno}: an `import` statement over several lines")
        comment = lines[first][len(indent) + len(ast.get_source_segment(
            "\n".join(lines), node)):]
        return [indent + _ported_import(node) + comment]
    if node.level or ported_module(node.module or "") is None:
        return lines[first:last + 1]
    match = FROM_MODULE.match(lines[first])
    if match is None or match["module"] != node.module:
        raise ValueError(f"line {node.lineno}: cannot find the module in {lines[first]!r}")
    head = match["head"] + ported_module(node.module) + match["tail"]
    return [head + lines[first][match.end():]] + lines[first + 1:last + 1]


def port(source: str) -> tuple[str, LineCounts]:
    """Our variant of the torch program ``source``, and how many lines differ, by kind."""
    lines = source.splitlines()
    tree = ast.parse(source)
    ported = list(lines)
    import_lines = set()
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    for node in sorted(imports, key=lambda n: n.lineno, reverse=True):
        new = _ported_statement(lines, node)
        ported[node.lineno - 1:node.end_lineno] = new
        import_lines.update(range(node.lineno - 1, node.end_lineno))
    for number, line in enumerate(lines):
        mark = PORT_MARK.search(line)
        if mark is not None:
            if number in import_lines:
                raise ValueError(f"line {number + 1}: `# port:` on an import line")
            indent = line[:len(line) - len(line.lstrip())]
            # import statements are rewritten one line for one line, so numbers still match
            ported[number] = indent + mark["code"]
    cpu = sum(1 for line in lines if CPU_MARK.search(line))
    imports_changed, other = 0, []
    matcher = difflib.SequenceMatcher(a=lines, b=ported, autojunk=False)
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        if tag == "equal":
            continue
        changed = range(a0, max(a1, a0 + (b1 - b0)))
        for number in changed:
            if number in import_lines:
                imports_changed += 1
            else:
                other.append((number + 1, lines[min(number, len(lines) - 1)].strip()))
    return "\n".join(ported) + "\n", LineCounts(imports_changed, cpu, len(other), tuple(other))
