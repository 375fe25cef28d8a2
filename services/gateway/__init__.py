"""What every gateway shares: sender access, inbound submission, outbox delivery, typing, pacing, files.

A platform module (services/gateway/<platform>) supplies a `Channel` per configured instance; the
`Gateway` here runs them under one Runtime. The rule of durability lives here once: an inbound event
counts as handled only when the writer acked it, and outbox rows are delivered under a lease.
"""
