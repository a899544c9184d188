"""`bench suffix`'s section behind a prefix cache (measure.suffix.SharedPrefix): the shared prefix of structured
requests is found, restored from a prefix cache in the run's own folder, and every arm behind it gives plain
greedy's tokens without it; a folder that lost its snapshots is one clear error, never a silent prefill."""
from __future__ import annotations

import pytest

from lessonkit.engine.generate import generate
from lessonkit.errors import LessonkitError
from lessonkit.measure.suffix import SharedPrefix, shared_prefix_lengths
from lessonkit.models.registry import load_model
from lessonkit.speculative.drafters import NGramDrafter
from lessonkit.speculative.suffix import SuffixDrafter
from lessonkit.workloads.structured import structured_prompts

MAX_NEW = 16


def test_shared_prefix_lengths():
    a, b, c = [1, 2, 3, 4, 5], [1, 2, 3, 9], [7, 8]
    assert shared_prefix_lengths([a, b, c]) == [3, 3, 0]
    assert shared_prefix_lengths([a, list(a)]) == [4, 4]          # the last token is always left to prefill
    assert shared_prefix_lengths([a]) == [0]


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2-135m")


def test_every_arm_behind_the_cache_gives_plain_greedys_tokens(smollm2, tmp_path):
    held = structured_prompts(smollm2, "heldout", 1)
    train = structured_prompts(smollm2, "train", 1)
    shared = SharedPrefix(smollm2, held + train, tmp_path / "prefix")
    assert all(shared.lengths[tuple(p)] > 40 for p in held)       # each family's system turn and worked example
    assert len(shared.cache.entries()) == 3                        # one snapshot a family
    runs = {"plain": shared.runner(MAX_NEW), "ngram": shared.runner(MAX_NEW, NGramDrafter(), 4),
            "suffix": shared.runner(MAX_NEW, SuffixDrafter(None, learn=False))}
    for p in held:
        ref = generate(smollm2, p, MAX_NEW).token_ids
        for name, run in runs.items():
            ids, stats = run(p)
            assert ids == ref, name
            assert stats["restore_s"] > 0 and stats["ttft_s"] >= stats["restore_s"]


def test_a_folder_that_lost_its_snapshots_is_one_clear_error(smollm2, tmp_path):
    held = structured_prompts(smollm2, "heldout", 1, families=("records",)) + \
        structured_prompts(smollm2, "train", 1, families=("records",))
    shared = SharedPrefix(smollm2, held, tmp_path / "prefix")
    shared.cache.clear()
    with pytest.raises(LessonkitError, match=r"restored 0 of the prompt's \d+ shared tokens"):
        shared.runner(MAX_NEW)(held[0])
