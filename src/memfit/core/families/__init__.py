"""memfit.core.families."""
