"""Labelled evals: how good each rule of a policy is on a hand-labelled dataset (docs/evals.md).

``dataset`` reads the rows, ``runner`` evaluates them through the real engine (or a server),
``metrics`` and ``sweep`` measure, ``report`` renders. The CLI is ``crossaudit eval``.
"""
