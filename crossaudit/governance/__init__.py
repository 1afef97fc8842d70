"""Governance: what decisions leave behind and how a policy changes safely.

Audit records, reviews and feedback (``records``), the decision log's server side (``evidence``),
retained inputs and their keys (``retention``, ``vault``), labels from production (``labels``),
replay of recorded decisions (``replay``; its report is ``crossaudit.api.replayreport``),
shadow and canary rollout (``rollout``).
"""
