"""The orchestrator: policy loading and validation, the engine, the evaluator adapters, and the
runtime that picks a runner for each evaluator. Knows nothing of gRPC or storage."""
