"""Developer tools that are not part of the installed product (stub generation)."""
