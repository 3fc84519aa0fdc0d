"""The math of learning: V-trace, the IMPALA loss, the models, PopArt, the optimisers, and the
`Learner` that takes one update of one policy."""
