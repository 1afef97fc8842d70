"""The kernel: the shared types every layer speaks, importing nothing else of CrossAudit.

errors (the typed error hierarchy), errcodec (their one gRPC codec), limits (every named limit),
results (verdicts and the wire checks), dsl (the policy DSL models, on the bases in dslbase),
builtins (the one registry of builtin evaluators, a config module per builtin), depspec (dependency-spec
parsing) and codecheck (the static entry-point check). The layering contract in
``pyproject.toml`` ([tool.importlinter]) keeps it at the bottom.
"""
