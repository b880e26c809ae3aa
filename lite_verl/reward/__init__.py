"""Rewards behind one `Scorer` Protocol, chosen once by `base.make_scorer(cfg.reward)`: rule functions by
data source or a user function in process (rules.py), a user function in an isolated worker (worker.py),
a reward model started on demand (model.py), a remote scorer over HTTP (remote.py).

Nothing is imported here: the worker's child process imports worker.py and rules.py, and must start
without torch (reward.timeout_s counts from the first request)."""
