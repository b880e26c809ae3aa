"""Built-in tasks, generated locally from a seed (no download), in verl's row schema.

* `echo`: "Repeat the letter c." The reward is how often the answer holds that letter, capped at
  ECHO_LEN and divided by it, so it is graded (0..1) and a random-init tiny model can climb it by RL
  in minutes on a CPU: first by learning which letters pay, then which letter the prompt asks for.
* `arithmetic`: GSM8K-style word problems with one or two operations on small numbers; the answer is
  checked exactly like GSM8K's (`#### n`, the last one in the response). A step towards GSM8K for
  small pretrained models.
* `countdown`: "Using the numbers [3, 7, 12], make 16" with +, -, * and each number exactly once, the
  equation given in <answer>...</answer> (TinyZero's task, made smaller: three numbers up to 20). Every
  target is reachable by construction; reward/rules.py's countdown_score checks the equation exactly.
* `sequence`: "What is the next number in the sequence 5, 8, 11, 14?" (arithmetic progressions, rising
  or falling), answered and checked like `arithmetic` (`#### n`).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from lite_verl.data.schema import PromptRow

ECHO_LETTERS = "abcd"  # the letters a prompt may ask for
ECHO_LEN = 8  # characters scored
ECHO_SOURCE = "lite_verl/echo"
ARITH_SOURCE = "lite_verl/arithmetic"
COUNTDOWN_SOURCE = "lite_verl/countdown"
SEQUENCE_SOURCE = "lite_verl/sequence"
LARGEST_SOURCE = "lite_verl/largest"
GSM8K_SUFFIX = 'Let\'s think step by step and output the final answer after "####".'


def _user_row(text: str, source: str, truth: str, extra: dict) -> PromptRow:
    return PromptRow(({"role": "user", "content": text},), source, truth, extra)


def echo_rows(n: int, seed: int) -> list[PromptRow]:
    rng = random.Random(f"echo-{seed}")
    letters = [rng.choice(ECHO_LETTERS) for _ in range(n)]
    return [
        _user_row(f"Repeat the letter {c}.", ECHO_SOURCE, c, {"index": i, "answer": c * ECHO_LEN})
        for i, c in enumerate(letters)
    ]


_NAMES = ["Sam", "Ana", "Tom", "Mia", "Leo", "Zoe", "Max", "Ivy"]
_ITEMS = ["apples", "books", "coins", "pens", "cards", "eggs", "shells", "stamps"]


def _word_problem(rng: random.Random) -> tuple[str, str, int]:
    """One problem: (question, worked solution ending in '#### n', n)."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    kind = rng.choice(["add", "sub", "mul", "add_sub"])
    if kind == "add":
        q = f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?"
        ans, work = a + b, f"{a} + {b} = {a + b}"
    elif kind == "sub":
        a, b = max(a, b), min(a, b)
        q = f"{name} has {a} {item} and gives away {b}. How many {item} are left?"
        ans, work = a - b, f"{a} - {b} = {a - b}"
    elif kind == "mul":
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        q = f"{name} buys {a} boxes with {b} {item} in each box. How many {item} is that in total?"
        ans, work = a * b, f"{a} * {b} = {a * b}"
    else:
        c = rng.randint(1, a + b)
        q = f"{name} has {a} {item}, finds {b} more, then loses {c}. How many {item} does {name} have?"
        ans, work = a + b - c, f"{a} + {b} = {a + b}, {a + b} - {c} = {a + b - c}"
    return q, f"{work}.\n#### {ans}", ans


def arithmetic_rows(n: int, seed: int) -> list[PromptRow]:
    rng = random.Random(f"arithmetic-{seed}")
    problems = [_word_problem(rng) for _ in range(n)]
    return [
        _user_row(f"{q} {GSM8K_SUFFIX}", ARITH_SOURCE, str(ans), {"index": i, "answer": work, "question": q})
        for i, (q, work, ans) in enumerate(problems)
    ]


COUNTDOWN_PROMPT = (
    "Using the numbers {numbers}, create an equation that equals {target}. You can use +, - and *, and "
    "each number exactly once. Think briefly, then give only the equation inside <answer> </answer> tags, "
    "for example <answer>(1 + 2) * 3</answer>."
)


def _countdown_problem(rng: random.Random) -> tuple[list[int], int, str]:
    """Three numbers, a target made from them with two operations (kept in 1..200), and that equation."""
    while True:
        a, b, c = (rng.randint(1, 20) for _ in range(3))
        op1, op2 = rng.choice("+-*"), rng.choice("+-*")
        equation = f"({a} {op1} {b}) {op2} {c}" if rng.random() < 0.5 else f"{a} {op1} ({b} {op2} {c})"
        target = eval(equation)  # noqa: S307 - our own digits and operators
        if 1 <= target <= 200:
            numbers = [a, b, c]
            rng.shuffle(numbers)
            return numbers, target, equation


def countdown_rows(n: int, seed: int) -> list[PromptRow]:
    rng = random.Random(f"countdown-{seed}")
    problems = [_countdown_problem(rng) for _ in range(n)]
    return [
        _user_row(
            COUNTDOWN_PROMPT.format(numbers=numbers, target=target),
            COUNTDOWN_SOURCE,
            str(target),
            {"index": i, "numbers": numbers, "answer": f"<answer>{equation}</answer>"},
        )  # fmt: skip
        for i, (numbers, target, equation) in enumerate(problems)
    ]


def _sequence_problem(rng: random.Random) -> tuple[list[int], int]:
    """An arithmetic progression of 4 or 5 terms (step 2..15, rising or falling, kept positive), its next term."""
    step, n = rng.randint(2, 15) * rng.choice([1, 1, -1]), rng.randint(4, 5)
    first = rng.randint(1, 99) + (-step * n if step < 0 else 0)
    return [first + step * i for i in range(n)], first + step * n


def sequence_rows(n: int, seed: int) -> list[PromptRow]:
    rng = random.Random(f"sequence-{seed}")
    rows = []
    for i in range(n):
        terms, nxt = _sequence_problem(rng)
        work = (
            f"The step is {terms[1] - terms[0]}: {terms[-1]} + ({terms[1] - terms[0]}) = {nxt}.\n#### {nxt}"
        )
        q = f"What is the next number in the sequence {', '.join(map(str, terms))}?"
        rows.append(_user_row(f"{q} {GSM8K_SUFFIX}", SEQUENCE_SOURCE, str(nxt), {"index": i, "answer": work}))
    return rows


def largest_rows(n: int, seed: int) -> list[PromptRow]:
    """The largest of 4 to 6 distinct numbers (1..99) in random order: reading and comparing, no arithmetic
    (which a 135M model gets wrong too often to learn `sequence`)."""
    rng = random.Random(f"largest-{seed}")
    rows = []
    for i in range(n):
        numbers = rng.sample(range(1, 100), rng.randint(4, 6))
        top = max(numbers)
        q = f"Which is the largest of these numbers: {', '.join(map(str, numbers))}?"
        work = f"The largest is {top}.\n#### {top}"
        rows.append(_user_row(f"{q} {GSM8K_SUFFIX}", LARGEST_SOURCE, str(top), {"index": i, "answer": work}))
    return rows


TASKS: dict[str, Callable[[int, int], list[PromptRow]]] = {
    "echo": echo_rows,
    "arithmetic": arithmetic_rows,
    "countdown": countdown_rows,
    "sequence": sequence_rows,
    "largest": largest_rows,
}


def task_rows(task: str, n: int, seed: int, split: str = "train") -> list[PromptRow]:
    """`split` picks a disjoint seed stream, so validation prompts are held out from training ones."""
    stream = seed if split == "train" else seed + 1_000_003
    return TASKS[task](n, stream)


def tokenizer_corpus(seed: int = 0, n: int = 2000) -> list[str]:
    """Text the tiny model's tokenizer is trained on: the echo and arithmetic prompts and answers. Fixed to
    those two so that tiny models (and their cached copies) stay the same as tasks are added; byte-level
    BPE still encodes any text."""
    texts = []
    for make in (echo_rows, arithmetic_rows):
        for row in make(n, seed):
            texts.append(row.messages[0]["content"])
            texts.append(str(row.extra_info.get("answer", row.ground_truth)))
    return texts
