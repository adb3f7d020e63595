"""memfit.integrations."""
