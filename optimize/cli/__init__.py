"""The ``infopt`` command line: thin typer commands over the Python API."""

from infopt.core.cache import point_inductor_at_cache

point_inductor_at_cache()  # before the commands import torch._inductor, which makes its cache folder at import
