"""A generated prompt (token ids) as the text a user sends: text that the server's tokenizer
counts at exactly the prompt's length.

Why (issue 38): a server that receives token ids skips its own tokenization, which every real
client's request pays inside TTFT (~3.5 ms for 450 tokens on an H100 host); and random ids
decoded to text do not re-tokenize to their own count (450 became 523 on average there, +16%),
so a run that sends the decoded text states a length it does not send.

How: the ids are cut into blocks of BLOCK tokens from the start. Each block is decoded and
adjusted until its text, alone, encodes to exactly its length; the blocks' texts are joined and
the whole adjusted at its end until the tokenizer counts it (special tokens included, as a
server counts a text prompt) at the prompt's length. Adjusting a text: one that encodes to too
many tokens is cut before the first token past the target (the encoding's offsets say where);
one that encodes to too few gets whole words appended (" word" strings the tokenizer keeps as
one token after any text), drawn by a generator seeded from the seed and the ids.

Blocks keep sharing: two prompts whose first k blocks of ids are equal share those blocks'
text, so a shared prefix stays a shared text prefix (a server's prefix cache still hits, up to
the block that straddles the prefix's end) and a conversation's next turn begins with its
previous turn's text but for its last block. Every text is a function of (tokenizer, seed, ids):
the same in every run and process. Texts are kept (per prompt and per block) so that a prompt
sent again costs a lookup; prepare() makes many at once (the tokenizer's batch calls, which run
outside the GIL) before a load point, so the client's loop rarely makes one while it sends.

Pure Python over a tokenizer: a `tokenizers.Tokenizer`, a transformers fast tokenizer (its
backend), or any object with encode(text, add_special_tokens=...) and decode(ids) (cut by
bisection: no offsets)."""

from __future__ import annotations

import hashlib
import random
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

BLOCK = 16  # tokens a block: vLLM's prefix-cache block on a GPU, so sharing survives at its grain
TRIES = 12  # adjustments before a text is left at its nearest length (counted in `inexact`)
WORDS = 512  # pad words kept
KEEP_TEXTS = 8192  # prompt texts kept (least recently used dropped)
KEEP_BLOCKS = 1 << 18  # block texts kept (all dropped at once beyond it)


class _Codec:
    """What this module asks of a tokenizer: encode many texts (ids and, where known, each
    token's character span) and decode many id lists."""

    def __init__(self, tokenizer: Any):
        backend = getattr(tokenizer, "backend_tokenizer", None) or tokenizer
        self.fast = hasattr(backend, "encode_batch") and hasattr(backend, "decode_batch")
        self.tok = backend if self.fast else tokenizer

    def encode(self, texts: Sequence[str], specials: bool = False) -> list[tuple[list[int], list[tuple[int, int]] | None]]:
        if self.fast:
            return [(e.ids, e.offsets) for e in self.tok.encode_batch(list(texts), add_special_tokens=specials)]
        return [(list(self.tok.encode(t, add_special_tokens=specials)), None) for t in texts]

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        if self.fast:
            return list(self.tok.decode_batch([list(i) for i in ids], skip_special_tokens=False))
        return [str(self.tok.decode(list(i))) for i in ids]


def _digest(ids: Sequence[int]) -> bytes:
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=12).digest()


class PromptTexts:
    """Token-id prompts as text of exactly their length on one tokenizer (the module doc).

        texts = PromptTexts(tokenizer, seed)
        texts.prepare(prompts)          # optional: many at once, before they are sent
        texts.text(ids)                 # the text; texts.count(text) == len(ids)"""

    def __init__(self, tokenizer: Any, seed: int = 0, block: int = BLOCK):
        self.codec, self.seed, self.block = _Codec(tokenizer), seed, block
        self.specials = self._count("a", True) - self._count("a", False)  # what the tokenizer adds to a text (a BOS)
        self.words = self._pad_words()
        self.inexact = 0  # prompts whose text could not be made exact (left at their nearest length)
        self._texts: OrderedDict[bytes, str] = OrderedDict()
        self._blocks: dict[tuple[int, ...], str] = {}

    # --- counting ---------------------------------------------------------------------------

    def _count(self, text: str, specials: bool = True) -> int:
        return len(self.codec.encode([text], specials)[0][0])

    def count(self, text: str) -> int:
        """Tokens a server counts for this text prompt (its tokenizer's, special tokens included)."""
        return self._count(text, True)

    def _pad_words(self) -> list[str]:
        """" word" strings that add exactly one token after any text: a vocabulary entry made of
        letters that the tokenizer keeps as one token behind a space, alone and after a letter."""
        vocab = getattr(self.codec.tok, "get_vocab_size", None)
        size = vocab() if vocab else len(self.codec.tok)
        words: list[str] = []
        for start in range(0, size, 4096):
            texts = self.codec.decode([[i] for i in range(start, min(size, start + 4096))])
            words += sorted({" " + t.strip() for t in texts if t.strip().isascii() and t.strip().isalpha()})
            if len(words) >= 4 * WORDS:
                break
        alone = self.codec.encode(words)
        after = self.codec.encode(["x" + w for w in words])
        x = len(self.codec.encode(["x"])[0][0])
        good = [w for w, a, b in zip(words, alone, after) if len(a[0]) == 1 and len(b[0]) == x + 1][:WORDS]
        # a vocabulary without such words (a small one): single letters, which may add two tokens
        # (a space and the letter); the fitting loop then cuts back to the space where one is too many
        return good or [" " + c for c in "abcdefghijklmnopqrstuvwxyz"]

    # --- making texts -----------------------------------------------------------------------

    def _cut(self, text: str, n: int, enc: tuple[list[int], list[tuple[int, int]] | None]) -> str:
        """The text before its (n+1)-th token (n < its length): by the token's offsets, else the
        longest prefix that encodes to at most n tokens (bisection)."""
        ids, offsets = enc
        if offsets is not None and len(offsets) == len(ids):
            # the end of token n and the start of token n+1 differ where offsets are trimmed of spaces
            # (keep the end) or where several tokens share one character (a byte-level split: drop it)
            return text[:min(offsets[n - 1][1], offsets[n][0])] if n else ""
        lo, hi = 0, len(text)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._count(text[:mid], False) <= n:
                lo = mid
            else:
                hi = mid - 1
        return text[:lo]

    def _fit(self, texts: list[str], targets: list[int], keys: list[bytes]) -> tuple[list[str], int]:
        """Each text adjusted at its end until it encodes to its target, special tokens left out
        (the module doc); how many could not be made exact in TRIES rounds (left at their nearest)."""
        out, todo = list(texts), list(range(len(texts)))
        rngs: dict[int, random.Random] = {}
        best: dict[int, tuple[int, str]] = {}
        for _ in range(TRIES):
            if not todo:
                break
            encs = self.codec.encode([out[i] for i in todo])
            left = []
            for i, enc in zip(todo, encs):
                m, n = len(enc[0]), targets[i]
                if m == n:
                    continue
                if abs(m - n) < best.get(i, (1 << 62, ""))[0]:
                    best[i] = (abs(m - n), out[i])
                if m > n:
                    out[i] = self._cut(out[i], n, enc)
                else:
                    rng = rngs.setdefault(i, random.Random(f"{self.seed}:{keys[i].hex()}"))
                    out[i] += "".join(rng.choices(self.words, k=n - m))
                left.append(i)
            todo = left
        if todo:
            for i in todo:
                out[i] = best.get(i, (0, out[i]))[1]
        return out, len(todo)

    def _block_texts(self, blocks: Iterable[tuple[int, ...]]) -> dict[tuple[int, ...], str]:
        """The text of every block, made where not kept yet (and kept); a mapping of its own, so
        that another thread's making (a point's loop makes a late prompt in a thread) cannot
        drop one from under it."""
        wanted = dict.fromkeys(blocks)
        got = {b: t for b in wanted if (t := self._blocks.get(b)) is not None}
        new = [b for b in wanted if b not in got]
        if new:
            made, _ = self._fit(self.codec.decode(new), [len(b) for b in new], [_digest(b) for b in new])
            got.update(zip(new, made))
            if len(self._blocks) + len(new) > KEEP_BLOCKS:
                self._blocks = {}
            self._blocks.update(zip(new, made))
        return got

    def prepare(self, prompts: Iterable[Sequence[int]]) -> None:
        """Make the texts of many prompts at once (kept for text())."""
        todo: dict[bytes, tuple[int, ...]] = {}
        for ids in prompts:
            key = _digest(ids)
            if key in self._texts:
                self._texts.move_to_end(key)
            else:
                todo.setdefault(key, tuple(ids))
        if todo:
            self._make(todo)

    def _make(self, todo: dict[bytes, tuple[int, ...]]) -> dict[bytes, str]:
        split = {key: [ids[i:i + self.block] for i in range(0, len(ids), self.block)] for key, ids in todo.items()}
        blocks = self._block_texts(b for parts in split.values() for b in parts)
        keys = list(todo)
        joined = ["".join(blocks[b] for b in split[k]) for k in keys]
        # the server counts the special tokens its tokenizer adds to a text (a BOS): the text holds the rest
        made, inexact = self._fit(joined, [max(len(todo[k]) - self.specials, 0) for k in keys], keys)
        self.inexact += inexact
        for key, text in zip(keys, made):
            self._texts[key] = text
        while len(self._texts) > KEEP_TEXTS:
            self._texts.popitem(last=False)
        return dict(zip(keys, made))

    def text(self, ids: Sequence[int]) -> str:
        """The prompt's text: the tokenizer counts it at len(ids) tokens, special tokens included
        (where it adds more than that, e.g. a BOS to a 1-token prompt, the nearest)."""
        key = _digest(ids)
        got = self._texts.get(key)
        return got if got is not None else self._make({key: tuple(ids)})[key]

    def ready(self, ids: Sequence[int]) -> str | None:
        """The prompt's text if it is already made, else None (no work)."""
        return self._texts.get(_digest(ids))


def exact_text(tokenizer: Any, ids: Sequence[int], seed: int = 0) -> str:
    """One prompt's text of exactly len(ids) tokens (PromptTexts for many)."""
    return PromptTexts(tokenizer, seed).text(ids)
