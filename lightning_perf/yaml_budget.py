"""Reading a user's YAML (a Lightning CLI config, a variant's override value, a run's ``hparams.yaml``) within a
node budget.

PyYAML builds an alias as a second reference to the anchored object, so a 500-byte file whose anchors nest
("billion laughs": ``b: &b [*a, *a, ...]``, nine levels deep) loads in microseconds into 10^9 leaves. Whatever
then walks the value (``json.dumps``, ``repr``, ``==``, a parser that checks every leaf) expands it and never
returns. :func:`load_yaml` composes the node graph first, counts its nodes as the value would expand them
(memoised per node, so the count costs one visit per node however often it is aliased) and refuses a document
over :data:`MAX_NODES`, or one that holds itself (``a: &a [*a]``), before anything is built. Standard library
and PyYAML only, low in the package: the analysis reads ``hparams.yaml`` with it too.
"""

from __future__ import annotations

import reprlib
from typing import IO, Any

import yaml

from lightning_perf.errors import LightningPerfError

# Expanded nodes a document may hold. A large Lightning CLI config has a few thousand; a million is far past any
# real config yet quick to walk (1.1 million: json.dumps 0.17 s, deepcopy 0.74 s on a busy 2-core machine),
# while a billion-laughs file is 10^9.
MAX_NODES = 1_000_000

# A message shows a short sketch of a user's value, never the whole of it: reprlib stops after a few items a
# level and a few levels, so the sketch costs the same for a shared-alias structure as for a small one.
_SHORT_REPR = reprlib.Repr()
(
    _SHORT_REPR.maxlevel,
    _SHORT_REPR.maxlist,
    _SHORT_REPR.maxdict,
    _SHORT_REPR.maxstring,
    _SHORT_REPR.maxother,
) = 2, 3, 3, 40, 40
SHORTENED_CHARS = 120


class YamlBudgetError(LightningPerfError, ValueError):
    """A YAML document that expands past :data:`MAX_NODES`, holds itself, or nests too deep to read; the
    message names where it came from."""


def shortened_repr(value: Any) -> str:
    """A repr of ``value`` short enough for one line of a message (at most :data:`SHORTENED_CHARS`), whatever its
    size."""
    text = _SHORT_REPR.repr(value)
    return text if len(text) <= SHORTENED_CHARS else text[: SHORTENED_CHARS - 3] + "..."


def expanded_nodes(root: yaml.Node, limit: int = MAX_NODES) -> int | None:
    """The number of nodes under ``root`` (a ``yaml.Node``) with every alias expanded, or ``limit + 1`` once it is
    known to be over ``limit``; ``None`` when a node holds itself (it expands without end).

    Iterative (a deep document does not reach Python's recursion limit here) and memoised by node: a node's
    size is 1 plus its children's, each counted once."""
    size: dict[int, int] = {}
    open_nodes: set[int] = set()  # on the current path: meeting one again is a cycle
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            open_nodes.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in node_children(node))
            if size[key] > limit:
                return limit + 1
            continue
        if key in size:
            continue
        if key in open_nodes:
            return None
        open_nodes.add(key)
        stack.append((node, True))
        for child in node_children(node):
            if id(child) in open_nodes:
                return None
            if id(child) not in size:
                stack.append((child, False))
    return size[id(root)]


def node_children(node: yaml.Node) -> list[yaml.Node]:
    """A node's direct children: a sequence's items, a mapping's keys and values in turn; a scalar has none."""
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def check_budget(node: yaml.Node, where: str) -> None:
    """Raise :class:`YamlBudgetError` when ``node`` (a composed document) expands past :data:`MAX_NODES` or
    holds itself."""
    count = expanded_nodes(node)
    if count is None:
        raise YamlBudgetError(
            f"{where}: an alias in it refers to a node that holds it, so its value expands without end; "
            "it is not read"
        )
    if count > MAX_NODES:
        raise YamlBudgetError(
            f"{where}: it expands past the node budget of {MAX_NODES:,} YAML nodes (each alias counted as often as "
            "it is used: a file built to expand, like 'billion laughs', is not a config); it is not read"
        )


def compose_yaml(reader: yaml.SafeLoader, where: str) -> yaml.Node | None:
    """The node graph of the single YAML document ``reader`` reads (None for an empty one), within the budget;
    raises as :func:`load_yaml` does. Nothing is built: aliases stay shared nodes."""
    try:
        node = reader.get_single_node()
    except RecursionError:  # PyYAML composes recursively: thousands of nested brackets end here
        raise YamlBudgetError(f"{where}: it nests too deep to read (past Python's recursion limit)") from None
    if node is not None:
        check_budget(node, where)
    return node


def load_yaml(source: str | IO[str], where: str, loader: type[yaml.SafeLoader] | None = None) -> Any:
    """The value of the single YAML document in ``source`` (text or an open file), read with ``loader`` (a
    ``yaml.SafeLoader`` subclass; SafeLoader itself by default) once its node graph is within the budget.

    Raises:
        YamlBudgetError: it expands past :data:`MAX_NODES`, holds itself, or nests past the recursion limit;
            the message starts with ``where`` (``--config cfg.yaml``).
        yaml.YAMLError: it is not YAML, or holds more than one document.
    """
    reader = (loader or yaml.SafeLoader)(source)
    try:
        node = compose_yaml(reader, where)
        return None if node is None else reader.construct_document(node)
    finally:
        reader.dispose()


def load_yaml_file(path: str, where: str | None = None, loader: type[yaml.SafeLoader] | None = None) -> Any:
    """:func:`load_yaml` of the file at ``path`` (UTF-8); ``where`` defaults to the path."""
    with open(path, encoding="utf-8") as fh:
        return load_yaml(fh, where or path, loader)
