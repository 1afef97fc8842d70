"""Generated gRPC stubs (see protos/generate.py)."""
