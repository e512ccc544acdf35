import numpy as np
import pytest

from twice_envs.agents.credit import predictor
from twice_envs.agents.types import EpisodeRecord, TurnRecord
from twice_envs.keys import NoiseKey


def test_auc_matches_pairwise_definition():
    rng = np.random.default_rng(0)
    s = np.round(rng.uniform(0, 1, 60), 1)  # ties on purpose
    y = rng.random(60) < 0.4
    pos, neg = s[y], s[~y]
    brute = np.mean([(a > b) + 0.5 * (a == b) for a in pos for b in neg])
    assert predictor.auc(s, y) == pytest.approx(brute)
    assert np.isnan(predictor.auc([0.1, 0.2], [1, 1]))


def test_weighted_sgd_learns_discordance_from_features():
    rng = np.random.default_rng(1)
    state = predictor.PredictorState()
    true_w = np.array([2.0, -1.0, 0.0, 0.0, 1.5, 1.0, 0.0, -1.0, 0.5])
    for _ in range(30):
        X = rng.uniform(0, 1, (200, predictor.NUM_FEATURES))
        y = rng.random(200) < 1 / (1 + np.exp(-(X @ true_w - 1.0)))
        q = rng.uniform(0.05, 1.0, 200)  # twins realised with probability q get weight 1/q
        state = predictor.sgd_update(state, X, y, 1 / q, rng)
    X = rng.uniform(0, 1, (2000, predictor.NUM_FEATURES))
    y = rng.random(2000) < 1 / (1 + np.exp(-(X @ true_w - 1.0)))
    assert state.updates == 30
    assert predictor.auc(predictor.predict(state, X), y) > 0.7
    assert predictor.PredictorState.from_json(state.to_json()).weights.tolist() == state.weights.tolist()


def test_features_have_the_nine_documented_columns():
    key = NoiseKey(1, 0)
    turns = [TurnRecord([1] * 5, [0.0] * 5, "<search> q </search>", key, entropy=0.7),
             TurnRecord([1] * 3, [0.0] * 3, "<answer> a </answer>", key, entropy=0.2)]
    eps = [EpisodeRecord("E", 0, {}, group=0, turns=turns, utility=1.0),
           EpisodeRecord("E", 0, {}, group=0, turns=turns[:1], utility=0.0)]
    X = predictor.decision_features(eps)
    assert X.shape == (3, 9)
    np.testing.assert_allclose(X[0], [0.5, 0.25, 1.0, 0.5, 0.7, 1.0, 0.0, 0.2, np.log1p(8) / 6])
    np.testing.assert_allclose(X[1], [0.5, 0.25, 1.0, 0.5, 0.2, 0.0, 0.2, 0.0, np.log1p(3) / 6])
    assert X[2][2] == 0.0 and X[2][7] == 0.0


def test_cost_calibration_tracks_realised_over_expected_tokens():
    s = predictor.PredictorState()
    assert s.cost_scale == 1.0
    s = predictor.calibrate_cost(s, 50.0, 100.0)
    assert s.cost_scale == pytest.approx(0.5)
    s = predictor.calibrate_cost(s, 100.0, 100.0)
    assert s.cost_scale == pytest.approx((0.7 * 50 + 100) / (0.7 * 100 + 100))
    back = predictor.PredictorState.from_json(s.to_json())
    assert back.cost_scale == pytest.approx(s.cost_scale)


def _group(n, success_prob, rng, group):
    key = NoiseKey(1, 0)
    return [EpisodeRecord("E", 0, {}, group=group, utility=float(rng.random() < success_prob),
                          turns=[TurnRecord([1] * 4, [0.0] * 4, "<search> q </search>", key, entropy=0.5),
                                 TurnRecord([1] * 2, [0.0] * 2, "<answer> a </answer>", key, entropy=0.5)])
            for _ in range(n)]


def test_success_features_see_the_prefix_not_the_outcome():
    rng = np.random.default_rng(0)
    eps = _group(3, 0.5, rng, 0)
    for ep, u in zip(eps, (1.0, 0.0, 1.0)):
        ep.utility = u
    X = predictor.success_features(eps)
    assert X.shape == (6, predictor.NUM_SUCCESS_FEATURES)
    # p_others: the other two episodes' success
    assert X[:, 0].tolist() == pytest.approx([0.5, 0.5, 1.0, 1.0, 0.5, 0.5])
    np.testing.assert_allclose(X[0], [0.5, 0.25, 0.5, 1.0, 0.0, np.log1p(4) / 6])
    np.testing.assert_allclose(X[1], [0.5, 0.25, 0.5, 0.0, 0.2, np.log1p(6) / 6])
    assert predictor.success_features(eps[:1])[0, 0] == 0.5  # alone in its group


def test_success_model_learns_which_prefixes_succeed():
    rng = np.random.default_rng(1)
    state = predictor.PredictorState()
    for _ in range(15):
        eps = []
        for g in range(40):
            eps += _group(5, 0.9 if g % 2 else 0.1, rng, g)
        state = predictor.fit_success(state, eps, rng)
    test = []
    for g in range(200):
        test += _group(5, 0.9 if g % 2 else 0.1, rng, g)
    p_hat = predictor.predict_success(state, predictor.success_features(test))
    y = [test[i].utility for i, _ in predictor.decision_index(test)]
    assert predictor.auc(p_hat, y) > 0.75
    assert state.weights.tolist() == [0.0] * predictor.NUM_FEATURES  # the discordance model is untouched
    back = predictor.PredictorState.from_json(state.to_json())
    assert back.success_weights.tolist() == state.success_weights.tolist()


def test_a_self_twin_is_as_likely_as_the_factual_turn_itself():
    turns = [TurnRecord([1, 2], [np.log(0.5), np.log(0.4)], "ab", NoiseKey(1, 0)),
             TurnRecord([3], [], "c", NoiseKey(1, 1)),  # no log-probs: unknown, planned at full cost
             TurnRecord([], [], "", NoiseKey(1, 2))]
    ep = EpisodeRecord("E", 0, {}, turns=turns)
    np.testing.assert_allclose(predictor.self_twin_probability([ep]), [0.2, 0.0, 0.0])


def test_the_twin_cost_ratio_starts_at_one_and_survives_a_checkpoint():
    state = predictor.PredictorState()
    assert state.twin_cost_ratio == 1.0
    state = predictor.track_twin_cost(state, 30.0, 20.0)
    state = predictor.track_twin_cost(state, 10.0, 10.0)
    assert state.twin_cost_ratio == pytest.approx((0.7 * 30 + 10) / (0.7 * 20 + 10))
    assert predictor.PredictorState.from_json(state.to_json()).twin_cost_ratio == state.twin_cost_ratio
