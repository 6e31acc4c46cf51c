"""What an image campaign's step is fed, for the dry run: pixel_values of the processor's size.

A vision model's activations depend on the picture the processor hands it (3 x 224 x 224 for
a ViT-B/16: 196 patches), not on any token length. That size is read the way training gets
it: the base's own image processor (`AutoImageProcessor`, next to config.json) applied by the
campaign's encoder to its first training image; without a processor, the config's
`image_size` and `num_channels`, said so. The batch is then full of such pictures, one class id
each, exactly as `train.batching.collate` stacks them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tunepilot.errors import input_error

if TYPE_CHECKING:
    from tunepilot.data.workspace import Workspace
    from tunepilot.sizing.dry_run.config import ArchitectureConfig

PROCESSOR_FILE = "preprocessor_config.json"


def image_input(
    ws: Workspace, arch: ArchitectureConfig, label_names: list[str]
) -> tuple[tuple[int, int, int], str]:
    """((channels, height, width) of one model input, a sentence saying where it came from)."""
    folder = arch.path.parent
    if (folder / PROCESSOR_FILE).is_file():
        from tunepilot.model.base import ModelSource
        from tunepilot.model.processors import load_image_processor
        from tunepilot.tasks import make_encoder

        source = ModelSource(folder, str(folder), None, None, {}, "local")
        processor = load_image_processor(source, ws.campaign.model.trust_remote_code)
        prepared = ws.preview
        first = next(iter(prepared.splits.get("train", [])), None)
        if first is not None:
            encoder = make_encoder(ws.campaign, processor, label_names, ws.root)
            c, h, w = (int(x) for x in encoder.encode(first).pixel_values.shape)
            return (c, h, w), (
                f"images sized at {c} x {h} x {w}: the base's image processor "
                f"({type(processor).__name__}, {folder / PROCESSOR_FILE}) on training image "
                f"{first.text}"
            )
    size, channels = arch.config.get("image_size"), arch.config.get("num_channels", 3)
    if isinstance(size, int):
        size = (size, size)
    if not (isinstance(size, list | tuple) and len(size) == 2 and isinstance(channels, int)):
        raise input_error(
            f"{arch.path} image_size",
            "no image processor next to the config and no `image_size` in it, so the size "
            "of the pictures the model gets is unknown",
            f"save the base's image processor ({PROCESSOR_FILE}) next to config.json",
            title="no image size to size",
        )
    h, w = int(size[0]), int(size[1])
    return (channels, h, w), (
        f"images sized at {channels} x {h} x {w}: the config's image_size (no "
        f"{PROCESSOR_FILE} next to it to say what the processor makes)"
    )


def image_batch(image: tuple[int, int, int], batch: int, device: str) -> dict[str, Any]:
    """A microbatch of pictures (random on a real device) and their class ids."""
    import torch

    pixels = torch.randn((batch, *image), device=device)
    labels = torch.zeros(batch, dtype=torch.long, device=device)
    return {"inputs": {"pixel_values": pixels}, "labels": labels}
