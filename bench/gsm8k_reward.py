"""GSM8K reward for the learning benchmark (bench/gsm8k.py): verl's strict `#### n` rule, with 0.1 for an
answer in that format that is wrong (verl's format_score), so that a model which rarely uses the format
gets a learning signal. Accuracy is always measured by the strict rule alone."""

from __future__ import annotations

from lite_verl.reward.rules import gsm8k_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return gsm8k_score(solution_str, ground_truth, format_score=0.1)
