"""Tables and figures for pomdp-ffm runs (and the reference implementation's logs).

Command line: ``python -m analysis [COMMAND] RUNS... --out DIR`` (``--help`` lists
commands and options).  Library use::

    from analysis import load, stats, figures
    table, report = load.load_runs(["runs/"], cache_dir="out/.cache")
    scores = stats.run_scores(table, metric="runmax")
    summary = stats.summarize(scores, n_resamples=10_000, seed=0)
"""
