"""Tables and figures for pomdp-ffm runs (and the reference implementation's logs and published results).

Command line: ``python -m analysis [COMMAND] RUNS... [--published DIR] --out DIR`` (``--help`` lists
commands and options).  Library use::

    from analysis import aggregate, load, published, stats
    table, report = load.load_runs(["runs/"], cache_dir="out/.cache")
    scores = stats.run_scores(table, metric="runmax")
    summary = stats.summarize(scores, n_resamples=10_000, seed=0)
    agg, notes = aggregate.aggregate_scores(stats.normalize(scores)[0], seed=0)
    curves, problems, n_found, n_read = published.read_published(["results/data/pomdp"])
"""
