import math

import pytest

from tasks.metrics import (
    citation_scores,
    exact_match,
    ndcg_at_k,
    normalize_answer,
    parse_ranking,
    rouge_l,
    ruler_recall,
    substring_exact_match,
    token_f1,
)


def test_normalize_answer_squad_style():
    assert normalize_answer("  The Quick, brown FOX!  ") == "quick brown fox"


def test_exact_and_substring_match():
    assert exact_match("The Paris.", ["paris"]) == 1.0
    assert exact_match("Paris is the answer", ["paris"]) == 0.0
    assert substring_exact_match("I think it is Paris.", ["paris", "lyon"]) == 1.0
    assert substring_exact_match("Lyon", ["paris"]) == 0.0
    for f in (exact_match, substring_exact_match, ruler_recall, token_f1):
        assert f("", ["x"]) == 0.0 and f(None, ["x"]) == 0.0


def test_ruler_recall_counts_fraction_of_golds():
    assert ruler_recall("values: 123 and 456", ["123", "456", "789", "000"]) == 0.5
    assert ruler_recall("ABC", ["abc"]) == 1.0


def test_token_f1_partial():
    assert token_f1("red apple", ["red apple pie"]) == pytest.approx(0.8)


def test_rouge_l_uses_library_and_is_bounded():
    assert rouge_l("the cat sat on the mat", ["the cat sat on the mat"]) == pytest.approx(1.0)
    assert rouge_l("zebra", ["the cat sat on the mat"]) == 0.0
    assert 0 < rouge_l("cat on mat", ["the cat sat on the mat"]) < 1
    assert rouge_l("  ", ["x"]) == 0.0


def test_parse_ranking_longest_chain_and_dedup():
    assert parse_ranking("Ranking: 12 > 7 > 12 > 3") == [12, 7, 3]
    assert parse_ranking("first 1 > 2, then [5] > [6] > [7]") == [5, 6, 7]
    assert parse_ranking("no ids here") == []


def test_ndcg_known_values():
    qrels = {1: 2, 2: 1}
    assert ndcg_at_k([1, 2, 3], qrels) == pytest.approx(1.0)
    assert ndcg_at_k([3, 4, 5], qrels) == 0.0
    # swapped order: dcg = 1/log2(2) + 3/log2(3), idcg = 3 + 1/log2(3)
    assert ndcg_at_k([2, 1], qrels) == pytest.approx((1 + 3 / math.log2(3)) / (3 + 1 / math.log2(3)))
    assert ndcg_at_k([1], {}) == 0.0


def test_citation_precision_recall_rules():
    docs = {1: "Ann Lee", 2: "Bob Ray"}
    perfect = citation_scores("Ann Lee was born there [1]. Bob Ray too [2].", ["Ann Lee", "Bob Ray"], docs)
    assert perfect == {"answer_recall": 1.0, "citation_recall": 1.0, "citation_precision": 1.0}
    wrong = citation_scores("Ann Lee was born there [2].", ["Ann Lee", "Bob Ray"], docs)
    assert wrong == {"answer_recall": 0.5, "citation_recall": 0.0, "citation_precision": 0.0}
    half = citation_scores("Ann Lee and Bob Ray [1][2][3].", ["Ann Lee", "Bob Ray"], docs)
    assert half["citation_recall"] == 1.0 and half["citation_precision"] == pytest.approx(2 / 3)
    assert citation_scores("", ["Ann Lee"], docs)["citation_recall"] == 0.0
