"""What the exported model card says that the runs cannot know: license, language, the data's
name and its Hub ids (L5). Everything else on the card is read from the campaign and ledger.

Unset values come from the base model's own card (its README metadata) where it has them;
a license or language the base states is inherited, and the card says where it came from.
Importing this module stays cheap (pydantic only).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from tunepilot.campaign.bounds import Strict

LanguageCode = Annotated[
    str, Field(pattern=r"^[a-z]{2,3}(-[A-Za-z0-9]{2,8})?$", max_length=16,
               description="An ISO 639 code as the Hub writes it: `en`, `pt`, `tr`, `pt-BR`.")
]  # fmt: skip
HubDatasetId = Annotated[
    str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$",
               max_length=96, description="A Hub dataset id: `name` or `org/name`.")
]  # fmt: skip


class CardSettings(Strict):
    """The model card's metadata that only the user can state (`card:` in the campaign)."""

    license: str | None = Field(
        default=None, pattern=r"^[a-z0-9][a-z0-9.+-]*$", max_length=64,
        description="The Hub license id of the delivered weights (`apache-2.0`, `mit`, "
        "`llama3.1`, `other`); unset: the base model's card's license.",
    )  # fmt: skip
    language: list[LanguageCode] = Field(
        default_factory=list, max_length=32,
        description="Languages of the data; unset: the base model's card's.",
    )  # fmt: skip
    dataset_name: str | None = Field(
        default=None, min_length=1, max_length=96,
        description="What the card calls the training data; unset: the data folder's name "
        "(or the file's, when it sits in the campaign folder).",
    )  # fmt: skip
    datasets: list[HubDatasetId] = Field(
        default_factory=list, max_length=32,
        description="Hub dataset ids the data comes from (the card's `datasets` metadata, "
        "which the Hub links); local files are named in the card's text instead.",
    )  # fmt: skip
