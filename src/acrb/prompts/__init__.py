"""Prompt sets: the I2I catalog and ACRB synthesis (base prompts x attributes)."""
