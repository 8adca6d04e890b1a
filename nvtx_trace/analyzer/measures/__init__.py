"""Figures several questions share, each module named after what it measures (step times, GPU idle, loader waits,
collectives, pageable copies, start-up, the instrumentation's cost). A figure only one question uses lives in
that question's module."""
