"""Architecture families (``exporters/families/``): each transformers ``model_type`` maps to one family, and what a
family declares reaches the decoder and its GenAI folder."""

from types import SimpleNamespace

import pytest
import transformers

from infopt.exporters.families import FAMILIES, GENERIC, Family, family_of, genai_model_type, register
from infopt.exporters.kv_attention import fusable


def test_every_family_names_real_transformers_model_types():
    known = set(transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES)
    named = [t for family in FAMILIES.all().values() for t in family.model_types]
    assert named and len(named) == len(set(named))  # no model type in two families
    assert sorted(set(named) - known) == []


def test_a_model_type_finds_its_family():
    assert family_of(transformers.LlamaConfig()).name == "llama"
    assert family_of(transformers.Qwen2Config()).name == "qwen"
    assert family_of(transformers.GPT2Config()) is GENERIC
    assert family_of(SimpleNamespace()) is GENERIC  # a config without a model_type


def test_genai_runs_native_families_under_their_own_type_and_others_as_decoder():
    assert genai_model_type(transformers.LlamaConfig()) == "llama"
    assert genai_model_type(transformers.Qwen2Config()) == "qwen2"
    assert genai_model_type(transformers.MistralConfig()) == "mistral"
    assert genai_model_type(transformers.GPT2Config()) == "decoder"
    assert genai_model_type(transformers.GptOssConfig()) == "decoder"


def test_attention_sinks_keep_the_models_own_attention():
    """gpt-oss's sinks come from its family, even when the config does not say ``use_sinks``."""
    config = transformers.GptOssConfig()
    assert not getattr(config, "use_sinks", False)
    assert family_of(config).attention_sinks
    assert fusable(SimpleNamespace(config=config), 64) == "attention sinks"


def test_a_model_type_claimed_twice_is_refused():
    with pytest.raises(ValueError, match="'llama' is in families 'llama' and 'copy'"):
        register(Family("copy", ("llama",)))
    assert "copy" not in FAMILIES.all()
