"""The protocols plugins implement. Each lives in core so a plugin depends on core alone."""
