"""Signals the fleet sends when a slice changes state, so the market can follow without the fleet
importing it (scheduler must not depend on marketplace). Sent inside the transaction that made the change:
receivers write in the same transaction; side effects they announce go in transaction.on_commit.
"""
from django.dispatch import Signal

# kwargs: slice (scheduler.models.Slice, locked), at (datetime)
slice_ready = Signal()
# kwargs: slice, at, reason (str): creation failed or timed out; its capacity is free again
slice_failed = Signal()
# kwargs: slice, at: the instance is gone and its memory slices are free
slice_destroyed = Signal()
# kwargs: node_id, at: a node went offline (heartbeat timeout)
node_offline = Signal()
# kwargs: slice (locked): asked before a provider destroys a slice by hand. A receiver that holds the slice
# (the market, for a buyer's open lease) returns a sentence saying so; None lets it go. The fleet cannot
# know about leases itself, and must not destroy capacity a buyer is paying for behind the market's back.
slice_hold_check = Signal()
