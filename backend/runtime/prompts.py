"""Prompt sets for GRPO: the builtin ones are built locally; any other name is a Hub dataset id.

A builtin set is a `datasets.Dataset` with a conversational "prompt" column (system + user message) and a
"target_length" column that the `length_target` reward reads. The system message is short on purpose: the
builtin tokenizer is byte-level, so Qwen's default system prompt would add ~70 tokens to every prompt.
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


def builtin_names() -> list[str]:
    return [BUILTIN_PREFIX + name for name in QUESTIONS]


def builtin_prompts(name: str):
    """The builtin prompt set `name` (without the "builtin:" prefix), repeated to ROWS_PER_SET rows."""
    from datasets import Dataset

    if name not in QUESTIONS:
        raise ValueError(f"unknown builtin dataset {name!r}; choose one of {', '.join(builtin_names())}")
    questions = QUESTIONS[name]
    rows = [questions[i % len(questions)] for i in range(ROWS_PER_SET)]
    return Dataset.from_dict({
        "prompt": [[{"role": "system", "content": SYSTEM[name]}, {"role": "user", "content": q}] for q in rows],
        "target_length": [TARGET_LENGTH] * len(rows),
    })


def load_prompts(dataset: str):
    """A builtin set by its "builtin:<name>" id, else the train split of a Hub dataset (Hugging Face Jobs only)."""
    if dataset.startswith(BUILTIN_PREFIX):
        return builtin_prompts(dataset[len(BUILTIN_PREFIX):])
    from datasets import load_dataset

    return load_dataset(dataset, split="train")
