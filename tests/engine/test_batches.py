"""Batches as training sees them: padding masked, the data order a checkpoint can restore."""

from types import SimpleNamespace

from pytest_ftready.data.encoding import IGNORE_INDEX
from pytest_ftready.engine.batches import DataOrder, collate, worst_case_batch


def example(n, start=1):
    ids = tuple(range(start, start + n))
    return SimpleNamespace(input_ids=ids, labels=(IGNORE_INDEX,) + ids[1:], length=n)


def test_collate_pads_right_and_masks_padding_from_attention_and_loss():
    batch = collate([example(3), example(1, start=9)], pad_id=0)
    assert batch["input_ids"].tolist() == [[1, 2, 3], [9, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[IGNORE_INDEX, 2, 3], [IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]]
    assert collate([example(3)], pad_id=0, pad_to=5)["input_ids"].shape == (1, 5)


def test_worst_case_batch_takes_the_longest_rows_padded_to_max_length():
    rows = [example(n) for n in (2, 7, 4, 5)]
    batch = worst_case_batch(rows, micro_batch=2, max_length=8, pad_id=0)
    assert batch["attention_mask"].sum(dim=1).tolist() == [7, 5] and batch["input_ids"].shape == (2, 8)
    assert worst_case_batch(rows[:1], micro_batch=3, max_length=4, pad_id=0)["input_ids"].shape == (3, 4)


def test_data_order_resumes_exactly_from_its_state():
    order = DataOrder(10, micro_batch=3, seed=7)
    for _ in range(4):
        order.next_indices()
    saved = order.state_dict()
    ahead = [order.next_indices() for _ in range(5)]
    again = DataOrder(10, micro_batch=3, seed=0)
    again.load_state_dict(saved)
    assert [again.next_indices() for _ in range(5)] == ahead
    assert sorted(DataOrder(6, 6, seed=1).next_indices()) == list(range(6))  # an epoch is a permutation
