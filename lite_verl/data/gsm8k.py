"""Convert GSM8K in its original jsonl form ({"question", "answer"}) to verl's prompt schema.

    lite-verl prepare-gsm8k ../shared/data/gsm8k/train.jsonl data/gsm8k_train.jsonl

Follows verl's examples/data_preprocess/gsm8k.py: the question plus an instruction to put the final
answer after "####"; the ground truth is the number after "####" in the reference answer.
"""

from __future__ import annotations

from pathlib import Path

from lite_verl.data.schema import PromptRow, write_jsonl
from lite_verl.data.sources import load_split
from lite_verl.data.tasks import GSM8K_SUFFIX
from lite_verl.errors import DataError

GSM8K_SOURCE = "openai/gsm8k"


def convert_gsm8k(src: str | Path, dst: str | Path, split: str = "") -> int:
    """Returns the number of rows written. Reads any form `datasets` reads (jsonl, parquet as on the Hub,
    a datasets directory); raises DataError naming the bad row."""
    src, dst = Path(src), Path(dst)
    if not src.exists():
        raise DataError(f"{src} does not exist; give GSM8K's train or test split (jsonl or parquet)")
    split = split or src.stem.split("-")[0]
    rows: list[PromptRow] = []
    parts = load_split(str(src), "train", "", "prepare-gsm8k", "its split")
    assert parts is not None  # a required split raises instead
    for part in parts:
        for i, raw in enumerate(part.rows):
            question, answer = raw.get("question"), raw.get("answer")
            if not isinstance(question, str) or not isinstance(answer, str):
                raise DataError(f"{part.where(i)}: expected the text columns 'question' and 'answer' "
                                f"(its columns: {', '.join(part.columns)})")  # fmt: skip
            if "####" not in answer:
                raise DataError(f"{part.where(i)}: the answer has no '#### n' final answer")
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
