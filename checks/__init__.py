"""The gate catalog as data (gates.toml), installed as afddiag.checks."""
