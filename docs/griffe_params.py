"""A griffe extension for the API reference: parameter lists as tables.

streambatch's docstrings describe parameters as ``name: text`` lines, sometimes
under an ``Args:`` header, sometimes not, and sometimes several names in one
entry (``rank, world_size: ...``). The Google-style parser that builds the
parameter tables (name, type from the annotation, default from the signature)
wants one name per entry under a header. This extension rewrites each
docstring of the ``streambatch`` package before it is parsed: a run of
``name: text`` lines whose names are all parameters of the signature becomes
an ``Args:`` section, and a several-name entry becomes one entry per name.
The package's source is not touched.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ENTRY = re.compile(r"^(?P<names>\*{0,2}\w+(?:, \*{0,2}\w+)*): ?(?P<text>.*)$")
_SECTION = re.compile(r"^(Args|Arguments|Parameters|Params|Returns|Return|Yields|Raises|Examples?|Notes?|"
                      r"Warns|Warnings?|Attributes|Other Parameters|Receives|See Also):\s*$")
_ARGS = ("Args", "Arguments", "Parameters", "Params")


def _split(names: str) -> list[str]:
    return [n.strip() for n in names.split(",")]


def _bare(name: str) -> str:
    return name.lstrip("*")


def _entries(first: str, names: list[str], indent: str, rest: list[str]) -> list[str]:
    """One Args entry per name; the first keeps the text, the others point to it."""
    out = [f"{indent}{names[0]}: {first}".rstrip(), *rest]
    for other in names[1:]:
        out.append(f"{indent}{other}: see `{_bare(names[0])}`.")
    return out


def rewrite(doc: str, params: set[str]) -> str:
    """``doc`` with its parameter lines as one Google ``Args:`` entry per parameter."""
    lines = doc.split("\n")
    out: list[str] = []
    i = 0
    section = None
    while i < len(lines):
        line = lines[i]
        head = _SECTION.match(line)
        if head:
            section = head.group(1)
            out.append(line)
            i += 1
            continue
        m = _ENTRY.match(line.strip()) if line.strip() else None
        indent = line[: len(line) - len(line.lstrip())]
        if line and not indent and section != "Args*":
            section = None  # text at column 0 ends a section
        in_args = section in _ARGS and indent == "    "
        bare = m is not None and not indent and section in (None, "Args*")
        if m and (in_args or bare) and all(_bare(n) in params for n in _split(m["names"])):
            # the entry's continuation: the following lines indented deeper than the entry
            j = i + 1
            while j < len(lines) and lines[j].strip() and len(lines[j]) - len(lines[j].lstrip()) > len(indent):
                j += 1
            rest = lines[i + 1 : j]
            if bare:  # a header-less run: open an Args section and indent it
                if section != "Args*":
                    if out and out[-1].strip():
                        out.append("")
                    out.append("Args:")
                section = "Args*"
                rest = ["    " + r for r in rest]
                out.extend(_entries(m["text"], _split(m["names"]), "    ", rest))
            else:
                out.extend(_entries(m["text"], _split(m["names"]), indent, rest))
            i = j
            continue
        if section == "Args*" and line.strip():
            section = None
            if out and out[-1].strip():
                out.append("")  # the text after the run is prose again
        out.append(line)
        i += 1
    return "\n".join(out)


def _params(obj: griffe.Object) -> set[str]:
    if isinstance(obj, griffe.Class):
        init = obj.members.get("__init__")
        fn = init if isinstance(init, griffe.Function) else None
        names = {p.name for p in fn.parameters} if fn else set()
        # dataclasses: their fields are the constructor's parameters
        names |= {n for n, m in obj.members.items() if isinstance(m, griffe.Attribute) and not n.startswith("_")}
        return names - {"self"}
    if isinstance(obj, griffe.Function):
        return {p.name for p in obj.parameters} - {"self", "cls"}
    return set()


class ParamBlocks(griffe.Extension):
    """Rewrite every docstring of the package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name == "streambatch":
            self._walk(pkg, set())

    def _walk(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None and isinstance(obj, (griffe.Class, griffe.Function)):
            params = _params(obj)
            if params:
                obj.docstring.value = rewrite(obj.docstring.value, params)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member, seen)
