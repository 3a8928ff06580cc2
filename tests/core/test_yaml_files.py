"""infopt's YAML files refuse a key written twice, where PyYAML would keep the last without a word."""

from __future__ import annotations

import pytest
import yaml

from infopt.core.yaml_files import load_yaml


def test_a_key_written_twice_in_one_mapping_is_an_error_naming_both_lines():
    text = "passes:\n  - name: quantize_int4\n    options:\n      int8_share: 0.25\n      in_place: true\n      int8_share: auto\n"
    assert yaml.safe_load(text)["passes"][0]["options"]["int8_share"] == "auto"  # what PyYAML alone does
    with pytest.raises(yaml.YAMLError, match=r"the key 'int8_share' is written twice .*first on line 4") as raised:
        load_yaml(text)
    assert "line 6" in str(raised.value)


def test_the_same_key_in_two_mappings_and_a_merge_override_are_fine():
    assert load_yaml("a: {x: 1}\nb: {x: 2}\n") == {"a": {"x": 1}, "b": {"x": 2}}
    assert load_yaml("base: &b {x: 1, y: 2}\nmine:\n  <<: *b\n  x: 3\n")["mine"] == {"x": 3, "y": 2}
    assert load_yaml("- [1, 2]\n- null\n") == [[1, 2], None]


def test_it_stays_safe():
    with pytest.raises(yaml.YAMLError):
        load_yaml("!!python/object/apply:os.system ['true']\n")
