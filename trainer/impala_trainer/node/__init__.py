"""This pod's Ray node (`ray start` as a watched child process) and the learner's allocator."""
