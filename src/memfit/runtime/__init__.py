"""memfit.runtime."""
