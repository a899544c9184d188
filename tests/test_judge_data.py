"""The judge's training data is disjoint from the shipped stream (the evaluation set)."""
import re

import pytest

from lessonkit.errors import LessonkitError
from lessonkit.training import judge_data as jd
from lessonkit.workloads.monitoring import FAMILIES, _entity_pool, load_stream


@pytest.mark.parametrize("wide,wide_entities,grammar,ten", [(False, False, False, False), (True, False, False, False),
                                                             (True, True, False, False), (False, True, True, False),
                                                             (False, True, True, True)])
def test_training_data_is_disjoint_from_the_shipped_stream(wide, wide_entities, grammar, ten):
    train = jd.training_items(wide=wide, wide_entities=wide_entities, grammar=grammar, ten_net_ips=ten)
    shipped = load_stream()
    report = jd.check_disjoint(train, shipped)
    assert report["shared_items"] == 0
    assert not {it.text for it in train} & {it.text for it in shipped}
    for pools in (jd.TRAIN_POOLS, jd.WIDE_TRAIN_POOLS, jd.TEN_NET_POOLS):
        for slot, names in pools.items():
            assert not set(names) & set(_entity_pool(slot)), slot
    shipped_names = {n for s in jd.TRAIN_POOLS for n in _entity_pool(s)}
    assert not [it.text for it in train if any(n in it.text for n in shipped_names)]
    shipped_tpl = {t for f in FAMILIES for t in f.phrasings + (f.negated or ())}
    assert not shipped_tpl & {t for f in jd.GRAMMAR_TRAIN_FAMILIES for t in f.phrasings + (f.negated or ())}


def test_wording_grammar_keeps_the_rules_and_stays_away_from_shipped_wordings():
    hand = {t for f in jd.WIDE_TRAIN_FAMILIES for t in f.phrasings + (f.negated or ())}
    for f, g in zip(jd.GRAMMAR_TRAIN_FAMILIES, FAMILIES):
        assert (f.name, f.number, f.units, f.slots) == (g.name, g.number, g.units, g.slots)
        assert len(set(f.phrasings)) == len(f.phrasings) >= 20, f.name
        for t in f.phrasings:
            assert set(re.findall(r"\{(\w+)\}", t)) == set(g.slots) | ({"n"} if g.number else set()), t
            if f.units:
                assert t.count(" " + f.units[0]) == 1, t
        if f.negated:      # a negation adds a "not" and keeps the wording's index
            assert len(f.negated) == len(f.phrasings)
            assert all(" not " in n and " not " not in p for p, n in zip(f.phrasings, f.negated) if p not in hand)
        new = [t for t in f.phrasings + (f.negated or ()) if t not in hand]
        assert new and not [t for t in new if jd.near_shipped(t)], f.name


@pytest.mark.parametrize("text,near", [
    ("disk usage on {host} is at {n}% today", True),          # a shipped wording with a word added
    ("{{\"path\": \"/api/orders\", \"status\": {n}, \"host\": \"{host}\", \"service\": \"{service}\"}}", True),
    ("{service} RSS now {n} MB", False),
    ("storage on {host} holds {n}% data", False),
])
def test_near_shipped_finds_near_copies(text, near):
    assert jd.near_shipped(text) is near


def test_wide_phrasings_keep_the_families_rules_and_use_every_wording():
    for f, g in zip(jd.WIDE_TRAIN_FAMILIES, FAMILIES):
        assert (f.name, f.number, f.units, f.slots) == (g.name, g.number, g.units, g.slots)
        assert len(f.phrasings) == len(jd.PHRASINGS[f.name]) + 6 and (f.negated is None or len(f.negated) == len(f.phrasings))
        if f.units:        # a unit change rewrites " <unit>": every wording must carry it exactly once
            assert all(t.count(" " + f.units[0]) == 1 for t in f.phrasings), f.name
    wide = jd.training_items(wide=True)
    backup = {it.text.replace("catalog-db", "{db}") for it in wide if it.family == "backup" and "catalog-db" in it.text}
    assert len(backup) >= 15                   # drawn evenly: most of the 20 wordings (10, and their negations)


def test_training_data_covers_every_family_and_perturbation():
    train = jd.training_items()
    assert {it.family for it in train} == {f.name for f in FAMILIES}
    assert {it.perturbation for it in train} - {None} == set(jd.PERTURBATIONS)
    assert len({it.text for it in train}) == len(train)


def test_wide_entity_pools_extend_the_training_pools_and_spread_the_names():
    for slot, names in jd.TRAIN_POOLS.items():
        assert set(names) <= set(jd.WIDE_TRAIN_POOLS[slot]), slot
        assert len(set(jd.WIDE_TRAIN_POOLS[slot])) == len(jd.WIDE_TRAIN_POOLS[slot]) >= 2 * len(names), slot
    narrow, wide = jd.training_items(), jd.training_items(wide_entities=True)
    ips = lambda items: {ip for it in items for ip in re.findall(r"\d+\.\d+\.\d+\.\d+", it.text)}  # noqa: E731
    assert ips(narrow) == set(jd.TRAIN_POOLS["ip"]) and len(ips(wide)) > 5 * len(ips(narrow))


def test_disjointness_check_catches_a_shipped_name():
    shipped = load_stream()
    leak = jd.training_items()[:1]
    leak[0] = type(leak[0])(**{**leak[0].to_dict(), "text": leak[0].text + " on web-01"})
    with pytest.raises(LessonkitError, match="name a shipped entity"):
        jd.check_disjoint(leak, shipped)


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


def test_perturbation_weights_draw_more_unit_changes_and_leave_the_default_draws_alone():
    from collections import Counter
    from dataclasses import replace

    from lessonkit.workloads.monitoring import generate_stream
    count = lambda items: Counter(it.perturbation for it in items)  # noqa: E731
    base = jd.TRAIN_STREAM
    plain = jd.training_items(base)
    assert plain == jd.training_items(replace(base, perturbation_weights=()))
    weighted = count(jd.training_items(replace(base, perturbation_weights=(("unit_change", 2.5),))))
    assert weighted["unit_change"] > 1.5 * count(plain)["unit_change"]
    assert [it.to_dict() for it in generate_stream("full")] == [it.to_dict() for it in load_stream()]


def test_ten_net_ips_share_the_shipped_network_but_no_address():
    shipped_ips = set(_entity_pool("ip"))
    assert all(ip.startswith("10.") for ip in shipped_ips) and all(ip.startswith("10.") for ip in jd.TEN_NET_IPS)
    assert not [(a, b) for a in shipped_ips for b in jd.TEN_NET_IPS if a in b or b in a]
    ips = {ip for it in jd.training_items(wide_entities=True, grammar=True, ten_net_ips=True)
           for ip in re.findall(r"\d+\.\d+\.\d+\.\d+", it.text)}
    assert ips & set(jd.TEN_NET_IPS) and ips <= set(jd.TEN_NET_POOLS["ip"])
    with pytest.raises(LessonkitError, match="wide_entities"):
        jd.training_items(ten_net_ips=True)


def test_disjointness_check_catches_an_ip_that_contains_a_shipped_one():
    item = jd.training_items(wide_entities=True, ten_net_ips=True)[0]
    shipped_ip = sorted(_entity_pool("ip"))[0]
    leak = [type(item)(**{**item.to_dict(), "text": item.text + f" from {shipped_ip}5"})]
    with pytest.raises(LessonkitError, match="name a shipped entity"):
        jd.check_disjoint(leak, load_stream())
