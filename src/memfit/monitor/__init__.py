"""memfit.monitor."""
