#!/usr/bin/env python3
"""How long text prompts of the asked length take to make (workloads/text.py), and whether every
one came out exact: N random prompts of each length, made at once (as a serving point prepares
them) on a model's tokenizer.

    python scripts/text-prompt-speed.py --model bundled:smollm2-135m --lengths 128,450,2000 --prompts 256

Prints one line per length: the seconds for all, the milliseconds each, and how many the
tokenizer counts at another length (0 expected). Exit 1 when any is not exact."""

from __future__ import annotations

import argparse
import random
import sys
import time

from llmopt_bench.checkpoints.prepare import prepare
from llmopt_bench.core.models import parse_model
from llmopt_bench.workloads.text import PromptTexts


def main(argv: list[str]) -> int:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--model", default="synthetic:tiny")
    a.add_argument("--lengths", default="128,450,2000")
    a.add_argument("--prompts", type=int, default=256)
    a.add_argument("--seed", type=int, default=0)
    args = a.parse_args(argv)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(prepare(parse_model(args.model)).path)
    special = set(tok.all_special_ids)
    ids = [i for i in range(len(tok)) if i not in special]
    bad_total = 0
    for n in (int(x) for x in args.lengths.split(",")):
        prompts = [random.Random(f"{args.seed}:{n}:{i}").choices(ids, k=n) for i in range(args.prompts)]
        texts = PromptTexts(tok, args.seed)
        t0 = time.perf_counter()
        texts.prepare(prompts)
        took = time.perf_counter() - t0
        bad = sum(texts.count(texts.text(p)) != n for p in prompts)
        bad_total += bad
        print(f"{args.prompts} prompts of {n} tokens: {took:.2f} s ({took / args.prompts * 1e3:.2f} ms each), "
              f"{bad} not at their length")
    return 1 if bad_total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
