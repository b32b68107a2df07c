"""RQ jobs that run and resume the harness, and the Redis store where runs are parked."""
