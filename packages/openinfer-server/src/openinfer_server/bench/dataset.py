"""Random prompts of chosen lengths, like `vllm bench`'s random dataset, as token ids so the
input lengths are exact (no round trip through text) and prompts share no prefix."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

from openinfer_server.bench import BenchError

# Ids below this are ordinary tokens of every common vocabulary (Llama 2 has 32000).
FALLBACK_VOCAB_SIZE = 32000


@dataclass(frozen=True, slots=True)
class RandomRequest:
    prompt_token_ids: tuple[int, ...]
    output_len: int

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


def sample_lengths(rng: random.Random, length: int, range_ratio: float, n: int) -> list[int]:
    """`n` lengths uniform over the integers in [length*(1-r), length*(1+r)] (at least 1);
    r = 0 gives `length` every time."""
    if range_ratio == 0:
        return [length] * n
    low = max(1, math.floor(length * (1 - range_ratio)))
    high = math.ceil(length * (1 + range_ratio))
    return [rng.randint(low, high) for _ in range(n)]


def random_requests(num: int, input_len: int, output_len: int, *, vocab_size: int,
                    range_ratio: float = 0.0, seed: int = 0) -> list[RandomRequest]:
    """`num` requests with token ids uniform in [0, vocab_size); the same seed gives the same
    requests."""
    rng = random.Random(seed)
    inputs = sample_lengths(rng, input_len, range_ratio, num)
    outputs = sample_lengths(rng, output_len, range_ratio, num)
    ids = range(vocab_size)
    return [RandomRequest(tuple(rng.choices(ids, k=n_in)), n_out)
            for n_in, n_out in zip(inputs, outputs, strict=True)]


def tokenizer_vocab_size(path: str) -> int:
    """Ordinary (not added or special) tokens of a tokenizer.json, or of the one in a folder."""
    from tokenizers import Tokenizer

    file = Path(path).expanduser()
    if file.is_dir():
        file = file / "tokenizer.json"
    if not file.is_file():
        raise BenchError(f"--tokenizer {path!r}: no tokenizer.json there; pass the file or the "
                         "checkpoint folder that holds it")
    try:
        size: int = Tokenizer.from_file(str(file)).get_vocab_size(with_added_tokens=False)
    except Exception as exc:
        raise BenchError(f"--tokenizer {path!r}: cannot read {file}: {exc}") from exc
    return size
