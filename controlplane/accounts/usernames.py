# ruff: noqa: RUF001, RUF002 (the look-alike letters are the point of this module)
"""User names that cannot be mistaken for one another.

A provider (or a local admin) could otherwise add `RT_ADMIN` or `rt_admіn` (Cyrillic і) next to
the local `rt_admin`, and an audit trail or a token list would show two people as one. Names are
kept as given after NFKC (as Django stores them), and compared by their *skeleton*: NFKC, the
Cyrillic and Greek letters that look like Latin ones (and 0/1 that look like o/l) mapped to
them, then casefolded. Two names with one skeleton are one name here.

The table is small on purpose (Unicode TR39's full table is not installed here): it covers the
letters a look-alike of a Latin user name is made of in practice.
"""

from __future__ import annotations

import unicodedata

from django.contrib.auth import get_user_model
from django.db import connection

_LOOK_ALIKES = {
    # Cyrillic capitals and small letters drawn like Latin ones.
    "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P", "С": "C",
    "Т": "T", "Х": "X", "І": "I", "Ј": "J", "Ѕ": "S", "Ү": "Y", "Ԁ": "D", "Ԛ": "Q", "Ԝ": "W",
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "і": "i", "ј": "j",
    "ѕ": "s", "һ": "h", "ԁ": "d", "ӏ": "l", "ԛ": "q", "ԝ": "w", "ү": "y",
    # Greek.
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N",
    "Ο": "O", "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
    "α": "a", "ο": "o", "ρ": "p", "ν": "v", "ι": "i", "κ": "k", "υ": "u",
    # Latin and digits that pass for other Latin letters.
    "ı": "i", "0": "o", "1": "l",
}  # fmt: skip
_TABLE = str.maketrans(_LOOK_ALIKES)


def normalise(name: str) -> str:
    """The form a user name is stored in (Django's own: NFKC)."""
    return unicodedata.normalize("NFKC", name)


def skeleton(name: str) -> str:
    """What `name` looks like: equal for names a reader cannot tell apart."""
    return normalise(name).translate(_TABLE).casefold()


def confusable_account(name: str):
    """The existing user whose name looks like `name` (the same name included), or None.

    Reads every name: a control plane has tens of accounts, and a skeleton is derived, not kept.
    Call it in the transaction that creates the account: it holds a lock until that commits, so
    two look-alikes created at once cannot both find the other absent.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext('accounts.new_username'))")
    wanted = skeleton(name)
    for user in get_user_model().objects.only("pk", "username").iterator():
        if skeleton(user.get_username()) == wanted:
            return user
    return None
