"""The tuned config: the user's Lightning CLI config with the chosen changes, written beside it.

``CFG.yaml`` is only read, never written: the result goes to ``CFG.tuned.yaml`` (atomically), and the diff
between the two (both written the same way, so only the changed keys show) is returned for printing. The file is
edited as YAML nodes, not as loaded values: an alias stays an alias under the user's anchor name, and a change
under a mapping that an alias or a merge key (``<<: *base``) shares with another section is made in a copy of it
(the path down to the key copied), so the other section keeps its value; the diff ends with a line for each such
copy and each anchor the change removed. YAML comments and flow style of the original are not carried over
(PyYAML does not keep comments). :func:`check_tuned_output` runs before any fit: an existing ``CFG.tuned.yaml``
is replaced only when asked (``--overwrite``), and a folder that cannot take the file is named, with its errno,
before minutes of rounds are spent.
"""

from __future__ import annotations

import difflib
import errno
import io
import os
from collections.abc import Iterator
from typing import Any

import yaml

from lightning_perf.atomic_file import atomic_open, describe_os_error, probe_write
from lightning_perf.trial.spec import TrialError
from lightning_perf.yaml_budget import YamlBudgetError, compose_yaml, node_children

TUNED_SUFFIX = ".tuned"
STR_TAG, MAP_TAG, MERGE_TAG = "tag:yaml.org,2002:str", "tag:yaml.org,2002:map", "tag:yaml.org,2002:merge"


def tuned_path(config_path: str) -> str:
    """``dir/cfg.yaml`` -> ``dir/cfg.tuned.yaml``."""
    stem, ext = os.path.splitext(config_path)
    return f"{stem}{TUNED_SUFFIX}{ext or '.yaml'}"


def check_tuned_output(config_path: str, overwrite: bool) -> str:
    """The tuned config's path, once sure it can be written: no file there unless ``overwrite``, and its folder
    takes a new file (a real one, made and removed: a read-only file system or an immutable folder fails
    here as the write would, where a permission check alone would pass for root)."""
    path = tuned_path(config_path)
    if os.path.isdir(path):
        raise TrialError(f"cannot write the tuned config {path}: it is a directory (EISDIR); move it away")
    if os.path.lexists(path) and not overwrite:
        raise TrialError(
            f"{path} already exists (an earlier tune's result, or a file of yours) and tune writes its result "
            "there; pass --overwrite to replace it, or move it away"
        )
    folder = os.path.dirname(os.path.abspath(path))
    try:
        probe_write(folder)
    except OSError as err:
        raise TrialError(
            f"cannot write the tuned config {path}: its folder {folder} is not writable ({describe_os_error(err)}); "
            "make it writable or tune a copy of the config in a folder you can write"
        ) from None
    return path


def apply_changes(config: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with each dotted key (``data.init_args.num_workers``) set, sections made as needed; a
    section ``config`` shares with another (one dict in two places, as a YAML alias loads) is copied first."""
    root = _represent(config)  # a shared dict becomes one node held twice, as an alias
    if not isinstance(root, yaml.MappingNode):
        raise TypeError(f"config: expected a dict, got {type(config).__name__}")
    _set_keys(root, changes, {})
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_document(root)
    finally:
        loader.dispose()


def write_tuned(config_path: str, changes: dict[str, Any], overwrite: bool = True) -> tuple[str, str]:
    """Write ``CFG.tuned.yaml`` with ``changes``; returns its path and a unified diff against the original.

    Raises:
        OSError: the file could not be written (its ``filename`` is the tuned config's path); ``EEXIST`` when
            one appeared there since the check and ``overwrite`` is off.
        TrialError: the config expands past the YAML node budget or is not a mapping.
    """
    with open(config_path, encoding="utf-8") as fh:
        reader = _NamingLoader(fh)
        try:
            root = compose_yaml(reader, config_path) or yaml.MappingNode(MAP_TAG, [])
        except YamlBudgetError as err:
            raise TrialError(str(err)) from None
        finally:
            reader.dispose()
    if not isinstance(root, yaml.MappingNode):
        kind = "list" if isinstance(root, yaml.SequenceNode) else "single value"
        raise TrialError(f"{config_path}: expected a YAML mapping (trainer/model/data), got a {kind}")
    names = getattr(reader, "names", {})
    for node in _nodes(root):  # block style throughout, as the tuned config has always been written
        if isinstance(node, yaml.CollectionNode):
            node.flow_style = False
    before = _text(root, names)
    notes = _set_keys(root, changes, names)
    kept = {id(node) for node in _nodes(root)}
    notes += [
        f"&{name} is gone: the value it named was replaced" for name, n in names.items() if id(n) not in kept
    ]
    text = _text(root, names)
    path = tuned_path(config_path)
    if not overwrite and os.path.lexists(path):
        raise FileExistsError(errno.EEXIST, "it exists and --overwrite was not given", path)
    try:
        with atomic_open(path) as fh:
            fh.write(text)
    except OSError as err:
        err.filename = path  # the temporary name the failing call saw is nobody's concern
        raise
    diff = difflib.unified_diff(
        before.splitlines(keepends=True), text.splitlines(keepends=True), fromfile=config_path, tofile=path
    )
    return path, "".join(diff) + "".join(f"# {note}\n" for note in notes)


class _NamingLoader(yaml.SafeLoader):
    """A SafeLoader that keeps the anchor names of the document it composed (PyYAML's composer forgets them)."""

    names: dict[str, yaml.Node]

    def compose_document(self) -> yaml.Node:
        self.get_event()  # as Composer.compose_document: the document's start, its root, its end
        node = self.compose_node(None, None)
        self.get_event()
        self.names, self.anchors = self.anchors, {}
        return node


class _NamingDumper(yaml.SafeDumper):
    """A SafeDumper that writes the user's anchor names (on a node used once too) instead of ``&id001``."""

    def __init__(self, stream: io.StringIO, names: dict[str, yaml.Node]) -> None:
        super().__init__(stream, sort_keys=False)
        self.names = {id(node): name for name, node in names.items()}

    def anchor_node(self, node: yaml.Node) -> None:
        first = node not in self.anchors
        super().anchor_node(node)
        if first and id(node) in self.names:
            self.anchors[node] = self.names[id(node)]

    def generate_anchor(self, node: yaml.Node) -> str:
        name = super().generate_anchor(node)
        while name in self.names.values():  # a node shared without a name of the user's: never take one
            name = super().generate_anchor(node)
        return name


def _text(root: yaml.Node, names: dict[str, yaml.Node]) -> str:
    stream = io.StringIO()
    dumper = _NamingDumper(stream, names)
    try:
        dumper.open()
        dumper.serialize(root)
        dumper.close()
    finally:
        dumper.dispose()
    return stream.getvalue()


def _represent(value: Any) -> yaml.Node:
    dumper = yaml.SafeDumper(io.StringIO(), default_flow_style=False, sort_keys=False)
    try:
        return dumper.represent_data(value)
    finally:
        dumper.dispose()


def _nodes(root: yaml.Node) -> Iterator[yaml.Node]:
    """Every node of the graph once, however often it is aliased (the budget refused graphs that hold
    themselves)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            yield node
            stack.extend(node_children(node))


def _holders(root: yaml.Node) -> dict[int, int]:
    """How many places hold each node (each alias is one more): a node held twice is shared."""
    count: dict[int, int] = {}
    for node in _nodes(root):
        for child in node_children(node):
            count[id(child)] = count.get(id(child), 0) + 1
    return count


def _is_key(node: yaml.Node, name: str) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == STR_TAG and node.value == name


def _lookup(mapping: yaml.MappingNode, name: str) -> tuple[yaml.Node | None, bool]:
    """The value under ``name`` and whether ``mapping`` holds it itself; else through a merge key (``<<: *base``
    or ``<<: [*a, *b]``), where the first source that has it wins, as PyYAML's constructor merges."""
    for key, value in mapping.value:
        if _is_key(key, name):
            return value, True
    for key, value in mapping.value:
        sources = value.value if isinstance(value, yaml.SequenceNode) else [value]
        for source in sources if key.tag == MERGE_TAG else []:
            found = _lookup(source, name)[0] if isinstance(source, yaml.MappingNode) else None
            if found is not None:
                return found, False
    return None, False


def _put(mapping: yaml.MappingNode, name: str, value: yaml.Node) -> None:
    for i, (key, _) in enumerate(mapping.value):
        if _is_key(key, name):
            mapping.value[i] = (key, value)
            return
    mapping.value.append((yaml.ScalarNode(STR_TAG, name), value))  # a key of its own wins over a merged one


def _set_keys(root: yaml.MappingNode, changes: dict[str, Any], names: dict[str, yaml.Node]) -> list[str]:
    """Set each dotted key in the graph under ``root`` so that no other key reads a changed value: a mapping on
    the way down that another place holds too (an alias, a merge key) is copied, the other places keeping the
    original. Returns a line for each anchored or merged mapping copied."""
    named = {id(node): name for name, node in names.items()}
    notes = []
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node, holders = root, _holders(root)
        for depth, part in enumerate(parents):
            child, own = _lookup(node, part)
            if not isinstance(child, yaml.MappingNode):  # a section made; a class path's node kept under it
                kept = isinstance(child, yaml.ScalarNode) and child.tag == STR_TAG
                pairs = [(yaml.ScalarNode(STR_TAG, "class_path"), child)] if kept else []
                child = yaml.MappingNode(MAP_TAG, pairs, flow_style=False)
                _put(node, part, child)
            elif not own or holders.get(id(child), 0) > 1:
                where = ".".join(parents[: depth + 1])
                if id(child) in named:
                    name = named[id(child)]
                    notes.append(f"{where} is a copy of &{name} with the change; &{name} keeps its value")
                elif not own:
                    notes.append(f"{where} is a copy of the mapping merged in by <<, with the change")
                child = _copy(child, named, holders)
                _put(node, part, child)
                holders = _holders(root)  # what the copy shares with the original is held once more
            node = child
        _put(node, last, _represent(value))
    return notes


def _copy(node: yaml.Node, named: dict[int, str], holders: dict[int, int]) -> yaml.Node:
    """``node`` anew, and every node below it that is held in one place only and has no anchor name: the copy
    shares (as aliases) only what the user named or already shared, so no ``&id001`` appears."""

    def below(child: yaml.Node) -> yaml.Node:
        return child if id(child) in named or holders.get(id(child), 0) > 1 else _copy(child, named, holders)

    if isinstance(node, yaml.SequenceNode):
        return yaml.SequenceNode(node.tag, [below(item) for item in node.value], flow_style=False)
    if isinstance(node, yaml.MappingNode):
        return yaml.MappingNode(node.tag, [(below(k), below(v)) for k, v in node.value], flow_style=False)
    return yaml.ScalarNode(node.tag, node.value, style=node.style)
