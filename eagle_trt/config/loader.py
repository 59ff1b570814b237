"""Read, validate, override, describe and write eagle_config.yaml.

Every failure becomes a ConfigError whose text has one line per problem, each starting with the
file name, so the CLI can print it as-is:

    >>> from eagle_trt.config.loader import parse_config
    >>> parse_config({"draft_length": 0}, source="my.yaml")
    Traceback (most recent call last):
    ...
    eagle_trt.errors.ConfigError: my.yaml: draft_length: Input should be greater than or equal to 1 (got 0)
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from eagle_trt.config.schema import EagleConfig
from eagle_trt.errors import ConfigError

_MAX_SHOWN = 60  # long values (a whole static_tree) are cut so each error stays one line


def load_config(path: str | Path) -> EagleConfig:
    """Read and validate a YAML config file. An empty file gives all defaults."""
    path = Path(path)
    if not path.is_file():
        what = ("is a directory, not a file" if path.is_dir() else
                "is not a regular file (a device or a pipe); give a YAML file" if path.exists() else "not found")
        raise ConfigError(f"config file '{path}' {what}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file '{path}' cannot be read: {exc}") from exc
    data = load_yaml(text, path)
    return parse_config({} if data is None else data, source=str(path))


MAX_VALUES = 100_000  # a config holds a few hundred values; a static_tree a few thousand
MAX_DEPTH = 32  # a config is three levels deep at most (static_tree: a list of lists)


def load_yaml(text: str, path: Path) -> Any:
    """Safe YAML with a bound on what aliases expand to: an "alias bomb" (anchors of lists of aliases of the
    previous anchor) is a few KB of text but billions of values once walked, so it is refused from the node graph
    before anything is built. Nesting deeper than Python's recursion allows is refused too."""
    try:
        loader = _UniqueKeyLoader(text)  # reads the text: a character YAML forbids fails here
        _check_depth(text, path)
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error(path, exc)) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        values = _expanded_size(node)
        if values > MAX_VALUES:
            raise ConfigError(f"config file '{path}' expands to more than {MAX_VALUES:,} values (YAML anchors and "
                              "aliases); write the values out instead of aliasing them")
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error(path, exc)) from None
    except RecursionError:
        raise ConfigError(f"config file '{path}' is nested too deeply to be a config") from None
    finally:
        loader.dispose()


def _check_depth(text: str, path: Path) -> None:
    """Refuse nesting deeper than MAX_DEPTH from YAML's event stream (an iterative parser: no recursion, so fast
    however deep), before the recursive composer sees it."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigError(f"config file '{path}' is nested more than {MAX_DEPTH} levels deep; a config "
                                  "needs three at most")
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1


def _expanded_size(root: yaml.Node) -> int:
    """How many values the document has once every alias is replaced by what it names (each distinct node is
    counted once and its size reused, so this is fast however large the expansion); a node that contains itself
    counts as too many."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        kids = _children(node)
        if children_done:
            open_nodes.discard(id(node))
            sizes[id(node)] = min(1 + sum(sizes[id(k)] for k in kids), MAX_VALUES + 1)
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_nodes:
            return MAX_VALUES + 1  # an alias of an enclosing anchor: endless
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((k, False) for k in kids)
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def parse_config(data: Any, source: str = "<config>") -> EagleConfig:
    """Validate an already-parsed mapping; `source` names it in error lines."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping of field: value (got {type(data).__name__})"
        )
    try:
        return EagleConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from exc


def override_config(cfg: EagleConfig, overrides: dict[str, Any], source: str = "command line") -> EagleConfig:
    """Return cfg with `overrides` applied and everything re-validated (cross-field rules too).

    Keys may be dotted (`eagle_architecture.hidden_size`); None values are skipped, so a CLI can
    pass every option and only the ones the user set take effect.
    """
    data = cfg.model_dump()
    for key, value in overrides.items():
        if value is None:
            continue
        *parents, leaf = key.split(".")
        node = data
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = str(value) if isinstance(value, Path) else value  # CLI paths; the schema wants str
    return parse_config(data, source=source)


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line per error: `<source>: <field>: <message> (got <value>)`."""
    lines = []
    for err in exc.errors():
        loc = err["loc"]
        field = _dotted(loc)
        if err["type"] == "extra_forbidden":
            valid = ", ".join(_model_at(loc[:-1]).model_fields)
            lines.append(f"{source}: {field}: unknown field; valid fields: {valid}")
        elif err["type"] == "cross_field" or not loc:
            lines.append(f"{source}: {err['msg']}")
        elif err["type"] == "missing":
            lines.append(f"{source}: {field}: required field is missing")
        else:
            lines.append(f"{source}: {field}: {err['msg']} (got {_shown(err['input'])})")
    return "\n".join(lines)


def describe_fields() -> list[tuple[str, str, str, str]]:
    """(dotted name, type, default, description) for every field, nested ones after their parent."""
    rows: list[tuple[str, str, str, str]] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            default = "required" if info.is_required() else _shown(info.default)
            rows.append((prefix + name, _type_name(info), default, info.description or ""))
            sub = _submodel(info.annotation)
            if sub is not None:
                walk(sub, f"{prefix}{name}.")

    walk(EagleConfig, "")
    return rows


def dump_config(cfg: EagleConfig) -> str:
    """The config as YAML, fields in schema order (load_config reads it back unchanged)."""
    return yaml.dump(cfg.model_dump(mode="json"), Dumper=_Dumper, sort_keys=False)



class _Dumper(yaml.SafeDumper):
    """Block style for mappings, but flow style for lists of scalars: static_tree stays readable."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(not isinstance(x, (dict, list)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a repeated key; plain PyYAML silently keeps the last value."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, typing.Hashable):
                continue  # super() reports unhashable keys itself
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml_error(path: Path, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unknown position"
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"config file '{path}' is not valid YAML ({where}): {problem}"


def _dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else ("null" if value is None else str(value))
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _submodel(annotation: Any) -> type[BaseModel] | None:
    for arg in (annotation, *typing.get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _model_at(loc: tuple) -> type[BaseModel]:
    model: type[BaseModel] = EagleConfig
    for part in loc:
        info = model.model_fields.get(part) if isinstance(part, str) else None
        sub = _submodel(info.annotation) if info else None
        if sub is None:
            break
        model = sub
    return model


def _type_name(info: Any) -> str:
    text = _type_text(info.annotation)
    bounds = {k: getattr(m, k) for m in info.metadata for k in ("ge", "gt", "le", "lt") if hasattr(m, k)}
    low = f"[{bounds['ge']}" if "ge" in bounds else (f"({bounds['gt']}" if "gt" in bounds else None)
    high = f"{bounds['le']}]" if "le" in bounds else (f"{bounds['lt']})" if "lt" in bounds else None)
    if low and high:
        return f"{text} in {low}, {high}"
    if low:
        return f"{text} {'>=' if 'ge' in bounds else '>'} {low[1:]}"
    return text


def _type_text(ann: Any) -> str:
    """Readable YAML-ish type: Literal -> 'a' | 'b', Optional -> ... | null, models -> mapping."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if ann is type(None):
        return "null"
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin is typing.Annotated:
        return _type_text(args[0])
    if origin is list:
        return f"list[{_type_text(args[0])}]"
    if origin in (typing.Union, types.UnionType):  # also X | None
        return " | ".join(_type_text(a) for a in args)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "mapping"
    return getattr(ann, "__name__", str(ann))
