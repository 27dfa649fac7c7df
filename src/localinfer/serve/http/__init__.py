"""The HTTP layer: binding and serving, bounded connections, who may ask, the routes, sending an answer, /metrics."""
