"""The image task: a model whose input is ``pixel_values`` (ViT, DeiT, BEiT, Swin, DINOv2, ConvNeXt,
ResNet, CLIP's vision tower...), ``float32[batch, num_channels, image_size, image_size]`` from its
config (3 and 224 where it has none). Output: ``logits`` with a head, else the pooled or last hidden
state. Raw data for ``--val`` and ``--calib``: image files (.png, .jpg, .jpeg, .bmp, .webp) through
the folder's image processor (resize, crop, normalize as the model was trained)."""

from __future__ import annotations

from pathlib import Path

from infopt.core.errors import UsageError, first_line
from infopt.core.inputspec import InputSpec
from infopt.runtime.tasks.base import Samples, Task
from infopt.runtime.tasks.media import processor, wrapper_class

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


def _spec(model, path, config) -> InputSpec:
    channels = int(config.get("num_channels") or 3)
    size = config.get("image_size") or 224
    side = int(size[0] if isinstance(size, (list, tuple)) else size)
    return InputSpec.parse([f"pixel_values:float32[batch,{channels},{side},{side}]"])


def read_images(files: list[Path], spec: InputSpec, folder: Path) -> Samples:
    from PIL import Image, UnidentifiedImageError

    proc = processor(folder, "image", "image processor")
    for path in files:
        try:
            with Image.open(path) as image:
                rgb = image.convert("RGB")
        except (OSError, UnidentifiedImageError) as exc:
            raise UsageError(f"cannot read image {path}: {first_line(exc)}", where=str(path),
                             fix="pass image files Pillow reads (PNG, JPEG, BMP, WebP)") from exc
        yield str(path), {"pixel_values": proc(images=rgb, return_tensors="np")["pixel_values"].astype("float32")}


IMAGE = Task("image", "top-1 with a head, else cosine",
             lambda m, p, c: getattr(m, "main_input_name", None) == "pixel_values", _spec,
             lambda model, path: wrapper_class()(model, str(path), "pixel_values"), IMAGE_SUFFIXES, read_images)
