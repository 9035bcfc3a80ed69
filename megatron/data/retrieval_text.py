"""The words of the retrieval tasks: one home for evaluation's prompts
(megatron/evaluation/retrieval/prompts.py) and the retrieval training corpus
(megatron/data/corpora/retrieval.py), so a model trained on the corpus is asked in the words it
learned. Data-layer: evaluation imports it, never the other way round."""
from __future__ import annotations

from dataclasses import dataclass

CLASSIC_FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


@dataclass(frozen=True)
class TaskText:
    """The words of one retrieval task; `{key}` and `{value}` are filled per needle."""
    intro: str
    needle: str
    question: str
    digits: int  # the value's format: this many digits, no leading zero
    distractors: int  # needles with other keys (the key-value task's haystack of look-alikes)
    code: int  # the task's place in the seed tuple (a renamed task keeps its prompts)


TASKS = {
    "passkey": TaskText(
        intro="A pass key is hidden inside a lot of irrelevant text. Find it and memorize it.\n",
        needle=" The pass key is {value}. Remember it. {value} is the pass key.",
        question="\nWhat is the pass key? The pass key is",
        digits=5, distractors=0, code=1),
    "kv": TaskText(
        intro="Special magic numbers are hidden in the text below. Memorize them.\n",
        needle=" The special magic number for {key} is {value}.",
        question="\nThe special magic number for {key} is",
        digits=7, distractors=3, code=2),
}

# Keys of the key-value task's evaluation prompts: an adjective and a noun (RULER draws words too).
ADJECTIVES = ("amber", "brave", "calm", "dusty", "eager", "faint", "gentle", "hollow", "icy", "jolly", "keen",
              "lively", "misty", "noble", "odd", "proud", "quiet", "rapid", "silent", "tidy", "upbeat", "vivid",
              "wild", "young")
NOUNS = ("anchor", "badger", "candle", "dolphin", "ember", "falcon", "garden", "harbor", "island", "jacket",
         "kettle", "lantern", "meadow", "needle", "orchard", "pepper", "quarry", "river", "saddle", "tunnel",
         "valley", "walnut", "yarrow", "zephyr")
# Keys of the training corpus: other words, so an evaluation key never occurs in the training data or
# in a filler taken from its split (a model must copy what it reads, not recall what it trained on).
TRAIN_COLORS = ("azure", "beige", "coral", "crimson", "golden", "indigo", "ivory", "lemon", "lilac", "maroon", "olive",
                "orange", "pink", "plum", "rusty", "scarlet", "silver", "teal", "violet", "white")
TRAIN_ANIMALS = ("beaver", "camel", "cobra", "crane", "eagle", "ferret", "gecko", "heron", "hyena", "koala", "lemur",
                 "llama", "moose", "otter", "panda", "raven", "shark", "sloth", "tiger", "zebra")
