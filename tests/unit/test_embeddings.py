import numpy as np
import pytest

from posttrainllm.embeddings import cosine_similarity, nearest_neighbours, sinusoidal_positions


def test_nearest_neighbours_by_cosine_and_restricted_to_candidates():
    table = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [-1.0, 0.0]])
    assert [i for i, _ in nearest_neighbours(table, 0, k=3)] == [1, 2, 3]
    assert [i for i, _ in nearest_neighbours(table, 0, k=2, candidates=[2, 3])] == [2, 3]
    np.testing.assert_allclose(np.diag(cosine_similarity(table)), 1.0)
    with pytest.raises(ValueError, match="outside a table"):
        nearest_neighbours(table, 9)


def test_sinusoidal_positions_match_the_formula_and_need_an_even_width():
    table = sinusoidal_positions(10, 4)
    assert table[3, 0] == pytest.approx(np.sin(3)) and table[3, 3] == pytest.approx(np.cos(3 / 100))
    with pytest.raises(ValueError, match="even"):
        sinusoidal_positions(4, 3)
