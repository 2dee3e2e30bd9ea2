"""Operations a team lead sets once and the beat carries out for the buyer (docs/operations.md): idle reclaim
(reclaim.py) and autoscaling (autoscale.py). They act as the buyer would, through products: an autoscaling rule
places ordinary orders (products.orders) and every end is the lifecycle's one end transition. What to do is
decided by pure functions on minute rollups and the time (decide.py); the services carry it out."""
