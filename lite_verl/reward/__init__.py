"""Rewards: rule functions by data source, user functions (in-process or in an isolated worker), a reward
model started on demand, and a remote scorer over HTTP."""
