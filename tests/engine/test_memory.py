"""engine.memory.TensorBytes: storages, not tensors, are what hold memory."""

from __future__ import annotations

from pytest_ftready.engine.memory import TensorBytes


def test_a_view_keeps_its_storage_counted_after_the_base_tensor_dies():
    import torch

    tracker = TensorBytes()
    with tracker.watching():
        base = torch.ones(1000)  # 4000 bytes
        view = base.view(10, 100)
        del base
        assert tracker.live == 4000  # counting tensors dropped to 0 here and undercounted the step
        view.add_(1)  # in place: nothing new
        doubled = view * 2
        assert tracker.live == 8000 and tracker.peak == 8000
        del view
        assert tracker.live == 4000
    del doubled
    assert tracker.live == 0 and tracker.peak == 8000


def test_live_set_at_the_peak_is_reconstructed_from_births_and_deaths():
    import torch

    tracker = TensorBytes()
    with tracker.watching():
        a = torch.zeros(100)
        b = torch.zeros(50)
        del a
        c = torch.zeros(10)
    assert tracker.peak == 600 and sorted(tracker.nbytes[s] for s in tracker.live_at(tracker.peak_event)) == [200, 400]
    del b, c


def test_meta_and_sparse_tensors_hold_no_counted_bytes():
    import torch

    tracker = TensorBytes()
    with tracker.watching():
        shape_only = torch.empty(1000, device="meta") * 2
        sparse = torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.tensor([1.0, 2.0]), (4,),
                                         check_invariants=True) * 2
        dense = sparse.to_dense()
    assert shape_only.shape == (1000,) and 4000 not in tracker.nbytes  # the meta tensor's would-be bytes
    assert tracker.serial_of(dense) is not None  # a dense result of sparse inputs is counted
