"""Corpora, the GPT-2 tokenizer, lexicons and the behavioural tasks."""
