import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from analysis import aggregate, curves, stats


def _scores(rows):
    return pd.DataFrame(rows, columns=["task", "algo", "model", "run_id", "score"])


# --------------------------------------------------------------------------- bootstrap_ci


@pytest.mark.parametrize("dist", ["normal", "exponential", "bimodal"])
def test_ci_brackets_point_estimate(dist):
    rng = np.random.default_rng(1)
    x = {
        "normal": rng.normal(5, 2, 5),
        "exponential": rng.exponential(3, 7),
        "bimodal": np.r_[rng.normal(0, 1, 3), rng.normal(10, 1, 3)],
    }[dist]
    mean, lo, hi, method = stats.bootstrap_ci(x, n_resamples=2000, seed=0)
    assert mean == pytest.approx(np.mean(x))
    assert lo < mean < hi
    assert method == "BCa"


def test_ci_shrinks_with_more_seeds():
    rng = np.random.default_rng(2)
    population = rng.normal(100, 30, 400)
    widths = []
    for n in (5, 20, 80):
        _, lo, hi, _ = stats.bootstrap_ci(population[:n], n_resamples=2000, seed=0)
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2]


def test_ci_matches_scipy_and_normal_theory():
    rng = np.random.default_rng(3)
    x = rng.normal(0.0, 1.0, 400)
    mean, lo, hi, _ = stats.bootstrap_ci(x, confidence=0.95, n_resamples=3000, seed=7)
    # The runs are resampled in value order (stats.value_order); no two resampled means of 400 normal draws
    # tie, so the interval is scipy's BCa bit for bit.
    ref = sps.bootstrap((np.sort(x),), np.mean, confidence_level=0.95, n_resamples=3000, rng=np.random.default_rng(7))
    assert (lo, hi) == (ref.confidence_interval.low, ref.confidence_interval.high)
    # A normal sample's 95% CI of the mean is about mean +- 1.96 s / sqrt(n).
    half = 1.96 * x.std(ddof=1) / math.sqrt(len(x))
    assert lo == pytest.approx(mean - half, abs=0.02)
    assert hi == pytest.approx(mean + half, abs=0.02)


def test_ci_fixed_seed_reproducible_and_seed_matters():
    x = np.array([1.0, 4.0, 2.5, 8.0, 3.0])
    a = stats.bootstrap_ci(x, n_resamples=500, seed=11)
    b = stats.bootstrap_ci(x, n_resamples=500, seed=11)
    c = stats.bootstrap_ci(x, n_resamples=500, seed=12)
    assert a == b
    assert a[1:3] != c[1:3]


def test_ci_edge_cases_and_bad_options():
    assert stats.bootstrap_ci([3.0, 3.0, 3.0])[:3] == (3.0, 3.0, 3.0)
    mean, lo, hi, method = stats.bootstrap_ci([2.0])
    assert mean == 2.0 and math.isnan(lo) and math.isnan(hi) and "1 run" in method
    with pytest.raises(ValueError, match="confidence"):
        stats.bootstrap_ci([1.0, 2.0], confidence=95)
    with pytest.raises(ValueError, match="n_resamples"):
        stats.bootstrap_ci([1.0, 2.0], n_resamples=0)


def test_summarize_groups_and_counts():
    rows = [("T-P-v0", "sac", "ffm", f"r{i}", v) for i, v in enumerate([10.0, 12.0, 14.0])]
    rows += [("T-P-v0", "sac", "gru", f"g{i}", v) for i, v in enumerate([1.0, 2.0])]
    out = stats.summarize(_scores(rows), n_resamples=500, seed=0)
    ffm = out[out.model == "ffm"].iloc[0]
    assert ffm["n_runs"] == 3 and ffm["mean"] == pytest.approx(12.0) and ffm["model_label"] == "FFM"
    assert ffm["ci_low"] <= 12.0 <= ffm["ci_high"]
    assert out[out.model == "gru"].iloc[0]["std"] == pytest.approx(np.std([1, 2], ddof=1))


# --------------------------------------------------------------------------- per-run scores


def _run_table(returns, steps=None, run_id="r0", task="HopperBLT-P-v0"):
    steps = np.arange(len(returns)) * 4000 + 12000 if steps is None else np.asarray(steps)
    return pd.DataFrame(
        {
            "run_id": run_id,
            "source": "ours",
            "task": task,
            "algo": "sac",
            "model": "ffm",
            "model_label": "FFM",
            "seed": 0,
            "trial": "seed-0",
            "finished": True,
            "status": "done",
            "env_steps": steps.astype(float),
            "eval_return": np.asarray(returns, float),
        }
    )


def test_runmax_is_best_eval_and_respects_max_steps():
    t = _run_table([5.0, 50.0, 20.0, 70.0, 10.0])
    assert stats.run_scores(t)["score"].iloc[0] == 70.0
    # The 70 happens at 24000 steps; cutting at 20000 leaves 50 as the best.
    assert stats.run_scores(t, max_steps=20000)["score"].iloc[0] == 50.0


def test_last20_matches_hand_computation():
    t = _run_table(np.arange(10.0))
    # window 1: no smoothing; grid == eval steps; last 20% of 10 points = points 8 and 9.
    s = stats.run_scores(t, metric="last20", window=1)["score"].iloc[0]
    assert s == pytest.approx(8.5)
    # window 2: smoothed values at the last two points are 7.5 and 8.5.
    s = stats.run_scores(t, metric="last20", window=2)["score"].iloc[0]
    assert s == pytest.approx(8.0)


def test_reference_curve_interpolates_and_holds_end_values():
    grid, y = stats.reference_curve(np.array([10000.0, 20000.0]), np.array([0.0, 100.0]), 12000, 4000, 1)
    assert list(grid) == [12000.0, 16000.0, 20000.0]
    assert y == pytest.approx([20.0, 60.0, 100.0])


def test_unknown_metric_is_named():
    with pytest.raises(ValueError, match="'best'"):
        stats.run_scores(_run_table([1.0]), metric="best")


# --------------------------------------------------------------------------- normalisation and aggregates


def test_normalize_oracle_random_and_excluded_tasks():
    sc = _scores(
        [
            ("HopperBLT-P-v0", "sac", "ffm", "a", 2434.0),
            ("HopperBLT-P-v0", "sac", "ffm", "b", 19.9634),
            ("HopperMJ-V-v0", "sac", "ffm", "c", 100.0),
        ]
    )
    out, notes = stats.normalize(sc)
    assert out["norm_score"].iloc[:2].tolist() == pytest.approx([1.0, 0.0])
    assert math.isnan(out["norm_score"].iloc[2])
    assert any("HopperMJ-V-v0" in n for n in notes)


def test_iqm_is_trimmed_middle_half():
    assert aggregate.iqm(np.arange(1.0, 9.0)) == pytest.approx(4.5)
    assert aggregate.iqm(np.array([0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 100.0])) == pytest.approx(1.0)


def test_stratified_resample_stays_within_tasks():
    per_task = [np.array([1.0, 2.0, 3.0]), np.array([100.0, 200.0])]
    a, b = aggregate.stratified_resample(per_task, 50, np.random.default_rng(0))
    assert a.shape == (50, 3) and b.shape == (50, 2)
    assert set(np.unique(a)) <= {1.0, 2.0, 3.0} and set(np.unique(b)) <= {100.0, 200.0}


def _norm_frame(values_by_group):
    rows = []
    for (algo, model), per_task in values_by_group.items():
        for task, vals in per_task.items():
            for i, v in enumerate(vals):
                rows.append(
                    {
                        "task": task,
                        "algo": algo,
                        "model": model,
                        "run_id": f"{model}{task}{i}",
                        "score": v,
                        "norm_score": v,
                    }
                )
    return pd.DataFrame(rows)


def test_aggregate_known_values_and_reproducible():
    norm = _norm_frame(
        {
            ("sac", "ffm"): {"A-P-v0": [0.8, 0.9, 1.0], "B-P-v0": [0.1, 0.2, 0.3]},
            ("sac", "gru"): {"A-P-v0": [0.5, 0.5, 0.5], "B-P-v0": [0.5, 0.5, 0.5]},
        }
    )
    agg, notes = aggregate.aggregate_scores(norm, n_resamples=500, seed=3)
    ffm = agg[(agg.model == "ffm")].set_index("metric")
    assert ffm.loc["Mean", "value"] == pytest.approx(0.55)
    assert ffm.loc["IQM", "value"] == pytest.approx(aggregate.iqm(np.array([0.8, 0.9, 1.0, 0.1, 0.2, 0.3])))
    for metric in ("Mean", "IQM"):
        assert ffm.loc[metric, "ci_low"] <= ffm.loc[metric, "value"] <= ffm.loc[metric, "ci_high"]
    gru = agg[(agg.model == "gru")].set_index("metric")
    assert gru.loc["Mean", "ci_low"] == gru.loc["Mean", "ci_high"] == pytest.approx(0.5)
    again, _ = aggregate.aggregate_scores(norm, n_resamples=500, seed=3)
    pd.testing.assert_frame_equal(agg, again)
    assert notes == []
    # Optimality gap, as rliable's: 1 - the mean of scores capped at 1 (here no score exceeds 1).
    assert ffm.loc["Optimality gap", "value"] == pytest.approx(0.45)
    assert gru.loc["Optimality gap", ["value", "ci_low", "ci_high"]].tolist() == pytest.approx([0.5] * 3)


def test_optimality_gap_caps_scores_at_the_oracle_and_weights_tasks_equally():
    norm = _norm_frame({("sac", "ffm"): {"A-P-v0": [0.8, 1.6, 1.0], "B-P-v0": [0.1, 0.3]}})
    agg, _ = aggregate.aggregate_scores(norm, n_resamples=200, seed=0)
    gap = agg.set_index("metric").loc["Optimality gap"]
    # Task A capped: 0.8, 1, 1 -> 14/15; task B: 0.2; gap = 1 - (14/15 + 0.2) / 2.
    assert gap["value"] == pytest.approx(1 - (14 / 15 + 0.2) / 2)
    assert gap["ci_low"] <= gap["value"] <= gap["ci_high"]
    # With as many runs per task, it is rliable's 1 - mean(min(scores, 1)) over all runs.
    even = _norm_frame({("sac", "ffm"): {"A-P-v0": [0.5, 1.5], "B-P-v0": [0.2, 0.4]}})
    assert aggregate.aggregate_scores(even, n_resamples=10)[0].set_index("metric").loc[
        "Optimality gap", "value"
    ] == pytest.approx(1 - np.mean(np.minimum([0.5, 1.5, 0.2, 0.4], 1)))


def test_profile_thresholds_come_from_the_aggregated_groups_only():
    norm = _norm_frame(
        {
            ("sac", "ffm"): {"A-P-v0": [0.2, 1.2], "B-P-v0": [0.5]},
            ("sac", "gru"): {"A-P-v0": [0.1, 0.3], "B-P-v0": [0.4]},
            # Another agent far above the Oracle on a task the model groups do not share.
            ("sac", "gru+oracle@ref"): {"C-P-v0": [3.0]},
        }
    )
    agg, _ = aggregate.aggregate_scores(norm, n_resamples=50)
    assert set(agg["model"]) == {"ffm", "gru"}
    prof = aggregate.profile_of_aggregate(norm, agg, n_taus=7, n_resamples=50)
    assert prof["tau"].max() == pytest.approx(1.2) and set(prof["model"]) == {"ffm", "gru"}
    # At tau 0.6: FFM 1/2 on A, 0/1 on B; GRU none (tasks weighted equally).
    at = prof[np.isclose(prof["tau"], 0.6)].set_index("model")["fraction"]
    assert at.to_dict() == pytest.approx({"ffm": 0.25, "gru": 0.0})


def test_aggregate_restricts_to_common_tasks_with_note():
    norm = _norm_frame(
        {("sac", "ffm"): {"A-P-v0": [0.5, 0.6], "B-P-v0": [0.1, 0.2]}, ("sac", "gru"): {"A-P-v0": [0.4, 0.3]}}
    )
    agg, notes = aggregate.aggregate_scores(norm, n_resamples=100, seed=0)
    assert set(agg["n_tasks"]) == {1}
    assert any("B-P-v0" in n for n in notes)


def test_probability_of_improvement_known_answers():
    rows = [
        ("A-P-v0", "sac", "ffm", "f1", 10.0),
        ("A-P-v0", "sac", "ffm", "f2", 11.0),
        ("A-P-v0", "sac", "gru", "g1", 1.0),
        ("A-P-v0", "sac", "gru", "g2", 2.0),
        # Task B: ffm {1, 3} vs gru {2}: one win, one loss -> 0.5.
        ("B-P-v0", "sac", "ffm", "f3", 1.0),
        ("B-P-v0", "sac", "ffm", "f4", 3.0),
        ("B-P-v0", "sac", "gru", "g3", 2.0),
    ]
    out = aggregate.probability_of_improvement(_scores(rows), n_resamples=500, seed=0)
    r = out.iloc[0]
    assert r["value"] == pytest.approx((1.0 + 0.5) / 2)
    assert r["ci_low"] <= r["value"] <= r["ci_high"]
    ties = _scores([("A-P-v0", "td3", "ffm", "f", 5.0), ("A-P-v0", "td3", "gru", "g", 5.0)])
    assert aggregate.probability_of_improvement(ties, n_resamples=50)["value"].iloc[0] == 0.5


def test_performance_profile_fractions():
    norm = _norm_frame({("sac", "ffm"): {"A-P-v0": [0.1, 0.6, 0.9, 0.95], "B-P-v0": [0.2, 0.3]}})
    prof = aggregate.performance_profile(norm, np.array([0.0, 0.5, 1.0]), n_resamples=200, seed=0)
    # Task A: 4/4, 3/4, 0/4 above tau; task B: 2/2, 0/2, 0/2; tasks weighted equally.
    assert prof["fraction"].tolist() == pytest.approx([1.0, 0.375, 0.0])
    assert (prof["ci_low"] <= prof["fraction"]).all() and (prof["fraction"] <= prof["ci_high"]).all()


# --------------------------------------------------------------------------- curves


def test_curves_runmax_step_function_and_band():
    t = pd.concat(
        [
            _run_table([1.0, 5.0, 3.0], run_id="a").assign(trial="seed-0"),
            _run_table([2.0, 2.0, 8.0], run_id="b").assign(trial="seed-1"),
        ]
    )
    on_grid = curves.curves_on_grid(t, grid_start=12000, grid_interval=2000)
    a = on_grid[on_grid.run_id == "a"]
    assert a["env_steps"].tolist() == [12000, 14000, 16000, 18000, 20000]
    assert a["value"].tolist() == [1.0, 1.0, 5.0, 5.0, 5.0]
    band = curves.curve_band(on_grid, n_resamples=200, seed=0)
    assert band["mean"].tolist() == pytest.approx([1.5, 1.5, 3.5, 3.5, 6.5])
    assert (band["ci_low"] <= band["mean"] + 1e-12).all() and (band["mean"] <= band["ci_high"] + 1e-12).all()


def test_curve_style_is_validated():
    with pytest.raises(ValueError, match="'ema'"):
        curves.curves_on_grid(_run_table([1.0]), style="ema")


def test_pendulum_curves_use_the_reference_pendulum_grid():
    # eval.sh: Pendulum is merged on a 2000 / 1000 grid with a window of 3, the locomotion tasks on 12000 / 4000.
    table = pd.DataFrame(
        {
            "run_id": "r",
            "task": "Pendulum-V-v0",
            "algo": "sac",
            "model": "ffm",
            "trial": "0",
            "env_steps": [2000.0, 3000.0, 4000.0],
            "eval_return": [-1500.0, -1000.0, -1200.0],
        }
    )
    got = curves.curves_on_grid(table, "runmax")
    assert got["env_steps"].tolist() == [2000.0, 3000.0, 4000.0]
    assert got["value"].tolist() == [-1500.0, -1000.0, -1000.0]
