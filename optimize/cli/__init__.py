"""The ``infopt`` command line: thin typer commands over the Python API."""

from infopt.core.cache import point_inductor_at_cache
from infopt.core.memory import huge_pages_for_tensors

point_inductor_at_cache()  # before the commands import torch._inductor, which makes its cache folder at import
huge_pages_for_tensors()  # before torch's first large allocation, which reads it
