"""A second tokenizer for the tests: a metaspace tokenizer (a space becomes "▁", as in
SentencePiece-style vocabularies, not GPT-2's "Ġ") over a WordPiece vocabulary we write, so a
word is one token exactly when its "▁" spelling is in the vocabulary; any other word falls
back to a prefix and "##" pieces (two or more tokens)."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

from headgeom.data import lexicon
from headgeom.data.tasks import TASKS

# Every frame string of the three prompts (the lexicon supplies the rest).
FRAME = ["The", " the", "She", "He", " and", " =", '"', "'", "\n", *lexicon.PLURAL_VERBS]
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _all_forms() -> set[str]:
    forms = set(FRAME)
    for task in TASKS:
        forms.update(lexicon.FIXED_SINGLE_TOKEN_WORDS[task])
        for pools in (lexicon.TASK_SLOTS[task], lexicon.RESERVE[task]):
            for slot, items in pools.items():
                for item in items:
                    forms.update(lexicon.slot_forms(task, slot, item))
    return forms


def metaspace_tokenizer(without: Iterable[str] = (), phrases: Iterable[str] = ()) -> Tokenizer:
    """Every task form is one token except those in ``without``; each of ``phrases`` (e.g.
    " two small") is one token too, spanning its words."""
    mark = [w.replace(" ", "▁") for w in phrases]
    vocab = ["[UNK]", "▁", *LETTERS, *(f"##{c}" for c in LETTERS), "##▁"]
    vocab += sorted((_all_forms() - set(without)) | set(phrases))
    vocab = [w.replace(" ", "▁") for w in dict.fromkeys(vocab)]
    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.Replace(" ", "▁")
    # a word with its leading "▁", or any other single character; phrases first
    pattern = "|".join([*mark, "▁?[A-Za-z]+", "[^A-Za-z]"])
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    return tok
