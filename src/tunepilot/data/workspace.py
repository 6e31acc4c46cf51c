"""The campaign folder: one place that knows where everything lives (DESIGN: the campaign folder).

```
campaign.yaml  tunepilot.db  data/<version>/  runs/<run-id>/  pilots/<pilot-id>/  exports/<run-id>/
report/index.html
```
A `Workspace` is opened from a campaign file plus command-line overrides. Heavy pieces (the
tokenizer, the encoder) are built on first use, so `validate` never pays for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunepilot.campaign import Campaign, load_campaign

if TYPE_CHECKING:
    from tunepilot.data.prepared import PreparedData


def _inside(name: str) -> property:
    """A path of the campaign folder's layout (module docstring), relative to its root."""
    return property(lambda self: self.root / name, doc=f"`{name}` in the campaign folder")


@dataclass
class Workspace:
    campaign_file: Path
    campaign: Campaign
    overrides: list[str] = field(default_factory=list)

    @classmethod
    def open(cls, campaign_file: str | Path, overrides: list[str] | None = None) -> Workspace:
        path = Path(campaign_file)
        return cls(path.resolve(), load_campaign(path, overrides or []), list(overrides or []))

    def with_overrides(self, extra: list[str]) -> Workspace:
        """The same campaign with `extra` dotted overrides on top (a sizing setting, a
        candidate change). The data read once and the facts derived from it are shared when no
        override touches the data, so a plan's dry runs do not read and encode it again."""
        other = Workspace.open(self.campaign_file, [*self.overrides, *extra])
        if not any(o.startswith(("data.", "hypothesis.")) for o in extra):
            other.__dict__["preview"] = self.preview
            other.__dict__["memo"] = self.memo
        return other

    # -- folders ---------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        return self.campaign_file.parent

    runs_dir = _inside("runs")
    pilots_dir = _inside("pilots")
    exports_dir = _inside("exports")
    report_dir = _inside("report")
    ledger_path = _inside("tunepilot.db")

    # -- data and encoding ------------------------------------------------------------------
    def prepare(self, write: bool = True, seal: bool = True) -> PreparedData:
        """The campaign's data, split and versioned; `seal=False` never creates the test seal."""
        from tunepilot.data.prepare import prepare_data

        return prepare_data(self.campaign, self.root, write=write, seal=seal)

    @cached_property
    def preview(self) -> PreparedData:
        """The data as `prepare` versions it, neither written nor sealed, read once for this
        workspace: what sizing looks at (a plan's several dry runs share it)."""
        return self.prepare(write=False, seal=False)

    @cached_property
    def memo(self) -> dict[Any, Any]:
        """Facts derived once from this campaign's data and base (the dry run's longest
        example, an image's processed size), so repeated dry runs do not redo them."""
        return {}

    @cached_property
    def model_source(self) -> Any:
        from tunepilot.model.base import resolve_source

        return resolve_source(self.campaign.model, root=self.root)

    @cached_property
    def tokenizer(self) -> Any:
        """The base's preprocessor: its tokenizer, or its image processor for images."""
        from tunepilot.model.processors import load_image_processor, load_tokenizer

        load = (
            load_image_processor
            if self.campaign.hypothesis.task == "image_classification"
            else load_tokenizer
        )
        return load(self.model_source, self.campaign.model.trust_remote_code)

    def encoder(self, label_names: list[str]) -> Any:
        from tunepilot.tasks import make_encoder

        return make_encoder(self.campaign, self.tokenizer, label_names, self.root)

    def model_config(self) -> dict[str, Any] | None:
        """The base model's config.json as a mapping (no weights loaded), or None."""
        import json

        config_file = Path(self.model_source.path) / "config.json"
        if not config_file.is_file():
            return None
        config = json.loads(config_file.read_text(encoding="utf-8"))
        return config if isinstance(config, dict) else None

    def model_label_map(self) -> dict[int, str] | None:
        """id2label of a head the base model already has (D6), read from config.json only."""
        config = self.model_config()
        if config is None:
            return None
        architectures = config.get("architectures") or []
        heads = ("ForSequenceClassification", "ForImageClassification")
        if not any(a.endswith(heads) for a in architectures):
            return None
        return {int(k): v for k, v in (config.get("id2label") or {}).items()}
