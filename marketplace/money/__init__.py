"""Money: the ledger writer (ledger.py), named movements (movements.py), reconciliation (check.py) and the
read side of statements and earnings (statements.py)."""
