"""A dense reward for benchmarks on real models that start at zero task reward (a GRPO step with all
rewards equal moves nothing): the rule score, plus a small bonus for answering with digits early."""

from __future__ import annotations

from lite_verl.reward.rules import default_compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    digits = sum(c.isdigit() for c in solution_str[:40])
    return float(default_compute_score(data_source, solution_str, ground_truth, extra_info)) + 0.1 * min(
        digits, 5
    )
