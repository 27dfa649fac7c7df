"""Batch jobs: reading requests, running them through the batch engine, writing results."""
