"""Agreement with the FP16 reference: the KL's direction, and a reference file read as data only.

The "model" here is a fixed table of next-token logits (the engine's part); what is tested is
quality.py's own arithmetic and its file handling, on the real functions."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmopt_bench.analysis import quality
from llmopt_bench.engines.vllm import quality as quality_vllm

P = [0.90, 0.05, 0.05]  # the reference: confident
Q = [0.34, 0.33, 0.33]  # the stage: nearly uniform


def kl(p: list[float], q: list[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(p, q))


class FixedLogits:
    """Every position predicts the same distribution."""

    device = "cpu"

    def __init__(self, probs: list[float]):
        import torch

        self.row = torch.log(torch.tensor(probs, dtype=torch.float64)).float()

    def __call__(self, input_ids):
        return SimpleNamespace(logits=self.row.expand(1, input_ids.shape[1], -1).clone())


def reference(probs: list[float], positions: int = 4) -> dict:
    import torch

    logp = torch.log(torch.tensor([probs] * positions, dtype=torch.float64)).half()
    return {"items": [{"id": "r0", "prompt": [1, 2], "continuation": [0] * positions, "logprobs": logp}]}


def test_kl_is_reference_to_stage_not_the_reverse():
    """KL(P_fp16 || P_stage), computed here from the two distributions, is what agreement()
    reports; the reverse direction (0.914 against 0.687 for these two) is not."""
    got = quality.agreement(FixedLogits(Q), reference(P))["kl_mean"]
    assert got == pytest.approx(kl(P, Q), abs=5e-3)  # fp16 storage of the reference: ~1e-3
    assert got != pytest.approx(kl(Q, P), abs=5e-3)  # llmopt's figure is not the swapped KL
    assert got == pytest.approx(quality.agreement(FixedLogits(Q), reference(P, 9))["kl_mean"], abs=1e-6)


def test_same_distribution_has_zero_kl_and_full_match():
    got = quality.agreement(FixedLogits(P), reference(P))
    assert got["kl_mean"] == pytest.approx(0.0, abs=2e-3) and got["token_match_rate"] == 1.0
    assert got["first_divergence_mean"] == 4  # nothing diverged: the continuation's length (the report says so)


def test_first_divergence_and_match_count_the_positions_where_the_argmax_differs():
    """The stage always predicts token 0; the reference continues 0, 0, 1, 0 and 1, 0, 0, 0: the
    first prompt parts at position 2, the second at 0, and 6 of 8 positions match."""
    ref = reference(P)
    ref["items"] = [dict(ref["items"][0], continuation=c) for c in ([0, 0, 1, 0], [1, 0, 0, 0])]
    got = quality.agreement(FixedLogits(P), ref)
    assert got["first_divergence_mean"] == 1.0 and got["token_match_rate"] == 6 / 8 and got["agreement_positions"] == 8


# --- the reference file: data only ---------------------------------------------------------

class Payload:
    """Unpickling this runs code: it writes the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


def plant(run_dir: Path, obj) -> Path:
    import torch

    path = run_dir / "stages" / "ref" / quality.REFERENCE_FILE
    path.parent.mkdir(parents=True)
    torch.save(obj, path)
    return path


def test_the_reference_quality_writes_loads_with_weights_only(tmp_path):
    """evaluate() on the reference stage writes the file; load_reference reads it back whole."""
    import torch

    ref_file = tmp_path / "run" / "stages" / "ref" / quality.REFERENCE_FILE
    req = SimpleNamespace(id="q0", token_ids=(3, 4, 5))
    out = quality.evaluate(FixedLogits(P), None, [req], ref_file, "ref", real_weights=False, is_reference=True,
                           greedy=lambda prompt, n: [0] * n, progress=lambda *a: None)
    assert out["token_match_rate"] == 1.0
    ref = quality.load_reference(ref_file)
    item = ref["items"][0]
    assert item["id"] == "q0" and item["prompt"] == [3, 4, 5] and item["continuation"] == [0] * quality.CONTINUATION
    assert item["logprobs"].dtype == torch.float16 and item["logprobs"].shape == (quality.CONTINUATION, 3)


def test_a_reference_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "marker"
    # the same reference without the payload loads and is used: the refusal below is the payload's
    clean = plant(tmp_path / "clean", reference(P))
    assert quality.load_reference(clean)["items"][0]["continuation"] == [0] * 4
    assert quality.evaluate(FixedLogits(P), None, [], clean, "ref", real_weights=False, is_reference=False, greedy=None,
                            progress=lambda *a: None)["token_match_rate"] == 1.0

    path = plant(tmp_path / "run", reference(P) | {"extra": Payload(marker)})
    with pytest.raises(quality.ReferenceRefused, match="refused to load the FP16 reference"):
        quality.load_reference(path)
    out = quality.evaluate(FixedLogits(Q), None, [], path, "ref", real_weights=False,
                           is_reference=False, greedy=None, progress=lambda *a: None)
    assert "refused to load the FP16 reference" in out["agreement_note"] and "exec" in out["agreement_note"]
    assert out.get("kl_mean") is None
    # the vLLM stages read the same file the same way (no engine needed to reach the refusal)
    vout = quality_vllm.evaluate(None, None, path, "ref", real_weights=False, progress=lambda *a: None)
    assert "refused to load" in vout["agreement_note"]
    assert not marker.exists()
