"""The builtin prompt sets, built locally with no Hub access (other datasets are read by task.py).

A builtin set's rows have a conversational "prompt" (system + user message) and a "target_length" that the
`length_target` reward reads once `reward_columns` maps it. The system message is short on purpose: the
builtin tokenizer is byte-level, so Qwen's default system prompt would add ~70 tokens to every prompt.

`repeat-letters` is the default demo's task: "Say cab" asks for exactly "cab" (its `answer` column, which the
`exact_answer` reward reads).

Each set also has a held-out split, `test` (`builtin_eval_rows`): other questions of the same kind, never trained
on, for the held-out evaluation.
"""

BUILTIN_PREFIX = "builtin:"
REPEAT = "repeat-letters"   # the default demo's task: an exact answer (the letters asked for, in order)
TARGET_LENGTH = 8
ROWS_PER_SET = 64
REPEAT_LETTERS = "abcdef"


# "Say cab" -> "cab": every 3-letter string of a-f (216). One in nine is held out (24), chosen by a rule that keeps
# each held-out string an unseen combination of seen pieces: every letter appears at every position in training. A
# constant or repeated answer is right on one question in 216 at best.
def _repeat_split(held_out: bool) -> list[str]:
    index = {letter: i for i, letter in enumerate(REPEAT_LETTERS)}
    words = [a + b + c for a in REPEAT_LETTERS for b in REPEAT_LETTERS for c in REPEAT_LETTERS]
    return ["Say " + w for w in words
            if ((index[w[0]] + 2 * index[w[1]] + 3 * index[w[2]]) % 9 == 0) == held_out]


def answer_of(question: str) -> str:
    """A repeat-letters question's exact answer: the letters after "Say "."""
    return question.split(" ", 1)[1]


SYSTEM = {
    "count-to-ten": "You count. Answer with numbers only.",
    "letters": "You recite the alphabet. Answer with lowercase letters only.",
    REPEAT: "Repeat the letters.",
}
QUESTIONS = {
    "count-to-ten": [
        "Count from 1 to 10.", "Count to ten.", "What comes after 3?", "List the numbers 1 to 5.",
        "Count down from 9.", "Give me a phone number.", "What is 2 + 2?", "Write the year.",
    ],
    "letters": [
        "Recite the alphabet.", "What comes after b?", "Spell the first five letters.", "Say abc.",
        "Which letter follows x?", "List some vowels.", "Write letters a to h.", "Spell cat.",
    ],
}

EVAL_SPLIT = "test"
HELD_OUT = {
    "count-to-ten": [
        "Count from 5 to 15.", "What comes after 7?", "Write a number bigger than 100.", "Count by twos to 12.",
        "What is 3 + 4?", "List the numbers 10 to 14.", "Give me a zip code.", "Count down from 5.",
    ],
    "letters": [
        "Recite the letters m to r.", "What comes after q?", "Spell dog.", "Say xyz.",
        "Which letter follows k?", "List some consonants.", "Write letters p to w.", "Spell sun.",
    ],
}
QUESTIONS[REPEAT], HELD_OUT[REPEAT] = _repeat_split(False), _repeat_split(True)


def builtin_names() -> list[str]:
    return [BUILTIN_PREFIX + name for name in QUESTIONS]


def builtin_rows(name: str) -> list[dict]:
    """The builtin prompt set `name` (without the "builtin:" prefix), repeated to ROWS_PER_SET rows."""
    if name not in QUESTIONS:
        raise ValueError(f"unknown builtin dataset {name!r}; choose one of {', '.join(builtin_names())}")
    questions = QUESTIONS[name]
    return [_row(name, questions[i % len(questions)]) for i in range(max(ROWS_PER_SET, len(questions)))]


def _row(name: str, question: str) -> dict:
    """A builtin row: the conversation, the `length_target` column, and for repeat-letters its exact `answer`."""
    row = {"prompt": [{"role": "system", "content": SYSTEM[name]}, {"role": "user", "content": question}],
           "target_length": TARGET_LENGTH}
    return {**row, "answer": answer_of(question)} if name == REPEAT else row


def builtin_eval_rows(name: str) -> list[dict]:
    """The held-out split of builtin set `name`: questions its training rows never ask, each once."""
    builtin_rows(name)   # the same refusal of an unknown name
    return [_row(name, question) for question in HELD_OUT[name]]
