"""Delivery of what decisions send out: webhooks (``custom`` actions) and the decision log.

A decision's messages are :class:`~crossaudit.store.base.OutboxRecord` rows written in the same
transaction as its audit record (:mod:`.rows`), so a message exists exactly when its decision
does. :class:`~.worker.OutboxWorker` leases due rows and hands them to one handler per kind:
:class:`~.webhooks.WebhookSender` (signed, allowlisted, SSRF-checked HTTP calls) and the
decision-log sinks of :mod:`.decisionlog` (batched HTTP and JSONL files). Delivery is at least
once; every attempt is recorded on the row. ``docs/webhooks.md`` describes it for users.
"""
