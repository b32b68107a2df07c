"""The worker process: its RQ worker, warm work horses and their slots."""
