"""Wrong student answers, one module per lab, that the lab's checks must reject.

A wrong answer's row gives the words its message must contain: a string, a
tuple of strings, or ``Says``, which also names the words it must not
contain (another mistake's hint: a message that names a mistake the answer
did not make) and marks an answer whose mistake no evidence can tell from
another's (its message must say what differs and name no cause).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Says:
    """What a wrong answer's message must say (``has``) and must not (``never``).

    ``differs``: the answer's results fit two known mistakes on every case
    the check ran, so the message names neither and says what differs; its
    ``has`` words are that description.
    """

    has: tuple
    never: tuple = ()
    differs: bool = False


def says(*has: str, never: tuple | str = (), differs: bool = False) -> Says:
    """``Says`` from words: ``says("12 bytes per parameter", never="only the optimizer state")``."""
    return Says(tuple(has), (never,) if isinstance(never, str) else tuple(never), differs)


def must(words) -> tuple:
    """The words a row's message must contain, whatever form the row gives them in."""
    if isinstance(words, Says):
        return words.has
    return (words,) if isinstance(words, str) else tuple(words)


def must_not(words) -> tuple:
    """The words a row's message must not contain."""
    return words.never if isinstance(words, Says) else ()


def holds(message: str, words) -> bool:
    """Whether ``message`` contains every word it must and none it must not."""
    return all(w in message for w in must(words)) and not any(w in message for w in must_not(words))
