"""YAML as infopt reads its files (recipes, targets, sweep specs, gate configs): safe, and a key written twice in
one mapping is an error. PyYAML keeps the last of two without a word, so a setting written twice would be dropped
and the file would seem to say what it does not."""

from __future__ import annotations

from typing import Any

import yaml


class _Strict(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base``: its keys may be overridden here
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                line = first.setdefault(key, key_node.start_mark.line)
            except TypeError:  # an unhashable key: PyYAML's own error says so
                continue
            if line != key_node.start_mark.line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is written twice in one mapping (first on line {line + 1}): "
                    "only one of the two could hold; keep one", key_node.start_mark)
        return super().construct_mapping(node, deep)


def load_yaml(text: str) -> Any:
    """``text`` parsed as YAML, safely; a key repeated in one mapping raises ``yaml.YAMLError``."""
    return yaml.load(text, Loader=_Strict)  # noqa: S506 - _Strict is a SafeLoader
