"""Generated gRPC stubs (see tools/generate_protos.py)."""
