"""Run bookkeeping: the run directory (config, metrics, checkpoints), the console, and the bill."""
