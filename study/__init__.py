"""The reproduction study's analysis over many runs' records, driven by tools/make_report.py (and
tools/aggregate_results.py, tools/run_matrix.py --records); megatron/evaluation/ is what a user calls
to evaluate one model, and this package only reads what it writes (eval.json, run records).

results        many eval.json files -> RunResults
run_record     a finished matrix run reduced to the small committed files (record.json, trajectory, kernel)
aggregate      Table 3 / Table 4 and the per-group perplexity and position-wise plots
convergence    the drift of each head's positional parameters over the last 20% of training
flat_kernels   every KERPLE head's f(L), f(8L), f(32L) (the paper's flat kernels, §5.4)
train_test     final training vs test perplexity
trend          the seed-paired gaps against the train length
train_length_quality  each train length's perplexity on the same windows
gap_vs_quality the gaps against model quality and the train length together
replicates     which runs trained the same configuration (counted once where designs are pooled)
growth         each scheme's gap at 1x and its growth to 8x and 32x
plots          the study's own figures (trajectories, trends, gaps against quality)
claims         every figure the report quotes, and the report rendered from its template
"""
