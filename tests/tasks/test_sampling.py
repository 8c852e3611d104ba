import pytest

from rlhfkit.tasks import review_prompts, toy_prompts
from rlhfkit.tasks.sampling import seeded_sample


def test_seeded_sample_is_a_seeded_prefix_of_one_shuffle():
    prompts = [f"p{i}" for i in range(20)]
    full = seeded_sample(prompts, "train", None, seed=3)
    assert sorted(full) == sorted(prompts) and full != prompts  # a permutation, not the input order
    assert seeded_sample(prompts, "train", 5, seed=3) == full[:5]
    assert seeded_sample(prompts, "train", 5, seed=4) != full[:5]
    assert prompts == [f"p{i}" for i in range(20)]  # the caller's list is not shuffled in place


@pytest.mark.parametrize("n", [0, -1, 2.0, "3"])
def test_seeded_sample_rejects_a_bad_n(n):
    with pytest.raises(ValueError, match="n must be a positive int"):
        seeded_sample(["a", "b"], "train", n, seed=0)


def test_both_tasks_refuse_more_prompts_than_the_split_holds():
    for draw in (toy_prompts, review_prompts):
        available = len(draw("test"))
        with pytest.raises(ValueError, match=f"'test' split has only {available} distinct prompts"):
            draw("test", n=available + 1)
        assert len(draw("test", n=available)) == available
