"""The DeepSeek-V4 compressor a chunk at a time (the serving form, state carried between
chunks) gives the entries of the whole sequence at once, for any split, both with and without
overlapping windows. (The whole-sequence form is checked against transformers in
openinfer-deepseek-v4's tests.)"""

from __future__ import annotations

import pytest
import torch

from openinfer_deepseek_v4.kernels.compress import (
    compress_chunk_ref,
    compress_kv_ref,
    compressor_state,
)
from openinfer_deepseek_v4.kernels.rotary import rope_frequencies


@pytest.mark.parametrize(("ratio", "overlap"), [(4, True), (8, False), (4, False)])
@pytest.mark.parametrize("chunks", [[37], [1] * 37, [3, 1, 16, 5, 12], [4, 4, 29]])
def test_chunks_give_the_whole_sequences_entries(ratio: int, overlap: bool,
                                                 chunks: list[int]) -> None:
    g = torch.Generator().manual_seed(ratio + len(chunks))
    d = 16
    width = (2 if overlap else 1) * d
    kv, gate = torch.randn(37, width, generator=g), torch.randn(37, width, generator=g)
    bias, norm = torch.randn(ratio, width, generator=g), torch.randn(d, generator=g)
    freqs = rope_frequencies(4, 160000.0, yarn_factor=16, original_max_positions=65536)
    args = dict(ratio=ratio, overlap=overlap, norm_eps=1e-6)
    whole = compress_kv_ref(kv, gate, bias, norm, freqs, **args)
    state, start, parts = compressor_state(ratio, width), 0, []
    for n in chunks:
        parts.append(compress_chunk_ref(kv[start:start + n], gate[start:start + n], start,
                                        state, bias, norm, freqs, **args))
        start += n
    assert whole.shape == (37 // ratio, d)
    torch.testing.assert_close(torch.cat(parts), whole, rtol=1e-5, atol=1e-5)
