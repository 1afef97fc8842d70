"""Isolated runners for untrusted custom-evaluator code: the Docker and process backends, the
stdlib-only agent that runs inside them, and the protocol between them. Imports only the kernel."""
