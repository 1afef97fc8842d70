"""Peers measured in the same run as CrossAudit, each from PyPI into its own environment."""
