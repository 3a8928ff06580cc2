"""The bottom floor: errors, InputSpec, Target, Recipe, the pass registry, Artifact, Pipeline, the
manifest's files and the small helpers every other floor uses. Nothing here imports from above."""
