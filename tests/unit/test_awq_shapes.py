"""AWQ group size and shape checks (llmopt_bench/engines/awq/checkpoint.py), on the configs of real models."""

from __future__ import annotations

from llmopt_bench.engines.awq.checkpoint import input_sizes, pick_group_size, shape_problem, write_dummy

LLAMA2_7B = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 11008}
SMOLLM2_135M = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536, "head_dim": 64}
TINY = {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 256}


def test_group_size_128_where_every_input_allows_it_else_64_else_32():
    assert pick_group_size(LLAMA2_7B) == 128
    assert input_sizes(SMOLLM2_135M) == {576, 1536} and pick_group_size(SMOLLM2_135M) == 64  # 576 % 128 != 0
    assert pick_group_size(TINY) == 128
    assert pick_group_size({**TINY, "intermediate_size": 288}) == 32  # 288 = 9 x 32
    assert pick_group_size({**TINY, "hidden_size": 120, "intermediate_size": 240}) is None


def test_shapes_the_int4_kernels_cannot_take_are_named():
    assert shape_problem(LLAMA2_7B) is None and shape_problem(SMOLLM2_135M) is None and shape_problem(TINY) is None
    problem = shape_problem({**TINY, "intermediate_size": 250})
    assert problem == "intermediate_size 250 is not a multiple of 32"


def test_dummy_checkpoint_is_config_and_tokenizer_only(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("LLMOPT_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "synthetic-x"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({**LLAMA2_7B, "dtype": "float16"}))
    (src / "tokenizer.json").write_text("{}")
    (src / "model-00001-of-00002.safetensors").write_bytes(b"x" * 10)
    (src / "model.safetensors.index.json").write_text("{}")
    out = write_dummy(src, 128)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "tokenizer.json"]
    q = json.loads((out / "config.json").read_text())["quantization_config"]
    assert q == {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
