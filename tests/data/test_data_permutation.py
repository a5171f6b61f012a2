import numpy as np
import pytest

from tradewind.data import FeistelPermutation


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 65, 1000, 4097])
def test_feistel_permutation_is_a_bijection_of_the_index_space(n):
    image = FeistelPermutation(n, key=(3, 1))(np.arange(n))

    assert image.dtype == np.int64 and sorted(image.tolist()) == list(range(n))


def test_feistel_permutation_depends_only_on_its_key_and_any_index_can_be_asked_alone():
    perm = FeistelPermutation(10_000, key=(0, 5))
    whole = perm(np.arange(10_000))

    assert np.array_equal(FeistelPermutation(10_000, key=(0, 5))(np.arange(10_000)), whole)
    assert perm(np.array([1234]))[0] == whole[1234]
    assert not np.array_equal(FeistelPermutation(10_000, key=(0, 6))(np.arange(10_000)), whole)


def test_feistel_permutation_actually_shuffles():
    image = FeistelPermutation(10_000, key=(1,))(np.arange(10_000))

    fixed_points = int(np.count_nonzero(image == np.arange(10_000)))
    assert fixed_points < 20  # a random permutation has about one
    assert abs(np.corrcoef(image, np.arange(10_000))[0, 1]) < 0.05
