"""Padding and token counts as training batches the rows."""

from pytest_ftready.data.lengths import padded_positions, padding_waste, tokens_to_process


def test_padded_positions_pad_each_micro_batch_to_its_longest():
    assert padded_positions([3, 5, 2, 2, 7], 2) == 5 * 2 + 2 * 2 + 7
    assert padded_positions([], 4) == 0


def test_padding_waste_is_the_share_of_pad_tokens():
    assert padding_waste([4, 4, 4, 4], 2) == 0.0
    assert padding_waste([1, 3], 2) == 1 - 4 / 6
    assert padding_waste([], 2) == 0.0
    assert padding_waste(sorted([1, 9, 1, 9]), 2) == 0.0  # grouping by length removes the waste


def test_tokens_to_process_packed_or_padded():
    lengths = [3, 5, 2]
    assert tokens_to_process(lengths, 2, packing=True) == 10
    assert tokens_to_process(lengths, 2, packing=False) == 12
