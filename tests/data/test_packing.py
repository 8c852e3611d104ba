"""ConstantLengthDataset: full blocks, boundary labels, restarting positions, no cross-document attention."""

from __future__ import annotations

import datasets
import pytest
import torch

from rlhfkit.data.packing import ConstantLengthDataset
from rlhfkit.testing import tiny_model, tiny_tokenizer

DOCS = [
    "the cat sat on the mat",
    "a dog ran far away today",
    "hello there friend of mine",
    "rain falls on the quiet town",
    "we like to read long books at night",
]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(padding_side="right")


def _packed(tok, seq_length, **kw):
    ds = datasets.Dataset.from_list([{"text": d} for d in DOCS])
    kw.setdefault("shuffle", False)
    return list(ConstantLengthDataset(tok, ds, dataset_text_field="text", seq_length=seq_length, **kw))


def test_blocks_are_full_and_follow_the_stream(tok):
    # small buffers (1 document each) so the carried remainder between buffers is exercised too
    blocks = _packed(tok, 16, num_of_sequences=1, chars_per_token=1)
    stream = []
    for d in DOCS:
        stream += tok(d)["input_ids"] + [tok.eos_token_id]
    assert len(blocks) == len(stream) // 16  # only the final partial block is dropped
    assert all(b["input_ids"].shape == (16,) for b in blocks)
    assert torch.cat([b["input_ids"] for b in blocks]).tolist() == stream[: 16 * len(blocks)]


def test_labels_and_positions_restart_at_documents(tok):
    blocks = _packed(tok, 16)
    stream_starts = []
    for d in DOCS:
        n = len(tok(d)["input_ids"]) + 1
        stream_starts += [True] + [False] * (n - 1)
    for b_idx, block in enumerate(blocks):
        starts = stream_starts[16 * b_idx : 16 * (b_idx + 1)]
        starts[0] = True
        pos, ids, labels = (
            block["position_ids"].tolist(),
            block["input_ids"].tolist(),
            block["labels"].tolist(),
        )
        expected_pos, p = [], -1
        for s in starts:
            p = 0 if s else p + 1
            expected_pos.append(p)
        assert pos == expected_pos
        for i, (s, t, lab) in enumerate(zip(starts, ids, labels)):
            # the first token of a document is never a target (it would be predicted from the
            # previous document's EOS); every other token, EOS included, is its own label
            assert lab == (-100 if s and i > 0 else t)
        assert any(s for s in starts[1:]), "each 16-token block should contain a document boundary"


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_no_attention_across_documents(tok, name):
    model = tiny_model(name).eval()
    block = _packed(tok, 24)[0]
    pos = block["position_ids"]
    bounds = (pos == 0).nonzero().flatten().tolist() + [len(pos)]
    assert len(bounds) >= 3, "the block must hold at least two documents"
    with torch.no_grad():
        packed = model(input_ids=block["input_ids"][None], position_ids=pos[None], use_cache=False).logits[0]
        leaky = model(input_ids=block["input_ids"][None], use_cache=False).logits[0]
        for start, end in zip(bounds[:-1], bounds[1:]):
            alone = model(input_ids=block["input_ids"][None, start:end]).logits[0]
            torch.testing.assert_close(packed[start:end], alone, atol=1e-5, rtol=1e-5)
        # sanity: the plain causal forward does see the previous document, so the check above can fail
        second = slice(bounds[1], bounds[2])
        assert not torch.allclose(leaky[second], packed[second], atol=1e-4)


def test_infinite_cycles_and_shuffle_is_seeded(tok):
    ds = datasets.Dataset.from_list([{"text": d} for d in DOCS])
    it = iter(ConstantLengthDataset(tok, ds, dataset_text_field="text", seq_length=8, infinite=True))
    finite = _packed(tok, 8, shuffle=True)
    many = [next(it) for _ in range(3 * len(finite))]  # more blocks than one pass holds
    assert len(many) == 3 * len(finite)
    again = _packed(tok, 8, shuffle=True)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(finite, again))


def test_formatting_func_and_errors(tok):
    ds = datasets.Dataset.from_list([{"q": d, "a": "yes"} for d in DOCS])
    blocks = list(
        ConstantLengthDataset(
            tok, ds, formatting_func=lambda r: f"{r['q']} -> {r['a']}", seq_length=8, shuffle=False
        )
    )
    assert blocks and blocks[0]["input_ids"].tolist() == tok(f"{DOCS[0]} -> yes")["input_ids"][:8]
    with pytest.raises(ValueError, match="dataset_text_field"):
        ConstantLengthDataset(tok, ds)
    with pytest.raises(ValueError, match="seq_length"):
        ConstantLengthDataset(tok, ds, dataset_text_field="q", seq_length=1)


# --- TRL 1.x's strategies on tokenised examples ------------------------------------------------------------


def test_best_fit_decreasing_bins_by_hand():
    from rlhfkit.data.packing import best_fit_decreasing

    # longest first: 5 -> bin0 (room 1); 4 -> bin1 (room 2); 3 -> bin2 (room 3); 2 -> tightest fit is
    # bin1 (room 2 -> 0); 1 -> bin0 (room 1 -> 0); 1 -> bin2 (room 3 -> 2)
    assert best_fit_decreasing([1, 5, 3, 2, 4, 1], 6) == [[1, 0], [4, 3], [2, 5]]
    assert best_fit_decreasing([2, 2], 4) == [[0, 1]]  # equal lengths keep their order
    assert best_fit_decreasing([], 4) == []
    with pytest.raises(ValueError, match="longer than the capacity 3"):
        best_fit_decreasing([4], 3)
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        best_fit_decreasing([1], 0)


def test_pack_examples_strategies_by_hand():
    from rlhfkit.data.packing import pack_examples

    rows = {
        "input_ids": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11]],
        "mask": [[1, 1, 1, 0, 0], [1, 0], [1, 1, 0], [1]],
    }
    # bfd: [1..5] cut to 4; bins by length 4, 3, 2, 1 -> [4], [3, 1], [2]
    assert pack_examples(rows, 4, "bfd") == {
        "input_ids": [[1, 2, 3, 4], [8, 9, 10, 11], [6, 7]],
        "mask": [[1, 1, 1, 0], [1, 1, 0, 1], [1, 0]],
        "seq_lengths": [[4], [3, 1], [2]],
    }
    # bfd_split: [5] goes on as its own piece and fills [8, 9, 10]'s bin
    split = pack_examples(rows, 4, "bfd_split")
    assert split["input_ids"] == [[1, 2, 3, 4], [8, 9, 10, 5], [6, 7, 11]]
    assert split["seq_lengths"] == [[4], [3, 1], [2, 1]]
    # wrapped: the stream of 11 tokens cut every 4, the last row shorter, no boundaries
    wrapped = pack_examples(rows, 4, "wrapped")
    assert wrapped["input_ids"] == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11]] and "seq_lengths" not in wrapped
    assert wrapped["mask"] == [[1, 1, 1, 0], [0, 1, 0, 1], [1, 0, 1]]
    with pytest.raises(ValueError, match="packing strategy must be"):
        pack_examples(rows, 4, "ffd")


def test_pack_dataset_on_map_and_iterable_datasets():
    import datasets

    from rlhfkit import pack_dataset

    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4], [5, 6]]})
    assert pack_dataset(ds, 4)[:] == {"input_ids": [[1, 2, 3, 4], [5, 6]], "seq_lengths": [[3, 1], [2]]}
    streamed = pack_dataset(ds.to_iterable_dataset(), 4, "wrapped")
    assert [row["input_ids"] for row in streamed] == [[1, 2, 3, 4], [5, 6]]
