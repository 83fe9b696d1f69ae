"""graft_core.products: the faster calls compute the plain calls' bytes, and are refused where they would not."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from graft_core import products


def _linear(out_features: int, in_features: int, seed: int) -> torch.nn.Linear:
    lin = torch.nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(seed)))
    lin.weight.requires_grad_(False)
    return lin.eval()


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = _linear(512, 64, seed=1)
        self.down = _linear(64, 512, seed=2)
        self.lm_head = _linear(products.SPLIT_MIN_ROWS + 3 * products.BLOCK_ROWS + 5, 64, seed=3)  # a ragged last block


@pytest.mark.parametrize("rows,parts", [(262_144, 2), (262_144, 3), (33_541, 2), (1_000, 4), (256, 2), (300, 8)])
def test_blocks_cover_every_row_once_and_start_on_whole_blocks(rows, parts):
    bounds = products.blocks(rows, parts)
    assert bounds[0][0] == 0 and bounds[-1][1] == rows
    assert all(a == e_prev for (_, e_prev), (a, _) in zip(bounds, bounds[1:], strict=False))
    assert all(a % products.BLOCK_ROWS == 0 and e > a for a, e in bounds)
    assert len(bounds) <= parts


def test_split_vocabulary_is_kept_only_where_its_bytes_are_the_plain_ones():
    """MKL's 1-row product of a block of rows is the whole product's bytes on some CPUs (measured on AMD) and
    not on others (measured on an Intel Xeon): wherever the load-time probe refuses the split, its bytes did
    differ, and the plain call stays."""
    model = _Model()
    probe = products.seeded_rows(1, 64, seed=0).reshape(1, 1, -1)
    candidate = products.SplitRows(model.lm_head, 2)
    with torch.inference_mode():
        differs = not torch.equal(candidate.plain(probe), candidate.split(probe))
    plain = model.lm_head.forward
    what = products.split_vocabulary(model.lm_head, parts=2)
    if differs:
        assert what == "plain (the split product differed from the plain one on the load-time probe)", what
        assert model.lm_head.forward == plain
    else:
        assert what.startswith("split in 2"), what
        _split_rows_are_the_plain_bytes(model, plain)


def _split_rows_are_the_plain_bytes(model, plain):
    assert isinstance(model.lm_head.forward, products.SplitRows)
    gen = torch.Generator().manual_seed(7)
    with torch.inference_mode():
        for shape in [(1, 1, 64), (1, 64), (64,)]:
            x = torch.randn(*shape, generator=gen)
            got = model.lm_head(x)
            assert got.shape == plain(x).shape
            assert got.numpy().tobytes() == plain(x).numpy().tobytes()
        several = torch.randn(1, 3, 64, generator=gen)  # several rows: not split
        assert not model.lm_head.forward.applies(several)
        assert model.lm_head(several).numpy().tobytes() == plain(several).numpy().tobytes()
    x = torch.randn(1, 64, generator=gen, requires_grad=True)  # autograd: the plain call, gradients flow
    assert not model.lm_head.forward.applies(x)
    model.lm_head(x).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_split_is_refused_when_its_bytes_differ(monkeypatch):
    real = products.SplitRows.split

    def off_by_one_ulp(self, x):
        out = real(self, x)
        out.view(-1)[17] = torch.nextafter(out.view(-1)[17], torch.tensor(float("inf")))
        return out

    monkeypatch.setattr(products.SplitRows, "split", off_by_one_ulp)
    model = _Model()
    what = products.split_vocabulary(model.lm_head, parts=2)
    assert what.startswith("plain (the split product differed"), what
    assert "forward" not in model.lm_head.__dict__


def test_a_failing_block_raises_after_every_block_finished(monkeypatch):
    model = _Model()
    split = model.lm_head.forward = products.SplitRows(model.lm_head, 3)  # whether or not its bytes agree here
    done = []
    real_linear = F.linear

    def linear(x, w, *a):
        if w.data_ptr() == model.lm_head.weight.data_ptr():  # block 0 starts where the matrix does
            raise RuntimeError("block 0 failed")
        done.append(w.data_ptr())
        return real_linear(x, w, *a)

    monkeypatch.setattr(products.F, "linear", linear)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="block 0 failed"):
        model.lm_head(torch.zeros(1, 64))
    assert len(done) == len(split.bounds) - 1  # the other blocks ran to the end before the error surfaced


def test_transposed_layers_give_the_plain_bytes_at_every_row_count():
    model = _Model()
    plain = {name: m.forward for name, m in (("up", model.up), ("down", model.down))}
    report = products.speed_up(model, parts=2)
    assert report.checked_shapes == 2
    gen = torch.Generator().manual_seed(11)
    with torch.inference_mode():
        for n in range(1, 80):
            for name, m in (("up", model.up), ("down", model.down)):
                x = torch.randn(1, n, m.in_features, generator=gen)
                assert m(x).numpy().tobytes() == plain[name](x).numpy().tobytes(), (name, n)
    taken = [m.forward for m in (model.up, model.down) if isinstance(m.__dict__.get("forward"), products.Transposed)]
    assert all(t.rows <= set(products.TRANSPOSED_ROWS) for t in taken)
    split = isinstance(model.lm_head.__dict__.get("forward"), products.SplitRows)
    assert split == report.vocabulary.startswith("split")
    assert products.undo(model) == len(taken) + split
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_row_counts_whose_transposed_bytes_differ_are_left_plain(monkeypatch):
    w = _linear(512, 64, seed=5).weight
    real_mm = torch.mm

    def mm(a, b):
        out = real_mm(a, b)
        if b.shape[1] == 20:  # the transposed call for 20 rows computes one other bit
            out = out.clone()
            out[0, 0] = torch.nextafter(out[0, 0], torch.tensor(float("inf")))
        return out

    monkeypatch.setattr(products.torch, "mm", mm)
    rows = products.transposed_rows(w)
    assert 20 not in rows
    t = products.Transposed(torch.nn.Linear(64, 512, bias=False), rows)
    assert not t.applies(torch.zeros(20, 64))


def test_inputs_the_check_did_not_cover_go_to_the_plain_call():
    lin = _linear(512, 64, seed=4)
    t = products.Transposed(lin, frozenset(range(2, 65)))
    base = torch.zeros(40, 64)
    assert t.applies(base[:16])
    assert t.applies(base[1:17])  # 256 bytes in: still on the alignment
    assert not t.applies(base.view(-1)[1:1025].view(16, 64))  # 4 bytes off the alignment
    assert not t.applies(base[:16].t().contiguous().t())  # strided
    assert not t.applies(base[:16].double())  # another dtype
    assert not t.applies(base[:1])  # a row count outside the checked set
    torch.set_num_threads(torch.get_num_threads() + 1)
    try:
        assert not t.applies(base[:16])  # another thread count than the one checked under
    finally:
        torch.set_num_threads(torch.get_num_threads() - 1)
