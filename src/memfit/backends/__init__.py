"""memfit.backends."""
