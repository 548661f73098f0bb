"""torch's selection, triangle, join and einsum functions reached as ``torch.<name>`` with
``import neural_arch as torch``: values and gradients against torch, ties, edge cases, and a
ported generate loop."""
from __future__ import annotations

import numpy as np
import pytest

import neural_arch as na
import neural_arch.nn.functional as F

pytestmark = pytest.mark.timeout(60)

RNG = np.random.default_rng(1)


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def both(torch, *arrays):
    return ([na.tensor(a, requires_grad=True) for a in arrays],
            [torch.tensor(a, requires_grad=True) for a in arrays])


def assert_grads_match(torch, ours_out, theirs_out, ours_in, theirs_in):
    np.testing.assert_allclose(ours_out.numpy(), theirs_out.detach().numpy(), rtol=1e-10,
                               atol=1e-12)
    weights = RNG.standard_normal(ours_out.shape)
    (ours_out * weights).sum().backward()
    (theirs_out * torch.tensor(weights)).sum().backward()
    for a, b in zip(ours_in, theirs_in):
        np.testing.assert_allclose(a.grad, b.grad.numpy(), rtol=1e-10, atol=1e-12)


def with_ties(*shape):
    return RNG.integers(0, 4, shape).astype(np.float64)  # many equal values


@pytest.mark.parametrize("dim", [-1, 0, 1])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_stable_values_indices_and_grad(torch, dim, descending):
    data = with_ties(4, 6)
    (x,), (tx,) = both(torch, data)
    ours = na.sort(x, dim=dim, descending=descending, stable=True)
    theirs = torch.sort(tx, dim=dim, descending=descending, stable=True)
    np.testing.assert_array_equal(ours.indices.numpy(), theirs.indices.numpy())
    assert ours.indices.dtype == np.int64
    values, indices = ours  # unpacks like torch's return type
    assert values is ours.values and indices is ours.indices
    np.testing.assert_array_equal(
        na.argsort(x, dim, descending).numpy(),
        torch.argsort(tx, dim=dim, descending=descending, stable=True).numpy())
    assert_grads_match(torch, ours.values, theirs.values, [x], [tx])


def test_sort_nan_integers_scalars_and_empty(torch):
    data = np.array([2.0, np.nan, -1.0, np.inf, np.nan, 2.0])
    for descending in (False, True):
        ours = na.sort(na.tensor(data), descending=descending)
        theirs = torch.sort(torch.tensor(data), descending=descending, stable=True)
        np.testing.assert_array_equal(ours.indices.numpy(), theirs.indices.numpy())
        np.testing.assert_array_equal(ours.values.numpy(), theirs.values.numpy())
    ints = np.array([3, -(2 ** 63), 3, 2 ** 63 - 1, 0])
    np.testing.assert_array_equal(
        na.sort(na.tensor(ints), descending=True).indices.numpy(),
        torch.sort(torch.tensor(ints), descending=True, stable=True).indices.numpy())
    scalar = na.sort(na.tensor(5.0))
    assert scalar.values.shape == () and scalar.indices.item() == 0
    assert na.sort(na.zeros(0)).values.shape == (0,)
    with pytest.raises(IndexError, match="dim 2 is out of range"):
        na.sort(na.zeros(2, 3), dim=2)


@pytest.mark.parametrize("k,dim,largest", [(3, -1, True), (2, 0, False), (0, -1, True),
                                           (6, 1, False), (1, -2, True)])
def test_topk_values_indices_and_grad(torch, k, dim, largest):
    distinct = RNG.permutation(24).reshape(4, 6).astype(np.float64)  # one right answer
    (x,), (tx,) = both(torch, distinct)
    ours = na.topk(x, k, dim=dim, largest=largest)
    theirs = torch.topk(tx, k, dim=dim, largest=largest)
    np.testing.assert_array_equal(ours.indices.numpy(), theirs.indices.numpy())
    values, indices = ours  # unpacks like torch's return type
    assert values is ours.values and indices.dtype == np.int64
    if k:
        assert_grads_match(torch, ours.values, theirs.values, [x], [tx])
    else:
        assert ours.values.shape == tuple(theirs.values.shape)
    with pytest.raises(RuntimeError, match="out of range"):
        na.topk(x, 7)


@pytest.mark.parametrize("largest", [True, False])
def test_topk_ties_take_the_lower_index_first(torch, largest):
    data = with_ties(5, 8)
    ours = na.topk(na.tensor(data), 4, largest=largest)
    theirs = torch.topk(torch.tensor(data), 4, largest=largest)
    # torch gives the same values but leaves the order of equal ones unspecified
    np.testing.assert_array_equal(ours.values.numpy(), theirs.values.numpy())
    np.testing.assert_array_equal(np.take_along_axis(data, ours.indices.numpy(), -1),
                                  ours.values.numpy())
    stable = torch.sort(torch.tensor(data), descending=largest, stable=True).indices[:, :4]
    np.testing.assert_array_equal(ours.indices.numpy(), stable.numpy())
    scalar = na.topk(na.tensor(2.0), 1)
    assert scalar.values.shape == () and scalar.indices.item() == 0


def test_where_three_and_one_argument_forms(torch):
    cond = RNG.random((3, 1, 4)) > 0.5
    (a, b), (ta, tb) = both(torch, RNG.standard_normal((3, 5, 4)), RNG.standard_normal((5, 1)))
    ours = na.where(na.tensor(cond), a, b)
    theirs = torch.where(torch.tensor(cond), ta, tb)
    assert_grads_match(torch, ours, theirs, [a, b], [ta, tb])
    scalar_form = na.where(na.tensor(cond), a, 0.0)
    np.testing.assert_array_equal(scalar_form.numpy(),
                                  torch.where(torch.tensor(cond), ta, 0.0).detach().numpy())
    mask = np.array([[True, False, True], [False, False, True]])
    for ours_i, theirs_i in zip(na.where(na.tensor(mask)), torch.where(torch.tensor(mask))):
        np.testing.assert_array_equal(ours_i.numpy(), theirs_i.numpy())
        assert ours_i.dtype == np.int64
    with pytest.raises(TypeError, match="either"):
        na.where(na.tensor(mask), a)


@pytest.mark.parametrize("diagonal", [0, 1, -1, 5])
def test_tril_triu_values_and_grad(torch, diagonal):
    for ours_fn, theirs_fn in ((na.tril, torch.tril), (na.triu, torch.triu)):
        (x,), (tx,) = both(torch, RNG.standard_normal((2, 3, 4)))
        assert_grads_match(torch, ours_fn(x, diagonal=diagonal),
                           theirs_fn(tx, diagonal=diagonal), [x], [tx])
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        na.tril(na.zeros(3))


def test_cat_concat_stack_follow_torch(torch):
    (a, b), (ta, tb) = both(torch, RNG.standard_normal((2, 3)), RNG.standard_normal((2, 1)))
    assert_grads_match(torch, na.cat((a, b), dim=1), torch.cat((ta, tb), dim=1), [a, b],
                       [ta, tb])
    (c, d), (tc, td) = both(torch, RNG.standard_normal((2, 3)), RNG.standard_normal((2, 3)))
    assert_grads_match(torch, na.stack([c, d], -1), torch.stack([tc, td], -1), [c, d],
                       [tc, td])
    assert na.concat([c, d], 0).shape == tuple(torch.concat([tc, td], 0).shape)


@pytest.mark.parametrize("equation,shapes", [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("bij,bjk->bik", [(2, 2, 3), (2, 3, 4)]),
    ("ij->", [(2, 3)]),
    ("ij->i", [(2, 3)]),  # j is summed away: its gradient broadcasts back
    ("ii->i", [(3, 3)]),  # a diagonal
    ("ii", [(3, 3)]),  # the trace, implicit output
    ("i,j", [(2,), (3,)]),  # outer product, implicit output
    ("ij,kj", [(2, 3), (4, 3)]),
    ("...ij,...jk->...ik", [(2, 1, 2, 3), (4, 3, 5)]),  # broadcast batch dimensions
    ("ij,ij->ij", [(1, 3), (2, 3)]),  # a size-1 dimension broadcasts
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("i,i,i->", [(4,), (4,), (4,)]),
])
def test_einsum_values_and_grads(torch, equation, shapes):
    ours, theirs = both(torch, *(RNG.standard_normal(s) for s in shapes))
    assert_grads_match(torch, na.einsum(equation, *ours), torch.einsum(equation, *theirs),
                       ours, theirs)


def test_gradients_against_finite_differences_without_torch():
    a, b = (na.tensor(RNG.standard_normal(s), requires_grad=True) for s in ((2, 3, 3), (3, 4)))
    assert na.gradcheck(lambda x, y: na.einsum("bii,ik->bk", x, y), [a, b])
    distinct = na.tensor(RNG.permutation(12).reshape(3, 4) * 0.5, requires_grad=True)
    assert na.gradcheck(lambda x: na.topk(x, 2, dim=0).values, [distinct])
    assert na.gradcheck(lambda x: na.sort(x, descending=True).values, [distinct])
    assert na.gradcheck(lambda x: na.triu(x, 1) * 3 + na.tril(x, -1), [distinct])


def test_einsum_list_form_same_operand_twice_and_errors(torch):
    (x,), (tx,) = both(torch, RNG.standard_normal((3, 4)))
    assert_grads_match(torch, na.einsum("ij,ij->i", [x, x]), torch.einsum("ij,ij->i", [tx, tx]),
                       [x], [tx])
    with pytest.raises(ValueError, match="2 operands"):
        na.einsum("ij,jk->ik", x)
    with pytest.raises(ValueError, match="do not fit"):
        na.einsum("ijk->i", x)


def test_ported_generate_loop_runs():
    torch = na  # the way a ported script reads
    torch.manual_seed(0)
    vocab, width = 11, 8
    embed = torch.randn(vocab, width)
    head = torch.randn(width, vocab)

    def model(idx):
        return torch.einsum("btc,cv->btv", embed[idx], head)

    @torch.no_grad()
    def generate(idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        for _ in range(max_new_tokens):
            logits = model(idx)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.shape[-1]))
                logits[logits < v[:, [-1]]] = -float("inf")
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1, generator=generator)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx

    start = torch.zeros((2, 1), dtype=torch.long)
    out = generate(start, 6, temperature=0.8, top_k=3, generator=torch.Generator().manual_seed(4))
    assert out.shape == (2, 7) and out.dtype == torch.long
    again = generate(start, 6, temperature=0.8, top_k=3,
                     generator=torch.Generator().manual_seed(4))
    np.testing.assert_array_equal(out.numpy(), again.numpy())
    # each token came from the top 3 of its step's logits
    for row in range(2):
        for step in range(6):
            logits = model(out[row:row + 1, :step + 1]).numpy()[0, -1]
            assert out.numpy()[row, step + 1] in np.argsort(-logits)[:3]
