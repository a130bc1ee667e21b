"""The controlled experiment behind run_cycles.py: its measurements, frontier and verdicts, FLOPs, the
residual model, the report, MAUVE, and the human rating page and its scoring."""
