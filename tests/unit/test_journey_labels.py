"""A journey may run one stage twice under a label (TP=1 and TP=2 in one run): the label names
the result, the registered stage runs; a label that would collide is a usage error."""

from __future__ import annotations

import pytest

from llmopt_bench.core.errors import UsageError
from llmopt_bench.run.registry import parse_journey, resolve_stages


def journey(tmp_path, text):
    path = tmp_path / "j.toml"
    path.write_text(text)
    return path


def test_label_names_the_result_and_the_stage_runs(tmp_path):
    path = journey(tmp_path, '[[stage]]\nname = "vllm"\n\n[[stage]]\nname = "vllm"\nlabel = "vllm-tp2"\n'
                             'params = { tensor_parallel_size = 2 }\n')
    plans, _ = resolve_stages(str(path))
    assert [(p.name, p.stage, p.params["tensor_parallel_size"]) for p in plans] == [("vllm", "vllm", 1), ("vllm-tp2", "vllm", 2)]


def test_the_shipped_tp_journey_pairs_each_vllm_stage_with_its_tp2_twin():
    from llmopt_bench.run.registry import JOURNEY_DIR

    plans, _ = resolve_stages(str(JOURNEY_DIR / "tp-scaling.toml"))
    by_stage = {}
    for p in plans:
        by_stage.setdefault(p.stage, []).append((p.name, p.params["tensor_parallel_size"]))
    assert by_stage == {"vllm": [("vllm", 1), ("vllm-tp2", 2)],
                        "continuous-batching": [("continuous-batching", 1), ("continuous-batching-tp2", 2)]}


@pytest.mark.parametrize("text, says", [
    ('[[stage]]\nname = "vllm"\n\n[[stage]]\nname = "vllm"\n', "both be called 'vllm'"),
    ('[[stage]]\nname = "vllm"\nlabel = "x"\n\n[[stage]]\nname = "hf-fp16"\nlabel = "x"\n', "both be called 'x'"),
    ('[[stage]]\nname = "vllm"\nlabel = "hf-fp16"\n', "the name of another stage"),
    ('[[stage]]\nname = "vllm"\nlabel = "../up"\n', "has label '../up'"),
    ('[[stage]]\nname = "vllm"\nlabel = 2\n', "has label 2"),
])
def test_colliding_or_unsafe_labels_are_usage_errors(tmp_path, text, says):
    with pytest.raises(UsageError) as e:
        parse_journey(journey(tmp_path, text))
    assert says in str(e.value) and e.value.fix


def test_a_labelled_stage_params_are_checked_against_its_stage(tmp_path):
    path = journey(tmp_path, '[[stage]]\nname = "vllm"\nlabel = "vllm-b"\nparams = { tensor_parallel_sise = 2 }\n')
    with pytest.raises(UsageError) as e:
        resolve_stages(str(path))
    assert "stage vllm" in str(e.value) and "tensor_parallel_sise" in str(e.value)
