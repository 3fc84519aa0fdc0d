"""What samples: vector envs, the rollout worker, typed batches, aggregation with mixin replay,
and the thin Ray actors around them."""
