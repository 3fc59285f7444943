"""The builtin prompt sets, built locally with no Hub access (other datasets are read by task.py).

A builtin set's rows have a conversational "prompt" (system + user message) and a "target_length" that the
`length_target` reward reads once `reward_columns` maps it. The system message is short on purpose: the
builtin tokenizer is byte-level, so Qwen's default system prompt would add ~70 tokens to every prompt.

Each set also has a held-out split, `test` (`builtin_eval_rows`): other questions of the same kind, never trained
on, for the held-out evaluation.
"""

BUILTIN_PREFIX = "builtin:"
TARGET_LENGTH = 8
ROWS_PER_SET = 64

SYSTEM = {
    "count-to-ten": "You count. Answer with numbers only.",
    "letters": "You recite the alphabet. Answer with lowercase letters only.",
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


def builtin_names() -> list[str]:
    return [BUILTIN_PREFIX + name for name in QUESTIONS]


def builtin_rows(name: str) -> list[dict]:
    """The builtin prompt set `name` (without the "builtin:" prefix), repeated to ROWS_PER_SET rows."""
    if name not in QUESTIONS:
        raise ValueError(f"unknown builtin dataset {name!r}; choose one of {', '.join(builtin_names())}")
    questions = QUESTIONS[name]
    return [{"prompt": [{"role": "system", "content": SYSTEM[name]},
                        {"role": "user", "content": questions[i % len(questions)]}],
             "target_length": TARGET_LENGTH} for i in range(ROWS_PER_SET)]


def builtin_eval_rows(name: str) -> list[dict]:
    """The held-out split of builtin set `name`: questions its training rows never ask, each once."""
    builtin_rows(name)   # the same refusal of an unknown name
    return [{"prompt": [{"role": "system", "content": SYSTEM[name]}, {"role": "user", "content": question}],
             "target_length": TARGET_LENGTH} for question in HELD_OUT[name]]
