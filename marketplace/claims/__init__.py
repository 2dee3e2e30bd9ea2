"""Claims: the one way a slice or a window is taken (snapshot -> engine -> lock -> re-check -> retry).
holds.py says what holds capacity, snapshot.py builds and views pool snapshots, windows.py has the claims
that scheduler.services.allocation.allocate runs."""
