"""Generation 2 (releases 0.2.0a0 and before, with the `project-the-mark` and
`claim-continue-after-liveness-reads` patches): tests/histories/ `*.json` and `v2-*.json` replay here.
"""
