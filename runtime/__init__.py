"""Running models: the Runner call signature over every backend, and loading source models."""
