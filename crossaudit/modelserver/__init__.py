"""Model servers for the builtins (Detoxify, Presidio, langdetect): trusted code that loads
operator-provided models in separate processes or containers, so torch and spaCy never load
into the orchestrator. One runtime module per builtin under ``builtins``. Imports only the kernel and
the generated protos."""
