"""What samples: vector envs, the rollout worker, aggregation with mixin replay, and the thin Ray
actors around them. What they produce is `impala_trainer.batches`."""
