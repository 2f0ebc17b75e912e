"""MkDocs hook (mkdocs.yml's `hooks:`): the reference page's list of `TrainingArguments` fields, generated from the
dataclass at every build, so it cannot drift from the code.

A page holding the marker `<!-- training-arguments-fields -->` gets, in its place, one table per group of fields (the
groups are the `# --- Group ---` comments of the class's source), each field with its type, default and help text;
cadence's own fields (not in `transformers.TrainingArguments`) are marked. tests/docs/test_docs.py checks that the
generated text names every field. A code block marked `<!-- not run: REASON -->` gets its reason shown above it, one
marked `<!-- file: NAME -->` the name it is saved as.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import html
import inspect
import re
import textwrap

MARKER = "<!-- training-arguments-fields -->"
# `<!-- not run: REASON -->` before a code block (tests/doc_blocks.py skips it): shown on the site as a line above it
_NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.*?)\s*-->\n", re.M)
# `<!-- file: NAME -->` before a code block (the tests save it as NAME, which a later command runs): the name shown
_FILE = re.compile(r"^<!--\s*file:\s*(\S+?)\s*-->\n", re.M)
_GROUP = re.compile(r"^\s*# --- (.+?) ---")


def _help_text(call: ast.expr | None) -> str:
    """The help text a field's `metadata=_help("...")` (or `_help_4x`) names in the source."""
    if not isinstance(call, ast.Call):
        return ""
    for keyword in call.keywords:
        if keyword.arg == "metadata" and isinstance(keyword.value, ast.Call) and keyword.value.args:
            text = keyword.value.args[0]
            if isinstance(text, ast.Constant) and isinstance(text.value, str):
                return text.value
    return ""


def _default(field: dataclasses.Field) -> str:
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    elif field.default is dataclasses.MISSING:
        return "(required)"
    else:
        value = field.default
    if isinstance(value, enum.Enum):
        value = value.value
    return repr(value)


def _cell(text: str, code: bool = False) -> str:
    """A table cell: one line, HTML-escaped (help texts hold `<time>`), `|` as an entity (a table's separator)."""
    text = html.escape(" ".join(text.split()), quote=False).replace("|", "&#124;")
    return f"<code>{text}</code>" if code else text


def field_groups(cls=None) -> list[tuple[str, list[dict]]]:
    """[(group, [{name, type, default, help, own}])] in the class's order; a field the source does not show (a
    subclass's, say) goes to a last group, so every field of the dataclass is listed."""
    if cls is None:
        from cadence import TrainingArguments as cls
    module = inspect.getmodule(cls)
    own = set(getattr(module, "CADENCE_ONLY", ()))
    lines, first = inspect.getsourcelines(cls)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    groups: list[tuple[str, list[dict]]] = []
    seen: set[str] = set()
    fields = {f.name: f for f in dataclasses.fields(cls)}
    group_at = {i: m[1] for i, line in enumerate(lines, 1) if (m := _GROUP.match(line))}
    for node in tree.body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        if name not in fields:
            continue
        group = next((group_at[i] for i in sorted(group_at, reverse=True) if i <= node.lineno), "Fields")
        if not groups or groups[-1][0] != group:
            groups.append((group, []))
        groups[-1][1].append({"name": name, "type": ast.unparse(node.annotation), "default": _default(fields[name]),
                              "help": _help_text(node.value), "own": name in own or "cadence only" in group})
        seen.add(name)
    rest = [f for name, f in fields.items() if name not in seen]
    if rest:
        groups.append(("Other fields", [{"name": f.name, "type": str(f.type), "default": _default(f),
                                         "help": f.metadata.get("help", ""), "own": f.name in own} for f in rest]))
    return groups


def fields_markdown(cls=None) -> str:
    out = []
    for group, rows in field_groups(cls):
        out += [f"### {group[0].upper()}{group[1:]}", "", "| field | type | default | what it does |", "|---|---|---|---|"]
        for row in rows:
            mark = " **(cadence only)**" if row["own"] else ""
            out.append(f"| `{row['name']}`{mark} | {_cell(row['type'], code=True)} | "
                       f"{_cell(row['default'], code=True)} | {_cell(row['help'])} |")
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - MkDocs' hook signature
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, fields_markdown())
    markdown = _FILE.sub(lambda m: f"Saved as `{m[1]}`:\n\n", markdown)
    return _NOT_RUN.sub(lambda m: f"*Not run by the documentation's tests: {m[1]}.*\n\n", markdown)
