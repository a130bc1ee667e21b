"""The controlled experiment behind run_cycles.py: its presets (data), its command line (and the check of the steps'
--extra_* words), the Run and its steps, the processes that run them, cycle 0 (and beside the data-limited preset's MLE at its limit, its positive controls: limit), the arms as one table and a cycle of them (tuning: a tuned arm's grid, chosen on the dev slice), a user's own arm and a
checkpoint from elsewhere (run_cycles --arm, compare.py), its measurements, frontier and verdicts (and the A/A test
of their rule; power: intervals, minimum detectable effects and the words under a margin), FLOPs, the residual model, the report and samples.md, MAUVE, and the human rating page and its
scoring."""
