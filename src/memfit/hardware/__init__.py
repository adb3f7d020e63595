"""What memfit knows of the hardware a job runs on: XLA's GPU target configs (issue 30)."""
