"""Reading an answer out of a completion: the rules the rewards share.

A model trained on a task's own format answers with the answer alone; an
instruction-tuned model answers in sentences ("37 + 45 = 82", "The answer is
82."). For numbers the rule is the one the paper uses on GSM8K: the last number
in the text, commas stripped, compared as a number.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> Decimal | None:
    """The last number in ``text`` (commas stripped), or None when there is none."""
    for match in reversed(_NUMBER.findall(text)):
        try:
            return Decimal(match.replace(",", ""))
        except InvalidOperation:
            continue
    return None
