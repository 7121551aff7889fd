"""Routing models (mksim/workload/routing.py): the expected number of distinct experts against its
closed form and against the draw, the draw's marginals and determinism, and bad routings refused in
one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from mksim.errors import WorkloadError
from mksim.workload import Step
from mksim.workload.routing import (
    ROUTINGS,
    capped,
    distinct_expected,
    distinct_std_uniform,
    draw,
    parse_routing,
    route,
)

N, K = 128, 8  # Qwen3-30B-A3B: top-8 of 128 experts
UNIFORM = parse_routing("uniform")


def _distinct(pi: np.ndarray, tokens: int, reps: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.array([len(np.unique(draw(pi, tokens, K, rng))) for _ in range(reps)])


@pytest.mark.parametrize("tokens,expected", [(1, 8.0), (8, 51.62), (32, 111.77)])
def test_uniform_expected_distinct_experts(tokens, expected):
    """N (1 - (1 - k/N)^T): k at batch 1, ~51.6 at batch 8, ~112 at batch 32 (the issue's figures)."""
    r = route(UNIFORM, layer=0, tokens=tokens, n_experts=N, top_k=K)
    assert r.expected == pytest.approx(N * (1 - (1 - K / N) ** tokens))
    assert r.expected == pytest.approx(expected, abs=0.01)
    assert sum(r.rows) == tokens * K and len(r.experts) == r.active


def test_batch_one_reads_exactly_k_experts():
    r = route(UNIFORM, layer=3, tokens=1, n_experts=N, top_k=K)
    assert (r.active, r.expected, r.std, r.rows) == (K, K, 0.0, (1,) * K)


def test_uniform_spread_is_the_draws():
    """The closed-form standard deviation against 3000 drawn steps of 8 tokens."""
    d = _distinct(UNIFORM.probs(0, N, K), 8, 3000)
    assert d.mean() == pytest.approx(distinct_expected(UNIFORM.probs(0, N, K), 8), rel=0.005)
    assert d.std() == pytest.approx(distinct_std_uniform(N, K, 8), rel=0.05)


def test_each_token_picks_k_distinct_experts_with_the_models_marginals():
    pi = parse_routing("zipf:1.2").probs(0, N, K)
    picks = draw(pi, 20000, K, np.random.default_rng(7))
    assert all(len(set(row)) == K for row in picks[:2000].tolist())
    share = np.bincount(picks.ravel(), minlength=N) / 20000
    assert np.abs(share - pi).max() < 0.01  # systematic sampling keeps pi: 3 sigma at 20000 tokens


def test_zipf_expected_and_spread_against_the_draw():
    z = parse_routing("zipf:1.2")
    r = route(z, layer=0, tokens=8, n_experts=N, top_k=K)
    d = _distinct(z.probs(0, N, K), 8, 2000)
    assert r.expected == pytest.approx(d.mean(), rel=0.01)
    assert r.std == pytest.approx(d.std(), rel=0.1)  # a Monte Carlo estimate against another
    assert r.expected < route(UNIFORM, layer=0, tokens=8, n_experts=N, top_k=K).expected - 15  # skew: fewer


def test_zipf_probabilities_sum_to_k_and_none_above_one():
    pi = parse_routing("zipf:3").probs(5, N, K)
    assert pi.sum() == pytest.approx(K) and pi.max() == pytest.approx(1.0) and pi.min() > 0
    assert not np.array_equal(pi, parse_routing("zipf:3").probs(6, N, K))  # hot experts differ by layer
    assert capped(np.array([3.0, 0.5, 0.5]), 2).tolist() == [1.0, 0.5, 0.5]


def test_the_draw_is_seeded():
    a = route(UNIFORM, layer=4, tokens=8, n_experts=N, top_k=K, seed=0)
    assert a == route(UNIFORM, layer=4, tokens=8, n_experts=N, top_k=K, seed=0)
    assert a.experts != route(UNIFORM, layer=4, tokens=8, n_experts=N, top_k=K, seed=1).experts
    assert a.experts != route(UNIFORM, layer=5, tokens=8, n_experts=N, top_k=K, seed=0).experts


def test_a_counts_file_gives_each_layer_its_measured_shares(tmp_path: Path):
    counts = [[40, 30, 20, 10], [1, 1, 1, 97]]
    path = tmp_path / "counts.json"
    path.write_text(json.dumps({"counts": counts, "model": "mine"}))
    f = parse_routing(str(path))
    f.check("mine", moe_layers=2, n_experts=4, top_k=1)
    assert f.probs(0, 4, 1).tolist() == [0.4, 0.3, 0.2, 0.1]
    assert f.probs(1, 4, 2).tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1.0])  # 1.94 capped: 0.94 to the rest
    assert parse_routing(f"file:{path}").probs(0, 4, 1).tolist() == [0.4, 0.3, 0.2, 0.1]
    r = route(f, layer=9, moe_layer=1, tokens=1000, n_experts=4, top_k=1)
    assert r.rows[-1] > 900 and r.expected == pytest.approx(4 - 0.99 ** 1000 * 3 - 0.03 ** 1000)


@pytest.mark.parametrize("text,msg", [
    ("zipf:abc", "the skew S of zipf:S must be a number > 0 (1.2 is typical), got 'abc'"),
    ("zipf:-1", "the skew S of zipf:S must be a number > 0"),
    ("zipf:0", "must be a number > 0"),
    ("zipf:nan", "must be a number > 0"),
    ("uniform:2", "uniform takes no argument"),
    ("gauss", "unknown routing 'gauss'; give uniform, zipf:S (S > 0) or a .json file of expert counts"),
    ("", "routing must be 'uniform', 'zipf:S' or a .json file"),
    ("/no/such/counts.json", "no such file; give a JSON file of expert counts"),
])
def test_bad_routings_are_refused_in_one_line(text, msg):
    with pytest.raises(WorkloadError, match=msg.replace("(", r"\(").replace(")", r"\)")) as exc:
        Step("qwen3-30b-a3b", routing=text)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("content,msg", [
    (b"\x00\x01\x02binary", "not valid JSON"),
    (b"counts: [1, 2]", "not valid JSON"),
    (b"[[1, 2]]", 'expected a JSON object with "counts"'),
    (b'{"counts": [[1, 2]], "experts": 2}', "unknown key 'experts'; known: counts, model, source"),
    (b'{"counts": [[1, -2]]}', "MoE layer 0 has the count -2; counts are whole numbers >= 0"),
    (b'{"counts": [[1, true]]}', "MoE layer 0 has the count True"),
    (b'{"counts": [[0, 0]]}', "MoE layer 0 has no tokens"),
    (b'{"counts": []}', '"counts" must be a non-empty list of lists'),
])
def test_bad_counts_files_are_refused_in_one_line(tmp_path: Path, content, msg):
    path = tmp_path / "c.json"
    path.write_bytes(content)
    with pytest.raises(WorkloadError, match=msg.replace("(", r"\(")) as exc:
        parse_routing(str(path))
    assert "\n" not in str(exc.value)


def test_a_huge_counts_file_is_refused_unread(tmp_path: Path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as fh:
        fh.truncate(64 << 20)  # sparse: 64 MiB of zeros
    with pytest.raises(WorkloadError, match="larger than 16 MiB; this is not a file mksim reads"):
        parse_routing(str(path))


def test_routing_models_are_registered():
    assert tuple(ROUTINGS) == ("uniform", "zipf", "file")
    assert math.isclose(parse_routing("zipf:1.5").skew, 1.5)  # type: ignore[attr-defined]
