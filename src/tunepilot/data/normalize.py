"""The one text normalisation used for "exact duplicate after normalisation" (D2).

Shared by the `drop_exact_duplicates` cleaning rule and the audit, so that a campaign with the
rule on reports no exact duplicates in the audit: the two can never disagree on what "the
same text" means.
"""

from __future__ import annotations

import re
import unicodedata

_WHITESPACE = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """NFC, lowercase, whitespace collapsed and stripped."""
    return _WHITESPACE.sub(" ", unicodedata.normalize("NFC", text).lower()).strip()
