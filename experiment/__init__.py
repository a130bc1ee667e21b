"""The controlled experiment behind run_cycles.py: its presets (data), its steps (and the check of their
--extra_* words), the processes that run them, each arm's step of a cycle, its measurements, frontier and
verdicts (and the A/A test of their rule), FLOPs, the residual model, the report and samples.md, MAUVE, and the human rating page and its
scoring."""
