"""One module per CLI verb; each defines one typer command function."""
