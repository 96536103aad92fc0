"""The operator pages (htmx): models, nodes, operations. One module a concern."""
