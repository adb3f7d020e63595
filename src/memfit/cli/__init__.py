"""memfit.cli."""
