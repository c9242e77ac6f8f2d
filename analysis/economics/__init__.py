"""Economics: cost per million successful tokens, the integer fleet, the migration ledger, the
sensitivity grid, the decision and what would settle it.
"""
