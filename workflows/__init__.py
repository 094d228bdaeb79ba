"""Everything deterministic: the input law, legal claim moves, deadlines and attempts, the node state machine,
the slot history ring, and the workflows built on them.

No I/O and no clocks live here (time is always an argument), so the same code runs inside Temporal
workflows, in the watchers' report writer, and in plain unit tests; tests/test_hygiene.py enforces it.
"""
