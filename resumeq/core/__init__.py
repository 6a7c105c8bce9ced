"""The pure rules and types: the spec and its limits, the models, the errors, the settings,
the gate, the splice, counting, continuations, the ledger's records and the liveness rules.
Nothing here speaks to Redis or HTTP or starts a thread (``make lint`` holds it to that)."""
