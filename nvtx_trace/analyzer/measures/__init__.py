"""Figures several questions share, each module named after what it measures (step times, GPU idle, loader waits,
collectives, pageable copies, start-up, the instrumentation's cost, steps found from the trace's rhythm)."""
