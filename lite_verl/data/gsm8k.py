"""Convert GSM8K in its original jsonl form ({"question", "answer"}) to verl's prompt schema.

    lite-verl prepare-gsm8k ../shared/data/gsm8k/train.jsonl data/gsm8k_train.jsonl

Follows verl's examples/data_preprocess/gsm8k.py: the question plus an instruction to put the final
answer after "####"; the ground truth is the number after "####" in the reference answer.
"""

from __future__ import annotations

import json
from pathlib import Path

from lite_verl.data.schema import PromptRow, write_jsonl
from lite_verl.data.tasks import GSM8K_SUFFIX
from lite_verl.errors import DataError

GSM8K_SOURCE = "openai/gsm8k"


def convert_gsm8k(src: str | Path, dst: str | Path, split: str = "") -> int:
    """Returns the number of rows written. Raises DataError naming the bad line."""
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise DataError(f"{src} does not exist; give GSM8K's train.jsonl or test.jsonl")
    split = split or src.stem
    rows: list[PromptRow] = []
    with src.open() as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                question, answer = raw["question"], raw["answer"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise DataError(f"{src}:{i}: expected a JSON object with 'question' and 'answer'") from None
            if "####" not in answer:
                raise DataError(f"{src}:{i}: the answer has no '#### n' final answer")
            truth = answer.split("####")[-1].strip().replace(",", "")
            rows.append(
                PromptRow(
                    messages=({"role": "user", "content": f"{question} {GSM8K_SUFFIX}"},),
                    data_source=GSM8K_SOURCE,
                    ground_truth=truth,
                    extra_info={"split": split, "index": len(rows), "answer": answer, "question": question},
                )
            )
    if not rows:
        raise DataError(f"{src} holds no rows")
    write_jsonl(rows, dst)
    return len(rows)
