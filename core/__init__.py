"""The bottom layer: the manifest and what every other package shares; it imports nothing else of ours."""
