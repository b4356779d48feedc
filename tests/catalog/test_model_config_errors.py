"""Bad model input: one InputFileError / LlmcapError naming the file and the field."""

import json

import pytest

from llmcap.catalog import load_model, parse_model_config
from llmcap.catalog.gpus import default_catalog_dir
from llmcap.errors import InputFileError, LlmcapError

TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 1000,
}


def _cfg(tmp_path, obj):
    p = tmp_path / "config.json"
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj, indent=2))
    return p


def test_not_json_names_the_line(tmp_path):
    p = _cfg(tmp_path, '{\n  "model_type": "llama",\n  "hidden_size": 64,,\n}')
    with pytest.raises(InputFileError) as exc:
        parse_model_config(p)
    assert exc.value.path == str(p) and exc.value.line == 3
    assert "not valid JSON" in str(exc.value)


def test_missing_field_is_named(tmp_path):
    cfg = dict(TINY)
    del cfg["hidden_size"]
    with pytest.raises(InputFileError) as exc:
        parse_model_config(_cfg(tmp_path, cfg))
    assert exc.value.field == "hidden_size" and "missing required field" in str(exc.value)


def test_wrong_type_is_named(tmp_path):
    with pytest.raises(InputFileError) as exc:
        parse_model_config(_cfg(tmp_path, {**TINY, "num_attention_heads": "four"}))
    assert exc.value.field == "num_attention_heads"


def test_unknown_model_type_lists_supported(tmp_path):
    with pytest.raises(InputFileError) as exc:
        parse_model_config(_cfg(tmp_path, {**TINY, "model_type": "bert"}))
    assert exc.value.field == "model_type"
    assert "unsupported model_type 'bert'" in str(exc.value) and "deepseek_v3" in str(exc.value)


def test_top_level_must_be_an_object(tmp_path):
    with pytest.raises(InputFileError, match="JSON object"):
        parse_model_config(_cfg(tmp_path, "[1, 2]"))


def test_inconsistent_heads_are_rejected(tmp_path):
    with pytest.raises(InputFileError) as exc:
        parse_model_config(_cfg(tmp_path, {**TINY, "num_key_value_heads": 3}))
    assert exc.value.field == "num_key_value_heads"


def test_moe_without_expert_width_is_rejected(tmp_path):
    cfg = {**TINY, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2}
    with pytest.raises(InputFileError) as exc:
        parse_model_config(_cfg(tmp_path, cfg))
    assert exc.value.field == "moe_intermediate_size"


def test_directory_without_config(tmp_path):
    with pytest.raises(InputFileError, match="no config.json"):
        load_model(tmp_path)


def test_unknown_short_name_lists_catalog():
    with pytest.raises(LlmcapError) as exc:
        load_model("gpt-5")
    assert "unknown model 'gpt-5'" in str(exc.value) and "Llama-3.1-8B" in str(exc.value)


def test_accepts_file_directory_and_short_name(tmp_path):
    p = _cfg(tmp_path, TINY)
    assert parse_model_config(p).hidden_size == 64
    assert load_model(tmp_path).name == tmp_path.name
    assert load_model(str(p)).num_layers == 4
    assert load_model("llama-3.1-8b").name == "Llama-3.1-8B"  # case-insensitive catalog name


def test_every_shipped_config_parses_and_has_a_source_entry():
    from llmcap.catalog import known_models

    models_dir = default_catalog_dir() / "models"
    sources = (models_dir / "SOURCES.md").read_text()
    names = known_models()
    for required in ["Llama-3.1-8B", "Llama-3.1-70B", "Mixtral-8x7B", "DeepSeek-V3", "Qwen2.5-7B", "Qwen3-30B-A3B"]:
        assert required in names
    for n in names:
        assert f"`{n}`" in sources, n
        assert load_model(n).num_layers > 0
