"""Where learners run: the learner threads (numSgdIter, the minibatch buffer, the multi-GPU
towers), the separate process, the learner actors, and the `LearnerGroup` the driver talks to."""
