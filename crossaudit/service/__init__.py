"""The gRPC service: servicers, auth, the one error map, server assembly (proto types stop here)."""
