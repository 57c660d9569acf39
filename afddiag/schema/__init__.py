"""Published JSON Schemas."""
