"""Reconciliation: predictions against measurements (step 8 of the loop)."""
