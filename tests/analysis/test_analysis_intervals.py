"""What an interval, and any other statistic, may and may not depend on: one task set per algorithm's report (each
group's own in the aggregate figure), not the runs' folder names, not the last bits of the scores; and a single run
is never drawn as a zero-width interval."""

import warnings

import numpy as np
import pandas as pd
import pytest
from analysis_synth import steps_grid, write_our_run, write_reference_run
from matplotlib.container import ErrorbarContainer
from scipy import stats as sps

from analysis import aggregate, bench, curves, figstyle, figures, load, published, stats

# --------------------------------------------------------------------------- one task set per algorithm


def _frame(groups):
    """{(algo, model): {task: [scores]}} -> a row per run, the score doubling as its normalised score."""
    return pd.DataFrame(
        [
            {
                "task": task,
                "algo": algo,
                "model": model,
                "run_id": f"{algo}/{model}/{task}/{i}",
                "score": v,
                "norm_score": v,
            }
            for (algo, model), per_task in groups.items()
            for task, vals in per_task.items()
            for i, v in enumerate(vals)
        ]
    )


SAC_FFM = {"A-P-v0": [0.6, 0.7], "B-P-v0": [0.1, 0.2], "C-P-v0": [0.95, 1.0]}
SAC_GRU = {"A-P-v0": [0.1, 0.2], "B-P-v0": [0.3, 0.4], "C-P-v0": [0.5, 0.9]}
# TD3's GRU lacks task C: that narrows TD3's report, never SAC's.
TASK_SETS = _frame(
    {
        ("sac", "ffm"): SAC_FFM,
        ("sac", "gru"): SAC_GRU,
        ("td3", "ffm"): SAC_FFM,
        ("td3", "gru"): {k: SAC_GRU[k] for k in ("A-P-v0", "B-P-v0")},
    }
)


def test_the_common_task_set_is_per_algorithm():
    assert aggregate.common_task_sets(TASK_SETS) == {"sac": {"A-P-v0", "B-P-v0", "C-P-v0"}, "td3": {"A-P-v0", "B-P-v0"}}
    agg, notes = aggregate.aggregate_scores(TASK_SETS, n_resamples=200, seed=0)
    sac = agg[agg.algo == "sac"].set_index(["model", "metric"])
    assert set(sac["n_tasks"]) == {3} and set(sac["tasks"]) == {"A-P-v0 B-P-v0 C-P-v0"}
    # SAC GRU over its 3 tasks: IQM of {.1, .2, .3, .4, .5, .9} = mean(.2, .3, .4, .5); over A and B it was .25.
    assert sac.loc[("gru", "IQM"), "value"] == pytest.approx(0.35)
    assert sac.loc[("gru", "Mean"), "value"] == pytest.approx((0.15 + 0.35 + 0.7) / 3)
    assert sac.loc[("ffm", "Optimality gap"), "value"] == pytest.approx(1 - (0.65 + 0.15 + 0.975) / 3)
    td3 = agg[agg.algo == "td3"]
    assert set(td3["n_tasks"]) == {2} and set(td3["tasks"]) == {"A-P-v0 B-P-v0"}
    assert td3.set_index(["model", "metric"]).loc[("gru", "IQM"), "value"] == pytest.approx(0.25)
    assert notes == ["td3/ffm: tasks ['C-P-v0'] not shared by all compared td3 groups; left out"]
    problems = aggregate.aggregate_problems(TASK_SETS, agg, "runmax")
    assert [p[0] for p in problems] == ["td3_ffm"] and "not every compared td3 group" in problems[0][2]


def test_the_probability_of_improvement_and_profile_use_the_aggregates_task_set():
    poi = aggregate.compare_models(TASK_SETS, ("gru",), n_resamples=200, seed=0).set_index("algo")
    # Per task P(FFM > GRU): A 1, B 0, C 1 for SAC; TD3 has A and B only.
    assert poi.loc["sac", ["value", "n_tasks", "tasks"]].tolist() == [pytest.approx(2 / 3), 3, "A-P-v0 B-P-v0 C-P-v0"]
    assert poi.loc["td3", ["value", "n_tasks", "tasks"]].tolist() == [pytest.approx(0.5), 2, "A-P-v0 B-P-v0"]
    # A compared group without task C (an LSTM here) narrows SAC's comparison of FFM with GRU as its aggregate.
    lstm = pd.concat([TASK_SETS, _frame({("sac", "lstm"): {"A-P-v0": [0.3], "B-P-v0": [0.3]}})])
    narrowed = aggregate.compare_models(lstm, ("gru",), n_resamples=50, seed=0).set_index("algo")
    assert narrowed.loc["sac", "tasks"] == "A-P-v0 B-P-v0"
    assert set(aggregate.aggregate_scores(lstm, n_resamples=50)[0].query("algo == 'sac'")["n_tasks"]) == {2}
    agg, _ = aggregate.aggregate_scores(TASK_SETS, n_resamples=50, seed=0)
    prof = aggregate.profile_of_aggregate(TASK_SETS, agg, n_taus=6, n_resamples=50, seed=0)
    at = prof[np.isclose(prof["tau"], 0.6)].set_index(["algo", "model"])["fraction"]
    # SAC GRU above 0.6: A 0/2, B 0/2, C 1/2 over 3 tasks; TD3 GRU none on A and B.
    assert at[("sac", "gru")] == pytest.approx(1 / 6) and at[("td3", "gru")] == 0.0


def test_the_aggregate_figure_gives_each_group_its_own_task_count(drawn):
    agg, _ = aggregate.aggregate_scores(TASK_SETS, n_resamples=50, seed=0)
    figures.plot_aggregate(agg, "unused")
    fig = drawn[0]
    labels = ["GRU + SAC (3 tasks)", "FFM + SAC (3 tasks)", "GRU + TD3 (2 tasks)", "FFM + TD3 (2 tasks)"]
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == labels
    # Nothing else shown gives one count for all: TD3 read "Over 3 task(s)" when the title took the largest.
    fig.canvas.draw()
    shown = {t.get_text() for t in fig.findobj(figures.plt.Text) if t.get_visible() and "task" in t.get_text()}
    assert shown == set(labels)


def test_a_task_without_constants_stays_in_the_probability_of_improvement():
    # The raw scores compare where the normalised ones cannot: the aggregate leaves X out for every group.
    frame = _frame(
        {("sac", "ffm"): {"A-P-v0": [0.6], "X-V-v0": [5.0]}, ("sac", "gru"): {"A-P-v0": [0.1], "X-V-v0": [6.0]}}
    )
    frame.loc[frame.task == "X-V-v0", "norm_score"] = np.nan
    agg, notes = aggregate.aggregate_scores(frame, n_resamples=20)
    assert set(agg["tasks"]) == {"A-P-v0"} and not any("not shared" in n for n in notes)
    assert aggregate.compare_models(frame, ("gru",), n_resamples=20)["tasks"].tolist() == ["A-P-v0 X-V-v0"]


# --------------------------------------------------------------------------- folder names do not move an interval

CURVES = np.cumsum(np.random.default_rng(5).normal(40.0, 60.0, (2, 2, 5, 10)), axis=-1)  # task, model, run, eval
TASKS = [("HopperBLT", "P"), ("WalkerBLT", "V")]


def _tree(root, order, stamp):
    """The same runs, the data of run k under seed ``order[k]`` and folders stamped ``stamp``: ours, and the
    reference's seedless copies (whose only names are their folders)."""
    for t, (family, obs) in enumerate(TASKS):
        for m, model in enumerate(("ffm", "gru")):
            for k, seed in enumerate(order):
                write_our_run(
                    root, f"{family}-{obs}-v0", "sac", model, seed, steps_grid(10), CURVES[t, m, k], stamp=stamp
                )
        for k, seed in enumerate(order):
            write_reference_run(
                root,
                family,
                obs,
                "sac",
                "gru",
                None,
                steps_grid(10),
                CURVES[t, 1, k] + 7.0,
                f"{stamp}-{seed}",
                config=False,
            )
    table, _ = load.build_table([root])
    return load.separate_sources(table)


def _intervals(table):
    scores = stats.run_scores(table)
    norm, _ = stats.normalize(scores)
    agg, _ = aggregate.aggregate_scores(norm, n_resamples=500, seed=1)
    band = curves.curve_band(curves.curves_on_grid(table), n_resamples=300, seed=1)
    return scores, {
        "summary": stats.summarize(scores, n_resamples=1000, seed=1)[["model", "task", "mean", "ci_low", "ci_high"]],
        "aggregate": agg,
        "poi": aggregate.compare_models(scores, ("gru",), n_resamples=500, seed=1),
        "profile": aggregate.profile_of_aggregate(norm, agg, n_taus=11, n_resamples=300, seed=1),
        "band": band,
    }


def test_renamed_folders_of_identical_data_give_identical_intervals(tmp_path):
    scores_a, a = _intervals(_tree(tmp_path / "a", [0, 1, 2, 3, 4], "2026-01-01_00-00-00"))
    scores_b, b = _intervals(_tree(tmp_path / "b", [4, 2, 0, 3, 1], "2025-12-31_23-59-59"))
    # The runs come in another order (by their folders), so an order-dependent resample would differ...
    per_group = [s.groupby(["task", "model"])["score"].apply(list) for s in (scores_a, scores_b)]
    assert all(x != y and sorted(x) == sorted(y) for x, y in zip(*per_group))
    # ... but every interval is the same to the last bit.
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name], check_exact=True, obj=name)
    assert (a["summary"]["ci_low"] < a["summary"]["ci_high"]).all()


# Scores whose statistics depend on the order of their terms: a sum (0.1 + 1e16 - 1e16 is 0, 1e16 - 1e16 + 0.1
# is 0.1), and a standard deviation (its last bit, as 0.1 + 0.2 + 0.3 is not 0.3 + 0.2 + 0.1).
ORDER_SENSITIVE = {"ffm": [0.1, 1e16, -1e16, 0.3, 0.6], "gru": [0.1, 0.7, 0.2, 1000.0, 0.3]}
BATCHES = ["batch-a", "batch-b", "batch-c", "batch-d", "batch-e"]


def _statistics(root):
    table, _ = load.build_table([root])
    scores = stats.run_scores(table)
    norm, _ = stats.normalize(scores)
    agg, _ = aggregate.aggregate_scores(norm, n_resamples=200, seed=1)
    return scores, {
        "summary": stats.summarize(scores, n_resamples=200, seed=1),
        "aggregate": agg,
        "poi": aggregate.compare_models(scores, ("gru",), n_resamples=200, seed=1),
        "profile": aggregate.profile_of_aggregate(norm, agg, n_taus=11, n_resamples=100, seed=1),
        "band": curves.curve_band(curves.curves_on_grid(table), n_resamples=100, seed=1),
    }


def test_every_statistic_is_the_same_to_the_last_bit_after_renaming_run_folders(tmp_path):
    # Folder batch-k holds run k of every group, so renaming the batches reorders every group's runs.
    groups = [(t, a, m) for t in ("HopperBLT-P-v0", "WalkerBLT-V-v0") for a in ("sac", "td3") for m in ("ffm", "gru")]
    for g, (task, algo, model) in enumerate(groups):
        for k, batch in enumerate(BATCHES):
            value = ORDER_SENSITIVE[model][(k + g) % len(BATCHES)]
            write_our_run(tmp_path / batch, task, algo, model, k, steps_grid(4), np.full(4, value))
    scores_a, a = _statistics(tmp_path)
    for batch, new in zip(BATCHES, ["batch-e", "batch-c", "batch-a", "batch-d", "batch-b"]):
        (tmp_path / batch).rename(tmp_path / f"{new}.tmp")
    for batch in BATCHES:
        (tmp_path / f"{batch}.tmp").rename(tmp_path / batch)
    scores_b, b = _statistics(tmp_path)
    # The runs now come in another order, in which their float sums differ...
    order = [s.groupby(["task", "algo", "model"])["score"].apply(list) for s in (scores_a, scores_b)]
    assert all(x != y and sorted(x) == sorted(y) for x, y in zip(*order))
    for reduce in (np.mean, lambda v: np.std(v, ddof=1)):
        assert any(reduce(x) != reduce(y) for x, y in zip(*order))
    # ... yet every statistic is the same to the last bit.
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name], check_exact=True, obj=name)
    assert np.isfinite(a["summary"]["std"]).all()


# What the published grid loses of each run's best evaluation: their sum depends on its order (0.6 + 1e16 is
# 1e16, and so are 1e16 + 0.6 + 0.6 + 0.6; 0.6 + 0.6 + 0.6 + 1e16 is 1e16 + 2).
GRID_DROPS = [0.6, 1e16, 0.6, 0.6, 0.6]


def _grid_effect(names):
    """published.grid_effect on runs named ``names`` whose best evaluation falls between two grid points, where
    the grid holds half of it: run k loses GRID_DROPS[k]."""
    rows = [{"source": "published", "task": "HopperBLT-P-v0", "run_id": "pub", "env_steps": 12_000, "eval_return": 0}]
    for name, drop in zip(names, GRID_DROPS):
        for steps, ret in zip((14_000, 18_000, 22_000), (0.0, 2 * drop, 0.0)):
            rows.append(
                {"source": "ours", "task": "HopperBLT-P-v0", "run_id": name, "env_steps": steps, "eval_return": ret}
            )
    return published.grid_effect(pd.DataFrame(rows))


def test_the_published_grid_effect_and_benchmark_means_do_not_depend_on_names_or_file_order(tmp_path):
    assert np.mean(GRID_DROPS) != np.mean(GRID_DROPS[::-1])
    # Renamed runs come in the reverse order.
    assert _grid_effect(BATCHES) == _grid_effect(BATCHES[::-1]) == (5, np.mean(sorted(GRID_DROPS)), 1e16)
    files = []
    for k, values in enumerate((ORDER_SENSITIVE["ffm"][:2], ORDER_SENSITIVE["ffm"][2:])):
        files.append(tmp_path / f"bench-{k}.csv")
        rows = "".join(f"memory,T64,ffm,fwd_ms,{v!r},ms\n" for v in values)
        files[-1].write_text("benchmark,shape,model,metric,value,unit\n" + rows)
    means = [bench.summarize_bench(bench.read_bench(f)[0]) for f in (files, files[::-1])]
    pd.testing.assert_frame_equal(*means, check_exact=True)


def test_value_order_is_by_value():
    assert stats.value_order([3.0, 1.0, 2.0]).tolist() == [1.0, 2.0, 3.0]
    runs = np.array([[2.0, 1.0], [1.0, 5.0], [1.0, 4.0]])  # a row per run: by its first point, then the next
    assert stats.value_order(runs).tolist() == [[1.0, 4.0], [1.0, 5.0], [2.0, 1.0]]
    rng = np.random.default_rng(0)
    per_task = [np.array([5.0, 1.0, 3.0])]
    again = [np.array([3.0, 5.0, 1.0])]
    assert np.array_equal(
        aggregate.stratified_resample(per_task, 20, np.random.default_rng(0))[0],
        aggregate.stratified_resample(again, 20, rng)[0],
    )


# --------------------------------------------------------------------------- BCa and the last bits of the scores

# Five scores whose BCa interval scipy moved by up to 68 (of 400) when one of them changed by 1e-12 of itself.
FIVE = np.array([625.9169679910789, 642.4464770384317, 582.8542632787828, 216.0993004415777, 225.09986366413392])


def _bootstrap_distribution(x, seed=0):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sps.bootstrap(
            (np.sort(x),), np.mean, n_resamples=10_000, method="percentile", rng=np.random.default_rng(seed)
        ).bootstrap_distribution


def test_the_scores_exercise_rounding_level_ties():
    # The resamples that are permutations of the sample tie its mean exactly, but not all in floating point:
    # counting exact ties only, the bias term's proportion turns on the last bits. The tolerance counts each
    # permutation as a tie and nothing else.
    x = np.sort(FIVE)
    idx = np.random.default_rng(0).integers(0, 5, (10_000, 5))  # scipy's draw for this seed
    boot = _bootstrap_distribution(x)
    assert np.array_equal(boot, x[idx].mean(axis=-1))
    permutations = np.array([len(set(r)) == 5 for r in idx])
    within = np.abs(boot - x.mean()) <= stats.TIE_REL_TOL * x.max()
    assert np.array_equal(within, permutations)
    assert (boot == x.mean()).sum() < permutations.sum()

    def exact_proportion(v):
        b = _bootstrap_distribution(v)
        return np.mean(b < v.mean()) + 0.5 * np.mean(b == v.mean())

    y = x.copy()
    y[2] *= 1 + 1e-12
    assert abs(exact_proportion(x) - exact_proportion(y)) > 0.01


@pytest.mark.parametrize("k", range(5))
@pytest.mark.parametrize("sign", [1, -1])
def test_bca_does_not_turn_on_the_last_bits_of_a_score(k, sign):
    base = stats.bootstrap_ci(FIVE, seed=0)
    y = FIVE.copy()
    y[k] *= 1 + sign * 1e-12
    moved = stats.bootstrap_ci(y, seed=0)
    assert base[3] == moved[3] == "BCa"
    assert moved[1:3] == pytest.approx(base[1:3], rel=1e-9, abs=0)


def test_bca_is_scipys_where_the_arithmetic_is_exact():
    # Integers: every tie is exact, so counting within a tolerance changes nothing (the docs' example).
    x = np.array([0.0, 0.0, 0.0, 0.0, 100.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = sps.bootstrap((x,), np.mean, n_resamples=10_000, rng=np.random.default_rng(0)).confidence_interval
    assert stats.bootstrap_ci(x, seed=0) == (20.0, ref.low, ref.high, "BCa") == (20.0, 0.0, 80.0, "BCa")
    assert stats.bootstrap_ci(x, seed=0, method="percentile")[1:] == (0.0, 60.0, "percentile")


# --------------------------------------------------------------------------- a single run in the figures


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plot functions make, kept open instead of saved."""
    figs = []

    def keep(fig, base, formats=()):
        figs.append(fig)
        return []

    monkeypatch.setattr(figstyle, "save", keep)
    yield figs
    for fig in figs:
        figures.plt.close(fig)


def _error_bars(ax):
    """The ((x0, y0), (x1, y1)) ends of every error bar drawn on ``ax``."""
    return [
        tuple(map(tuple, seg))
        for c in ax.containers
        if isinstance(c, ErrorbarContainer)
        for seg in c.lines[2][0].get_segments()
    ]


def test_a_single_run_bar_is_marked_and_has_no_error_bar(drawn):
    scores = pd.DataFrame(
        {
            "task": "HopperBLT-P-v0",
            "algo": "sac",
            "model": ["ffm"] * 3 + ["gru"],
            "run_id": list("abcd"),
            "score": [100.0, 200.0, 300.0, 150.0],
        }
    )
    summary = stats.summarize(scores, n_resamples=200, seed=0)
    figures.plot_task_bars(summary, scores, "unused", "Best eval return")
    ax = drawn[0].axes[0]
    bars = _error_bars(ax)
    ffm = summary.set_index("model").loc["ffm"]
    # One error bar, FFM's (GRU's bar is left of the task's centre, FFM's right): none for GRU's single run, not
    # even of zero width.
    (x0, low), (x1, high) = bars[0]
    assert len(bars) == 1 and x0 == x1 == pytest.approx(0.2)
    assert (low, high) == pytest.approx((ffm["ci_low"], ffm["ci_high"])) and low < high
    marks = [t for t in ax.texts if t.get_text() == figstyle.SINGLE_RUN]
    assert len(marks) == 1 and marks[0].xy == pytest.approx((-0.2, 150.0))  # GRU's bar, at its top
    legend = [t.get_text() for t in drawn[0].legends[0].get_texts()]
    assert f"{figstyle.SINGLE_RUN}: one run, no CI" in legend


def test_without_single_runs_nothing_is_marked(drawn):
    scores = pd.DataFrame(
        {"task": "HopperBLT-P-v0", "algo": "sac", "model": "ffm", "run_id": list("ab"), "score": [100.0, 200.0]}
    )
    figures.plot_task_bars(stats.summarize(scores, n_resamples=100), scores, "unused", "Best eval return")
    assert not drawn[0].axes[0].texts
    assert not any(figstyle.SINGLE_RUN in t.get_text() for t in drawn[0].legends[0].get_texts())


def test_an_aggregate_of_single_runs_is_marked_not_drawn_as_a_zero_width_interval(drawn):
    agg, _ = aggregate.aggregate_scores(
        _frame(
            {
                ("sac", "ffm"): {"A-P-v0": [0.5, 0.7], "B-P-v0": [0.2, 0.4]},
                ("sac", "gru"): {"A-P-v0": [0.3], "B-P-v0": [0.1]},
            }
        ),
        n_resamples=100,
        seed=0,
    )
    figures.plot_aggregate(agg, "unused")
    for ax in drawn[0].axes:
        bars = _error_bars(ax)
        assert len(bars) == 1 and bars[0][1][0] > bars[0][0][0]  # FFM's only, of some width
        assert [t.get_text() for t in ax.texts] == [f"{figstyle.SINGLE_RUN} per task"]
