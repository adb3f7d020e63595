"""memfit.estimate."""
