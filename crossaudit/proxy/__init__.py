"""The guard proxy: an OpenAI-compatible ``/v1/chat/completions`` endpoint that puts a CrossAudit
policy in front of a model (``crossaudit proxy --upstream URL``). The request is evaluated
(the policy's ``input`` rules) before it goes upstream, the answer (``output`` rules) before it
comes back; decisions are made and audited by a running CrossAudit server. docs/proxy.md.
"""
