"""Rewards behind one `Scorer` Protocol, chosen once by `base.make_scorer(cfg.reward)`: reward functions
(functions.py: TRL's and verl's shapes, several weighted ones; builtins.py: gsm8k, boxed, format, length;
rules.py: the rule rewards by data source) called in process or in an isolated worker (worker.py), a reward
model started on demand (model.py), a remote scorer over HTTP (remote.py).

Nothing is imported here: the worker's child process imports worker.py, functions.py, rules.py and
builtins.py, and must start without torch (reward.timeout_s counts from the first request)."""
