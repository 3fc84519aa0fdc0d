"""Rollout autoscaling: the queue-fill policy. Pure."""
