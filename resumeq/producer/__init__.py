"""What producers and operators call: ``Client`` and ``AsyncClient``, the enqueue itself, and
the operations every face (the CLI, the HTTP service, the console) shares."""
