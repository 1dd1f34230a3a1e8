"""What counts as a text to read, in a task's files and in a request alike."""

from __future__ import annotations

import unicodedata

# letters, digits, punctuation, symbols (emoji among them): what a tokenizer makes tokens of
_READ = frozenset("LNPS")


# the replacement character: a symbol, but BERT's tokenizer drops it, as a decoder's errors="replace" leaves it
_DROPPED = "\ufffd"


def readable(text: str) -> bool:
    """Whether ``text`` holds a character a tokenizer reads: not only spaces, control characters,
    zero-width or format characters (U+200B, U+FEFF), combining marks or U+FFFD, which tokenize to
    nothing, so that every such text gets the same answer."""
    return any(unicodedata.category(c)[0] in _READ and c not in _DROPPED for c in text)
