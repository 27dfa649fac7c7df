"""This machine: hardware facts, the memory estimate, the load's pre-flight plan and doctor's advice."""
