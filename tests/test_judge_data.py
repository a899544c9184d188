"""The judge's training data is disjoint from the shipped stream (the evaluation set)."""
import pytest

from lessonkit.engine.errors import LessonkitError
from lessonkit.workloads import judge_data as jd
from lessonkit.workloads.monitoring import FAMILIES, _entity_pool, load_stream


def test_training_data_is_disjoint_from_the_shipped_stream():
    train, shipped = jd.training_items(), load_stream()
    report = jd.check_disjoint(train, shipped)
    assert report["shared_items"] == 0
    assert not {it.text for it in train} & {it.text for it in shipped}
    for slot, names in jd.TRAIN_POOLS.items():
        assert not set(names) & set(_entity_pool(slot)), slot
    shipped_tpl = {t for f in FAMILIES for t in f.phrasings + (f.negated or ())}
    assert not shipped_tpl & {t for f in jd.TRAIN_FAMILIES for t in f.phrasings + (f.negated or ())}


def test_training_data_covers_every_family_and_perturbation():
    train = jd.training_items()
    assert {it.family for it in train} == {f.name for f in FAMILIES}
    assert {it.perturbation for it in train} - {None} == set(jd.PERTURBATIONS)
    assert len({it.text for it in train}) == len(train)


def test_disjointness_check_catches_a_shared_item():
    shipped = load_stream()
    with pytest.raises(LessonkitError, match="identical items"):
        jd.check_disjoint(jd.training_items()[:50] + shipped[:1], shipped)


def test_judge_answer_follows_the_schema_and_label():
    from lessonkit.workloads.triage import parse_answer
    for it in jd.training_items()[:40] + jd.few_shot_items():
        obj = parse_answer(jd.judge_answer(it))
        assert obj["needs_action"] == it.needs_action
        assert obj["severity"] == ("high" if it.needs_action else "low")
