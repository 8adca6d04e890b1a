"""Several reports (one per rank) into one trace: which files, read in parallel, put on one clock, checked, merged."""
