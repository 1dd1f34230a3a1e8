"""A request's JSON body, as both APIs read it (the native one and KServe v2): each key of an object
once, and what a refusal says of a body no parser reads, in text an answer can carry."""

from __future__ import annotations

import json
import re
import sys

from bertvision.files import RepeatedKey, object_once


def loads_keys_once(body: bytes | str):
    """The body's JSON value, each object's keys once: json keeps the last of two equal keys
    silently, so ``{"texts": [...], "texts": [...]}`` would answer the second list alone."""
    return json.loads(body, object_pairs_hook=object_once)


def printable(text: str) -> str:
    """``text`` as UTF-8 can carry it: a lone surrogate (JSON may hold ``"\\ud800"``, as a key too)
    written as its escape, so that an answer naming it can be sent (encoding it failed: a 500)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


_LONG_NUMBER = re.compile(r"integer string conversion: value has (\d+) digits")


def unreadable_body(err: Exception) -> str:
    """Why a parser could not read a body, in the client's terms (either API): a key given twice in
    one object (json keeps the last silently: what came first would be lost), nesting past the
    parser's depth, or an integer past Python's digit limit (its message told the client to call
    ``sys.set_int_max_str_digits()``; FastAPI's said only "There was an error parsing the body")."""
    if isinstance(err, RepeatedKey):
        return f"key {err.args[0]!r} given twice in one object; give each key once"
    if isinstance(err, RecursionError):
        return "not JSON (nested too deeply)"
    long_number = _LONG_NUMBER.search(str(err))
    if long_number:
        return f"not JSON (a number of {long_number.group(1)} digits, at most {sys.get_int_max_str_digits()})"
    return f"not JSON ({err})"
