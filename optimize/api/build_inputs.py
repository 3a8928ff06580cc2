"""What a build measures on: validation batches (``--val``, raw files through the model's task,
held-out calibration samples, or random inputs) and the inputs latency is timed with."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from infopt.core.errors import UsageError
from infopt.core.sample_inputs import id_high, random_feed
from infopt.quantize.calib_data import load_calibration
from infopt.runtime.tasks.text import read_text
from infopt.validators.data import EXTENSIONS as SAMPLE_SUFFIXES
from infopt.validators.data import load_batches


def raw_reader(loaded, tokenizer: str | None):
    """How raw ``--val`` and ``--calib`` files (text, images, ``.wav``) become samples: through the
    task of a Hugging Face folder (its tokenizer, image processor or feature extractor; an explicit
    ``--tokenizer`` wins for text), else None."""
    task = loaded.task
    if task is None:
        return None

    def read(source, spec):
        files = task.raw_files(source)
        if files is None:
            folder = Path(source) if isinstance(source, (str, Path)) else None
            if folder is not None and folder.is_dir() and not any(p.suffix in SAMPLE_SUFFIXES for p in folder.iterdir()):
                raise UsageError(f"{folder} holds neither .npy/.npz/.pt samples nor the raw files this {task.name} model "
                                 f"reads ({', '.join(task.raw_suffixes)})", where=str(folder),
                                 fix=f"pass a folder of {', '.join(task.raw_suffixes)} files, or samples of its inputs "
                                     f"({', '.join(spec.names)}) saved with numpy.savez")
            return None
        if tokenizer is not None and all(f.suffix == ".txt" for f in files):
            return read_text(files, spec, tokenizer)
        return task.read_raw(files, spec, Path(loaded.source))

    return read


RANDOM_BATCHES = 4
"""random batches (at the dims' opt) drift is measured on without --val data, where each is quick to run"""
RANDOM_EAGER_S = 5.0
"""...and as many as the eager model runs in about this long, at least one, where each is not: BERT-large's
batch of 8 at sequence 128 took 3 s here, and every candidate runs each batch again"""


def random_batch_count(forward_s: float) -> int:
    """How many random validation batches: ``RANDOM_BATCHES``, fewer where one eager run (``forward_s``, at the
    dims' opt) is slow."""
    return max(1, min(RANDOM_BATCHES, int(RANDOM_EAGER_S / forward_s) if forward_s > 0 else RANDOM_BATCHES))


def validation_batches(spec, val, max_samples, module, calib=None, reader=None, random_batches: int = RANDOM_BATCHES):
    """The inputs drift is measured on: ``val`` (sample files, or raw files the model's task reads);
    else calibration samples held out of the draw (a model calibrated on real data is judged on real
    data, not noise); else ``random_batches`` random inputs."""

    if val is not None and reader is not None and reader(val, spec) is not None:
        return load_calibration(val, spec, samples=max_samples, reader=reader).batches, str(val)
    if val is not None:
        return load_batches(val, spec, max_samples), str(val)
    if calib is not None and calib.held_out:
        return calib.held_out, f"{calib.source} (held out of calibration)"
    high = id_high(module)
    return [random_feed(spec, seed=seed, int_high=high) for seed in range(random_batches)], "random"


def same_shapes(a: dict, b: dict) -> bool:
    """Whether two feeds have the same inputs at the same shapes (a runner that ran one is warm for the other)."""
    return a.keys() == b.keys() and all(np.shape(a[k]) == np.shape(b[k]) for k in a)


def same_feed(a: dict, b: dict) -> bool:
    """Whether two feeds hold the same inputs, value for value (a run on one gives the outputs of the other)."""
    return same_shapes(a, b) and all(np.array_equal(a[k], b[k]) for k in a)


def outputs_on(runner, batches: list[dict], known: tuple[dict, list] | None = None) -> list:
    """``runner``'s outputs on every batch; a batch holding the very inputs of ``known`` (a feed, and the outputs a
    run of this runner on it gave) takes those outputs rather than a second run (at BERT-large's batch 8 and
    sequence 128 one run takes 3.5-4 s on 2 cores)."""
    return [known[1] if known is not None and same_feed(batch, known[0]) else runner.run(batch) for batch in batches]


def latency_feeds(spec, recipe, module):
    batch = spec.batch_symbol
    sizes = recipe.validation.latency.batch_sizes
    high = id_high(module)
    if batch is None:
        return {0: random_feed(spec, int_high=high)}
    r = spec.dims[batch]
    sizes = sizes or sorted({r.min, r.opt})
    bad = [b for b in sizes if not r.min <= b <= r.max]
    if bad:
        raise UsageError(f"batch sizes {bad} are outside the batch range {r.min}..{r.max}",
                         fix=f"pass --batch-sizes within it, or widen it with --dim {batch}=MIN:OPT:MAX")
    return {b: random_feed(spec, int_high=high, **{batch: b}) for b in sizes}
