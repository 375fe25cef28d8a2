"""The gateways: the kit every platform shares (this package's modules) and the platforms (its subpackages).

The kit owns the whole inbound path (parse, access, a chat's order, downloads, submit, then the
platform's ack: base.py, access.py, order.py, attachments.py), the whole outbound path (claim,
render, split, send, record: delivery.py, markup/) and streaming drafts (drafts.py). A platform
package (services/gateway/<platform>, run as `python -m services.gateway.<platform>`) supplies a
`Channel` per configured instance: its parser, its API calls, a renderer and its limits; the
`Gateway` of base.py runs them under one Runtime. The rule of durability lives here once: an inbound
event counts as handled only when the writer acked it, and outbox rows are delivered under a lease.
"""
