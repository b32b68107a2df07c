"""What the processes tell about themselves: logs, metrics, gauges, traces, health."""
