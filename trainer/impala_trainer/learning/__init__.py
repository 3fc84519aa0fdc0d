"""What learns: V-trace, the IMPALA loss, the models, the learners and the learner threads."""
