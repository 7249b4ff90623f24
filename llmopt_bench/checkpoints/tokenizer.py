"""A local, deterministic tokenizer for synthetic models: byte-level BPE trained with
`tokenizers` on the text llmopt ships, so text prompts work offline and counts are exact."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2 as in Llama


def shipped_text() -> list[str]:
    data = resources.files("llmopt_bench.data")
    texts = []
    for name in sorted(p.name for p in data.iterdir() if p.name.endswith((".txt", ".jsonl"))):
        texts.append(data.joinpath(name).read_text(encoding="utf-8"))
    return texts


def train_tokenizer(vocab_size: int, out_dir: Path) -> None:
    """Write tokenizer.json + tokenizer_config.json for a PreTrainedTokenizerFast to out_dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(shipped_text(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<unk>",
    )
    fast.save_pretrained(str(out_dir))
