"""What counts as a text to read, in a task's files and in a request alike."""

from __future__ import annotations

import unicodedata

# letters, digits, punctuation, symbols (emoji among them): what a tokenizer makes tokens of
_READ = frozenset("LNPS")


def readable(text: str) -> bool:
    """Whether ``text`` holds a character a tokenizer reads: not only spaces, control characters,
    zero-width or format characters (U+200B, U+FEFF) or combining marks, which tokenize to nothing,
    so that every such text gets the same answer."""
    return any(unicodedata.category(c)[0] in _READ for c in text)
